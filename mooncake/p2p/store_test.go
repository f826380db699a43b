package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

func newStore(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// teDesc is what an engine with the Mooncake TCP transport publishes.
func teDesc(name string, dataPort int, bufs ...segment.Buffer) *segment.Descriptor {
	return &segment.Descriptor{
		Name: name, Epoch: 7, Version: 1,
		Protocols: []segment.Protocol{
			{Name: segment.ProtoTCP, Endpoint: "127.0.0.1:1"},
			{Name: mooncake.TEProtoTCP, Endpoint: "127.0.0.1:" + strconv.Itoa(dataPort), TCP: &segment.TCP{Wire: 2}},
		},
		Buffers: bufs,
	}
}

// rawExchange sends raw bytes and returns everything the server sent
// before closing.
func rawExchange(t *testing.T, addr string, req []byte, halfClose bool) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		c.(*net.TCPConn).CloseWrite()
	}
	out, _ := io.ReadAll(c)
	return out
}

// TestServeMooncakeRequests plays a Mooncake initiator: each message type
// gets the reply a Mooncake TCP target gives (reference: "Captured from a
// running Mooncake"), and what Mooncake closes unanswered is closed
// unanswered.
func TestServeMooncakeRequests(t *testing.T) {
	s := newStore(t, Options{Timeout: 500 * time.Millisecond})
	addr := s.Name()
	buf := segment.Buffer{Addr: 140679323844608, Length: 100663296}
	if err := s.Publish(context.Background(), teDesc(addr, 15934, buf)); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"{}", "[]", "null", "{} junk", `{"name":"init","protocol":"tcp"}` + "\n"} {
		out := rawExchange(t, addr, AppendMessage(nil, Metadata, []byte(body)), false)
		typ, reply, err := ReadMessage(bytes.NewReader(out), DefaultMaxMessage)
		if err != nil || typ != Metadata {
			t.Fatalf("Metadata %q: %v %v % x", body, typ, err, out)
		}
		if !bytes.HasSuffix(reply, []byte("}\n")) || bytes.Count(reply, []byte("\n")) != 1 {
			t.Fatalf("reply %q: want compact JSON and one newline", reply)
		}
		md, err := mooncake.Decode(reply)
		if err != nil {
			t.Fatal(err)
		}
		if md.Name != addr || !md.Has("tcp") || md.ProtocolArray || md.TCPDataPort != 15934 || md.TCPProtoVersion != 2 ||
			len(md.Buffers) != 1 || md.Buffers[0].Addr != buf.Addr || md.Buffers[0].Name != addr || md.Timestamp == "" {
			t.Fatalf("descriptor %+v", md)
		}
		// Exactly Mooncake's TCP keys, sorted.
		if !strings.HasPrefix(string(reply), `{"buffers":[{"addr":140679323844608,"length":100663296,"name":"`+addr+`"}],"name":"`+addr+`","protocol":"tcp","tcp_data_port":15934,"tcp_proto_version":2,"timestamp":"`) {
			t.Fatalf("reply %s", reply)
		}
	}
	// A half-close right after the request still gets the reply.
	if out := rawExchange(t, addr, AppendMessage(nil, Metadata, []byte("{}")), true); len(out) < 9 || out[8] != byte(Metadata) {
		t.Fatalf("after half-close: % x", out)
	}
	probe := rawExchange(t, addr, AppendMessage(nil, Probe, []byte("null")), false)
	if want := AppendMessage(nil, Probe, []byte(`{"status":"success"}`+"\n")); !bytes.Equal(probe, want) {
		t.Fatalf("probe reply % x", probe)
	}
	notify := rawExchange(t, addr, AppendMessage(nil, Notify, []byte(`{"name":"x","notify_msg":"hi"}`)), false)
	if want := AppendMessage(nil, Notify, []byte(`{"name":"","notify_msg":""}`+"\n")); !bytes.Equal(notify, want) {
		t.Fatalf("notify reply %q", notify)
	}
	conn := rawExchange(t, addr, AppendMessage(nil, Connection, []byte(`{"local_nic_path":"a@mlx5_0"}`)), false)
	typ, body, err := ReadMessage(bytes.NewReader(conn), DefaultMaxMessage)
	if err != nil || typ != Connection || !strings.Contains(string(body), `"qp_num":[]`) || !strings.Contains(string(body), `"reply_msg":"te: no Mooncake RDMA transport serves this segment`) ||
		!strings.Contains(string(body), `"peer_nic_path":"a@mlx5_0"`) {
		t.Fatalf("connection reply %v %q %v", typ, body, err)
	}
	// A record Mooncake would not write (a QP number past 24 bits) is
	// closed unanswered.
	if out := rawExchange(t, addr, AppendMessage(nil, Connection, []byte(`{"qp_num":[16777216]}`)), false); len(out) != 0 {
		t.Fatalf("malformed connection record answered: %q", out)
	}
	untyped := rawExchange(t, addr, AppendMessage(nil, Untyped, []byte(`{"local_nic_path":"a@mlx5_0"}`)), false)
	if n := binary.LittleEndian.Uint64(untyped); len(untyped) < 9 || untyped[8] != '{' || n != uint64(len(untyped)-8) {
		t.Fatalf("untyped reply % x", untyped)
	}
	// Closed with no reply.
	for name, req := range map[string][]byte{
		"empty body":        {1, 0, 0, 0, 0, 0, 0, 0, 1},
		"not JSON":          AppendMessage(nil, Metadata, []byte("hello")),
		"length 0":          make([]byte, 8),
		"above 1 MiB":       {1, 0, 0x10, 0, 0, 0, 0, 0, 1},
		"big-endian length": {0, 0, 0, 0, 0, 0, 0, 3, 1, '{', '}'},
		"truncated body":    {9, 0, 0, 0, 0, 0, 0, 0, 1, '{'},
		"unknown type":      AppendMessage(nil, 3, nil)[:8],
	} {
		start := time.Now()
		if out := rawExchange(t, addr, req, false); len(out) != 0 {
			t.Errorf("%s: answered % x", name, out)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s: took %v to close", name, d)
		}
	}
	// Unpublished: Metadata is closed unanswered, Probe still answered.
	if err := s.Unpublish(context.Background(), addr); err != nil {
		t.Fatal(err)
	}
	if out := rawExchange(t, addr, AppendMessage(nil, Metadata, []byte("{}")), false); len(out) != 0 {
		t.Fatalf("unpublished: % x", out)
	}
	if err := ProbePeer(context.Background(), addr, time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestTeToTe: one Store fetches another's descriptor over the Mooncake
// handshake and gets te's view of it; versions change only with content.
func TestTeToTe(t *testing.T) {
	target := newStore(t, Options{})
	init := newStore(t, Options{})
	ctx := context.Background()
	b1 := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	if err := target.Publish(ctx, teDesc(target.Name(), 16001, b1)); err != nil {
		t.Fatal(err)
	}
	d, err := init.Get(ctx, target.Name())
	if err != nil {
		t.Fatal(err)
	}
	p, ok := d.Protocol(mooncake.TEProtoTCP)
	if d.Name != target.Name() || !ok || p.Endpoint != "127.0.0.1:16001" || p.TCP == nil || p.TCP.Wire != 2 ||
		len(d.Buffers) != 1 || d.Buffers[0].Addr != b1.Addr || d.Buffers[0].Length != b1.Length || d.Version != 1 || d.Epoch == 0 {
		t.Fatalf("%+v", d)
	}
	again, err := init.Get(ctx, target.Name())
	if err != nil || again.Version != 1 || again.Epoch != d.Epoch {
		t.Fatalf("refetch %+v %v", again, err)
	}
	b2 := segment.Buffer{Addr: 1 << 41, Length: 4096}
	if err := target.Publish(ctx, teDesc(target.Name(), 16001, b1, b2)); err != nil {
		t.Fatal(err)
	}
	grown, err := init.Get(ctx, target.Name())
	if err != nil || grown.Version != 2 || grown.Epoch != d.Epoch || len(grown.Buffers) != 2 {
		t.Fatalf("after a new buffer %+v %v", grown, err)
	}
	list, err := init.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != target.Name() {
		t.Fatalf("list %v %v", list, err)
	}
	// Watch reports the current state, then the next change.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := init.Watch(wctx, target.Name())
	if err != nil {
		t.Fatal(err)
	}
	if w := <-ch; w == nil || w.Version != 2 {
		t.Fatalf("watch %+v", w)
	}
	target.Close()
	select {
	case w := <-ch:
		if w != nil {
			t.Fatalf("after the target closed: %+v", w)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("watch never reported the target gone")
	}
	// Publishing under another name, or without the Mooncake transport, is refused.
	if err := init.Publish(ctx, teDesc("10.9.9.9:1", 1, b1)); !errors.Is(err, segment.ErrInvalid) {
		t.Fatal(err)
	}
	// Without the Mooncake transport the descriptor is kept, not served.
	plain := &segment.Descriptor{Name: init.Name(), Protocols: []segment.Protocol{{Name: "tcp", Endpoint: "127.0.0.1:1"}}}
	if err := init.Publish(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if d, err := init.Get(ctx, init.Name()); err != nil || len(d.Protocols) != 1 {
		t.Fatalf("local get %+v %v", d, err)
	}
	if out := rawExchange(t, init.Name(), AppendMessage(nil, Metadata, []byte("{}")), false); len(out) != 0 {
		t.Fatalf("served a descriptor without a Mooncake protocol: %q", out)
	}
}

// fakeTarget answers every connection with reply (after reading one
// message), or holds it without answering when reply is nil.
func fakeTarget(t *testing.T, reply []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ReadMessage(c, DefaultMaxMessage)
			if reply != nil {
				c.Write(reply)
				c.Close()
				continue
			}
			defer c.Close()
		}
	}()
	return ln.Addr().String()
}

// TestFetchFromMooncake: te reads the captured reply of a Mooncake target,
// and fails cleanly, within its bound, on every bad reply a Mooncake
// initiator fails on.
func TestFetchFromMooncake(t *testing.T) {
	captured := []byte(`{"buffers":[{"addr":140679323844608,"length":100663296,"name":"127.0.0.1:15594"}],"name":"127.0.0.1:15594","protocol":"tcp","tcp_data_port":15934,"tcp_proto_version":2,"timestamp":"2026-12-02 00:54:14.585488"}` + "\n")
	s := newStore(t, Options{Timeout: 300 * time.Millisecond})
	addr := fakeTarget(t, AppendMessage(nil, Metadata, captured))
	d, err := s.Get(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Protocol(mooncake.TEProtoTCP); d.Name != addr || p.Endpoint != "127.0.0.1:15934" || d.Buffers[0].Addr != 140679323844608 {
		t.Fatalf("%+v", d)
	}
	for name, reply := range map[string][]byte{
		"random bytes":   []byte("\x13\x37garbage"),
		"type 0":         AppendMessage(nil, Connection, captured),
		"not JSON":       AppendMessage(nil, Metadata, []byte("nope")),
		"{}":             AppendMessage(nil, Metadata, []byte("{}")),
		"null":           AppendMessage(nil, Metadata, []byte("null")),
		"above 1 MiB":    {1, 0, 0x10, 0, 0, 0, 0, 0, 1},
		"truncated":      AppendMessage(nil, Metadata, captured)[:40],
		"untyped":        AppendMessage(nil, Untyped, captured),
		"quoted port":    AppendMessage(nil, Metadata, bytes.Replace(captured, []byte("15934"), []byte(`"15934"`), 1)),
		"closed":         {},
		"no reply (nil)": nil,
	} {
		a := addr
		if name == "closed" {
			a = fakeTarget(t, []byte{})
		} else if reply == nil {
			a = fakeTarget(t, nil)
		} else {
			a = fakeTarget(t, reply)
		}
		start := time.Now()
		_, err := s.Get(context.Background(), a)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if !errors.Is(err, segment.ErrUnavailable) && !errors.Is(err, mooncake.ErrInvalid) {
			t.Errorf("%s: %v is neither unavailable nor invalid", name, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: took %v", name, d)
		}
	}
	// The caller's context bounds the wait too.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Fetch(ctx, fakeTarget(t, nil), nil, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
	if _, err := s.Get(context.Background(), "no-port"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatal(err)
	}
}

// TestAdmission: the socket admits under te's policy
// (internal/acceptor.Gate): at MaxConnsPerSource, connections that sent
// nothing make room for a new one, the longest-waiting first, so idle
// connections cannot lock out a Probe or a descriptor fetch.
func TestAdmission(t *testing.T) {
	s := newStore(t, Options{Timeout: 10 * time.Second, MaxConnsPerSource: 2})
	if err := s.Publish(context.Background(), teDesc(s.Name(), 1, segment.Buffer{Addr: 4096, Length: 4096})); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", s.Name())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
		// Admitted in this order (the gate evicts the longest-waiting).
		for deadline := time.Now().Add(5 * time.Second); s.gate.Len() < len(held) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	if n := s.gate.Len(); n != 2 {
		t.Fatalf("%d connections admitted, want 2", n)
	}
	start := time.Now()
	if err := ProbePeer(context.Background(), s.Name(), 5*time.Second); err != nil {
		t.Fatalf("a probe at the bound: %v", err)
	}
	// The first held connection made room: closed long before Timeout.
	held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := held[0].Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the longest-waiting connection: %d %v, want it closed", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("evicted after %v: that is the timeout, not admission", d)
	}
}

// TestExposedWarning: one warning for a non-loopback listener, none for
// loopback.
func TestExposedWarning(t *testing.T) {
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	newStore(t, Options{Logger: log}).Close()
	if logs.String() != "" {
		t.Fatalf("loopback warned: %s", logs.String())
	}
	s := newStore(t, Options{Listen: "0.0.0.0:0", Logger: log, PortMin: 15000, PortMax: 17000})
	if n := strings.Count(logs.String(), "no authentication"); n != 1 {
		t.Fatalf("%d warnings: %s", n, logs.String())
	}
	if p := s.ListenAddr().(*net.TCPAddr).Port; p < 15000 || p > 17000 {
		t.Fatalf("port %d outside 15000-17000", p)
	}
	for range 2 { // idempotent
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get(context.Background(), "127.0.0.1:1"); !errors.Is(err, segment.ErrClosed) {
		t.Fatal(err)
	}
}

func TestNilClose(t *testing.T) {
	var s *Store
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenURI(t *testing.T) {
	s, err := Open(context.Background(), "p2phandshake://")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := s.ListenAddr().(*net.TCPAddr)
	if !a.IP.IsLoopback() || a.Port < 15000 || a.Port > 17000 || s.Name() != a.String() {
		t.Fatalf("listening on %v as %s", a, s.Name())
	}
	s2, err := Open(context.Background(), "p2phandshake://127.0.0.1:0?ports=20000-20100&advertise=127.0.0.1&timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if p := s2.ListenAddr().(*net.TCPAddr).Port; p < 20000 || p > 20100 {
		t.Fatalf("port %d", p)
	}
	for _, bad := range []string{"p2p://", "p2phandshake://h/x", "p2phandshake://?ports=9-1", "p2phandshake://?timeout=-1s", "p2phandshake://?x=1"} {
		if s, err := Open(context.Background(), bad); err == nil {
			s.Close()
			t.Errorf("%q accepted", bad)
		}
	}
}
