package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast returns options that make Watch tests quick.
func fast() Options {
	return Options{PollInterval: 20 * time.Millisecond, Grace: 100 * time.Millisecond, Timeout: time.Second}
}

func newStore(t *testing.T, o Options) *Store {
	t.Helper()
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func desc(name string, epoch, version uint64) *segment.Descriptor {
	return &segment.Descriptor{
		Name: name, Epoch: epoch, Version: version,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: "127.0.0.1:1", TCP: &segment.TCP{Wire: 1}}},
		Buffers:   []segment.Buffer{{Addr: 0x7f0000000000, Length: 1 << 20, Location: "cpu:0"}},
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRoundTrip(t *testing.T) {
	ctx := ctxT(t)
	a, b := newStore(t, Options{}), newStore(t, Options{})
	want := desc(a.Name(), 7, 1)
	if err := a.Publish(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, a.Name())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("remote Get (-want +got):\n%s", diff)
	}
	// The owner answers from memory, with a copy.
	local, err := a.Get(ctx, a.Name())
	if err != nil {
		t.Fatal(err)
	}
	local.Buffers[0].Length = 1
	again, _ := a.Get(ctx, a.Name())
	if diff := cmp.Diff(want, again); diff != "" {
		t.Fatalf("local Get shares memory with the store (-want +got):\n%s", diff)
	}
	// Several segments behind one address.
	sub := desc(a.Name()+"/kv", 7, 1)
	if err := a.Publish(ctx, sub); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Get(ctx, sub.Name); err != nil || got.Name != sub.Name {
		t.Fatalf("Get(%s) = %v, %v", sub.Name, got, err)
	}
}

func TestPublishChecks(t *testing.T) {
	ctx := ctxT(t)
	a := newStore(t, Options{})
	for _, name := range []string{"127.0.0.1:1", "x", a.Name() + "x", a.Name() + "kv"} {
		if err := a.Publish(ctx, desc(name, 1, 1)); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("Publish(%q) = %v, want ErrInvalid", name, err)
		}
	}
	bad := desc(a.Name(), 1, 1)
	bad.Buffers[0].Length = 0
	if err := a.Publish(ctx, bad); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("Publish(empty buffer) = %v, want ErrInvalid", err)
	}
	if err := a.Unpublish(ctx, a.Name()); !errors.Is(err, segment.ErrNotFound) {
		t.Errorf("Unpublish(never published) = %v, want ErrNotFound", err)
	}
}

func TestNotFoundAndUnavailable(t *testing.T) {
	ctx := ctxT(t)
	a, b := newStore(t, Options{}), newStore(t, Options{})
	if _, err := b.Get(ctx, a.Name()); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("Get(nothing published) = %v, want ErrNotFound", err)
	}
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, a.Name()); err != nil {
		t.Fatal(err)
	}
	if err := a.Unpublish(ctx, a.Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, a.Name()); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("Get(unpublished) = %v, want ErrNotFound", err)
	}
	for _, name := range []string{"", "nohost", "host:notaport", "host:0", ":80", string(make([]byte, 2000))} {
		if _, err := b.Get(ctx, name); !errors.Is(err, segment.ErrNotFound) {
			t.Errorf("Get(%.20q) = %v, want ErrNotFound", name, err)
		}
	}
	// A port nobody listens on.
	dead := closedPort(t)
	_, err := b.Get(ctx, dead)
	if !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Get(dead peer) = %v, want ErrUnavailable", err)
	}
	t.Logf("dead peer: %v", err)
}

// closedPort returns a loopback address that refuses connections.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestGetHonoursContext(t *testing.T) {
	// A peer that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var held []net.Conn
	var mu sync.Mutex
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	})
	defer func() {
		ln.Close()
		wg.Wait()
		for _, c := range held {
			c.Close()
		}
	}()
	b := newStore(t, Options{Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.Get(ctx, ln.Addr().String())
	if !errors.Is(err, segment.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get(silent peer) = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Get took %v despite a 100ms deadline", d)
	}
	// Cancellation (no deadline) also unblocks it.
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel2)
	if _, err := b.Get(ctx2, ln.Addr().String()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get(cancelled) = %v, want Canceled", err)
	}
}

func TestVersionBumpSeenByGetAndWatch(t *testing.T) {
	ctx := ctxT(t)
	a, b := newStore(t, fast()), newStore(t, fast())
	if err := a.Publish(ctx, desc(a.Name(), 9, 1)); err != nil {
		t.Fatal(err)
	}
	ch, err := b.Watch(ctx, a.Name())
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 9, 1)
	if err := a.Publish(ctx, desc(a.Name(), 9, 2)); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 9, 2)
	// Get sees the new version too, over the reused connection.
	if d, err := b.Get(ctx, a.Name()); err != nil || d.Version != 2 {
		t.Fatalf("Get after bump = %v, %v", d, err)
	}
	// The same descriptor again is not reported.
	if err := a.Publish(ctx, desc(a.Name(), 9, 2)); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ch:
		t.Fatalf("unchanged descriptor reported again: %+v", d)
	case <-time.After(100 * time.Millisecond):
	}
	// Unpublishing is reported at once as nil.
	if err := a.Unpublish(ctx, a.Name()); err != nil {
		t.Fatal(err)
	}
	expectNil(t, ch, time.Second)
}

func TestWatchLocal(t *testing.T) {
	ctx := ctxT(t)
	a := newStore(t, Options{PollInterval: time.Hour})
	ch, err := a.Watch(ctx, a.Name())
	if err != nil {
		t.Fatal(err)
	}
	expectNil(t, ch, time.Second) // not published yet
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 1, 1) // seen without waiting for the (hour-long) poll
}

func expect(t *testing.T, ch <-chan *segment.Descriptor, epoch, version uint64) {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		if d == nil || d.Epoch != epoch || d.Version != version {
			t.Fatalf("watch reported %+v, want epoch %d version %d", d, epoch, version)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("watch reported nothing, want epoch %d version %d", epoch, version)
	}
}

func expectNil(t *testing.T, ch <-chan *segment.Descriptor, within time.Duration) {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		if d != nil {
			t.Fatalf("watch reported %+v, want nil (gone)", d)
		}
	case <-time.After(within):
		t.Fatalf("watch did not report the segment gone within %v", within)
	}
}

func TestPeerGone(t *testing.T) {
	ctx := ctxT(t)
	o := fast()
	o.Grace = 300 * time.Millisecond
	b := newStore(t, o)
	a, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	name := a.Name()
	if err := a.Publish(ctx, desc(name, 1, 1)); err != nil {
		t.Fatal(err)
	}
	ch, err := b.Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 1, 1)
	a.Close()
	start := time.Now()
	expectNil(t, ch, 5*time.Second)
	if d := time.Since(start); d < o.Grace/2 {
		t.Fatalf("gone reported after %v, before the %v grace", d, o.Grace)
	}
	if _, err := b.Get(ctx, name); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Get(closed peer) = %v, want ErrUnavailable", err)
	}
}

func TestPeerRestart(t *testing.T) {
	ctx := ctxT(t)
	o := fast()
	o.Grace = time.Hour // a restart within the grace is seen as a new epoch, never as gone
	b := newStore(t, o)
	a, err := New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	name := a.Name()
	if err := a.Publish(ctx, desc(name, 1, 5)); err != nil {
		t.Fatal(err)
	}
	ch, err := b.Watch(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 1, 5)
	if _, err := b.Get(ctx, name); err != nil { // leaves a pooled connection behind
		t.Fatal(err)
	}
	a.Close()
	o2 := o
	o2.Listen = name
	var a2 *Store
	for i := 0; ; i++ { // the port may take a moment to free up
		if a2, err = New(ctx, o2); err == nil {
			break
		}
		if i > 50 {
			t.Fatalf("restart on %s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer a2.Close()
	if err := a2.Publish(ctx, desc(name, 2, 1)); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 2, 1)
	// The pooled connection died with the old process; Get redials.
	if d, err := b.Get(ctx, name); err != nil || d.Epoch != 2 {
		t.Fatalf("Get after restart = %+v, %v", d, err)
	}
}

// TestMalformedFrames: with and without a cluster secret, frames that
// break the protocol get an error frame and a hang-up, and nothing else.
func TestMalformedFrames(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("auth=", on), func(t *testing.T) {
			var s *auth.Secret
			if on {
				s = testSecret(t)
			}
			testMalformedFrames(t, s)
		})
	}
}

func testMalformedFrames(t *testing.T, secret *auth.Secret) {
	ctx := ctxT(t)
	a := newStore(t, Options{Auth: secret})
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	hdr := func(m string, ver, typ byte, n uint32) []byte {
		b := append([]byte(m), ver, typ, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
		return b
	}
	cases := map[string][]byte{
		"bad magic":           hdr("XXXX", handshake.Version, 1, 4),
		"wire version":        hdr("TEMD", 9, 1, 4),
		"old wire version":    hdr("TEMD", 1, 1, 4),
		"unknown type":        hdr("TEMD", handshake.Version, 99, 0),
		"huge name":           hdr("TEMD", handshake.Version, byte(frameGet), 1<<31),
		"descriptor request":  hdr("TEMD", handshake.Version, byte(frameDescriptor), 100),
		"response as request": append(hdr("TEMD", handshake.Version, byte(frameNotFound), 1), 'x'),
		"get before hello":    append(hdr("TEMD", handshake.Version, byte(frameGet), 1), 'x'),
		"huge hello":          hdr("TEMD", handshake.Version, byte(frameHello), 1<<20),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", a.ListenAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(raw); err != nil {
				t.Fatal(err)
			}
			var h [headerLen]byte
			typ, msg, err := readFrame(c, h[:], 0)
			if err != nil || typ != frameError {
				t.Fatalf("answer = %v %q %v, want an error frame", typ, msg, err)
			}
			t.Logf("server said: %s", msg)
			// Then the server hangs up.
			if n, err := c.Read(h[:]); err != io.EOF {
				t.Fatalf("after the error frame: read %d, %v; want EOF", n, err)
			}
		})
	}
	// Truncated frames and immediate hang-ups.
	for _, raw := range [][]byte{nil, []byte("TE"), append(hdr("TEMD", handshake.Version, byte(frameHello), 10), 'a')} {
		c, err := net.Dial("tcp", a.ListenAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(raw)
		c.Close()
	}
	// The listener still serves well-formed requests.
	b := newStore(t, Options{Auth: secret})
	if _, err := b.Get(ctx, a.Name()); err != nil {
		t.Fatalf("Get after malformed traffic: %v", err)
	}
}

// A peer that answers with garbage gets ErrUnavailable, not a crash.
func TestMalformedResponses(t *testing.T) {
	ctx := ctxT(t)
	answers := map[string][]byte{
		"garbage":            []byte("HTTP/1.1 400 Bad Request\r\n\r\n"),
		"bad descriptor":     appendFrame(nil, frameDescriptor, []byte(`{"schema":2,"segment":{"name":""}}`)),
		"request as answer":  appendFrame(nil, frameGet, []byte("x")),
		"truncated payload":  appendFrame(nil, frameDescriptor, []byte("{"))[:headerLen],
		"oversize":           hdrOnly(frameDescriptor, segment.MaxEncodedSize+1),
		"wrong segment name": appendFrame(nil, frameDescriptor, mustMarshal(t, desc("127.0.0.1:1", 1, 1))),
	}
	b := newStore(t, Options{})
	for name, answer := range answers {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				if _, err := handshake.Accept(control.Stream(c, c, &requests), nil, auth.Party{Name: ln.Addr().String(), Epoch: 1}, nil); err != nil {
					return
				}
				var h [headerLen]byte
				readFrame(c, h[:], 0)
				c.Write(answer)
			}()
			_, err = b.Get(ctx, ln.Addr().String())
			<-done
			if !errors.Is(err, segment.ErrUnavailable) && !errors.Is(err, segment.ErrInvalid) {
				t.Fatalf("Get = %v, want ErrUnavailable or ErrInvalid", err)
			}
			t.Logf("%v", err)
		})
	}
}

func hdrOnly(t frameType, n int) []byte {
	b := appendFrame(nil, t, nil)
	b[8], b[9], b[10], b[11] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return b
}

func mustMarshal(t *testing.T, d *segment.Descriptor) []byte {
	b, err := segment.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConcurrent(t *testing.T) {
	ctx := ctxT(t)
	owners := make([]*Store, 3)
	for i := range owners {
		owners[i] = newStore(t, fast())
		if err := owners[i].Publish(ctx, desc(owners[i].Name(), uint64(i+1), 1)); err != nil {
			t.Fatal(err)
		}
	}
	b := newStore(t, fast())
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				o := owners[(g+i)%len(owners)]
				d, err := b.Get(ctx, o.Name())
				if err != nil {
					errs <- err
					return
				}
				if d.Name != o.Name() {
					errs <- fmt.Errorf("asked %s, got %s", o.Name(), d.Name)
					return
				}
			}
		})
	}
	for i, o := range owners {
		wg.Go(func() {
			for v := uint64(2); v < 50; v++ {
				if err := o.Publish(ctx, desc(o.Name(), uint64(i+1), v)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			if _, err := b.List(ctx); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	l, err := b.List(ctx)
	if err != nil || len(l) != len(owners) {
		t.Fatalf("List = %d descriptors, %v; want %d", len(l), err, len(owners))
	}
}

func TestList(t *testing.T) {
	ctx := ctxT(t)
	a := newStore(t, Options{})
	const ttl = time.Second
	b := newStore(t, Options{CacheTTL: ttl})
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, desc(b.Name(), 2, 1)); err != nil {
		t.Fatal(err)
	}
	fetched := time.Now()
	if _, err := b.Get(ctx, a.Name()); err != nil {
		t.Fatal(err)
	}
	l, err := b.List(ctx)
	// A loaded machine may pause past the TTL before List: only a List
	// surely within it must include the fetched descriptor.
	if err != nil || (len(l) != 2 && time.Since(fetched) < ttl) {
		t.Fatalf("List = %v, %v; want own and fetched", l, err)
	}
	time.Sleep(ttl + 100*time.Millisecond)
	l, err = b.List(ctx)
	if err != nil || len(l) != 1 || l[0].Name != b.Name() {
		t.Fatalf("List after TTL = %v, %v; want only its own", l, err)
	}
}

func TestClose(t *testing.T) {
	ctx := ctxT(t)
	a, err := New(ctx, fast())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	ch, err := a.Watch(ctx, a.Name())
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ch, 1, 1)
	// An idle client connection held open must not block Close.
	c, err := net.Dial("tcp", a.ListenAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("watch channel still open after Close")
	}
	if err := a.Publish(ctx, desc(a.Name(), 1, 2)); !errors.Is(err, segment.ErrClosed) {
		t.Errorf("Publish after Close = %v", err)
	}
	if _, err := a.Get(ctx, a.Name()); !errors.Is(err, segment.ErrClosed) {
		t.Errorf("Get after Close = %v", err)
	}
	if _, err := a.List(ctx); !errors.Is(err, segment.ErrClosed) {
		t.Errorf("List after Close = %v", err)
	}
	if _, err := a.Watch(ctx, a.Name()); !errors.Is(err, segment.ErrClosed) {
		t.Errorf("Watch after Close = %v", err)
	}
}

func TestOpenURI(t *testing.T) {
	ctx := ctxT(t)
	p, err := Open(ctx, "p2p://127.0.0.1:0?poll=10ms&grace=50ms")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.opts.PollInterval != 10*time.Millisecond || p.opts.Grace != 50*time.Millisecond {
		t.Fatalf("options = %+v", p.opts)
	}
	s2, err := Open(ctx, "p2p://")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if h, _, _ := net.SplitHostPort(s2.Name()); h != "127.0.0.1" {
		t.Fatalf("default name %s, want 127.0.0.1:port", s2.Name())
	}
	s3, err := Open(ctx, "p2p://127.0.0.1?ports=15000-17000")
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	_, port, _ := net.SplitHostPort(s3.Name())
	if n, _ := strconv.Atoi(port); n < 15000 || n > 17000 {
		t.Fatalf("port %d outside 15000-17000", n)
	}
	s4, err := Open(ctx, "p2p://0.0.0.0:0?advertise=192.0.2.7")
	if err != nil {
		t.Fatal(err)
	}
	defer s4.Close()
	if h, _, _ := net.SplitHostPort(s4.Name()); h != "192.0.2.7" {
		t.Fatalf("advertised name %s", s4.Name())
	}
	for _, bad := range []string{"p2p://127.0.0.1:0?bogus=1", "p2p://127.0.0.1:0?poll=fast", "p2p://127.0.0.1?ports=9-1", "p2p://127.0.0.1:0/path", "p2p://256.0.0.1:0"} {
		if s, err := Open(ctx, bad); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", bad)
		} else {
			t.Logf("Open(%q): %v", bad, err)
		}
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, typ := range []frameType{frameGet, frameDescriptor, frameNotFound, frameError} {
		b := appendFrame(nil, typ, []byte("payload"))
		var h [headerLen]byte
		got, p, err := readFrame(bytes.NewReader(b), h[:], 100)
		if err != nil || got != typ || string(p) != "payload" {
			t.Errorf("%v: got %v %q %v", typ, got, p, err)
		}
	}
}

// TestConnectionBounds: at MaxConns a new connection takes the slot of the
// one that has waited longest (idle, or silent in its handshake), so held
// connections cannot lock out descriptor fetches; idle ones are dropped
// after IdleTimeout; MaxConnsPerSource bounds one address the same way.
func TestConnectionBounds(t *testing.T) {
	ctx := ctxT(t)
	a := newStore(t, Options{MaxConns: 2, IdleTimeout: 2 * time.Second})
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", a.ListenAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	waitFor(t, func() bool { return a.gate.Len() == 2 })
	b := newStore(t, Options{})
	if _, err := b.Get(ctx, a.Name()); err != nil {
		t.Fatalf("Get with every slot held by idle connections: %v", err)
	}
	// The first idle connection was evicted for it.
	idle[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("evicted connection: read %v, want EOF", err)
	}
	// The other times out (IdleTimeout) and is closed by the server.
	idle[1].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := idle[1].Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF from the server", err)
	}
	if _, err := b.Get(ctx, a.Name()); err != nil {
		t.Fatalf("Get after idle connections were dropped: %v", err)
	}

	// Per source: a store allowing 3 connections per address.
	p := newStore(t, Options{MaxConns: 100, MaxConnsPerSource: 3})
	if err := p.Publish(ctx, desc(p.Name(), 1, 1)); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		c, err := net.Dial("tcp", p.ListenAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitFor(t, func() bool {
		return p.gate.Len() == 3 && p.gate.Count(netip.MustParseAddr("127.0.0.1")) == 3
	})
	if _, err := b.Get(ctx, p.Name()); err != nil {
		t.Fatalf("Get past the per-source limit: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// TestOpenFailureIsNil: a store that cannot listen comes back as a nil
// interface with the cause, so a caller's deferred Close cannot panic.
func TestOpenFailureIsNil(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err := Open(ctxT(t), "p2p://"+busy.Addr().String())
	if s != nil || err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Open on a busy port = %#v, %v; want a nil Store and the cause", s, err)
	}
}

// TestWatchSlowPeer: a peer that accepts but answers no poll in time (a
// busy host) is not reported gone after Grace, which would drop its live
// transfers, only after SlowGrace; once it refuses connections it is gone
// after Grace.
func TestWatchSlowPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn // accepted, never answered
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	name := ln.Addr().String()
	for _, tc := range []struct {
		slowGrace, quiet time.Duration
	}{
		{time.Hour, time.Second}, // many Graces of unanswered polls
		{400 * time.Millisecond, 300 * time.Millisecond},
	} {
		o := fast()
		o.Timeout = 30 * time.Millisecond
		o.SlowGrace = tc.slowGrace
		b := newStore(t, o)
		ctx, cancel := context.WithCancel(ctxT(t))
		ch, err := b.Watch(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		select {
		case d := <-ch:
			t.Fatalf("a peer answering late reported %+v after %v (Grace %v, SlowGrace %v)", d, time.Since(start), o.Grace, o.SlowGrace)
		case <-time.After(tc.quiet):
		}
		if tc.slowGrace < time.Hour {
			expectNil(t, ch, 5*time.Second)
			if d := time.Since(start); d < tc.slowGrace {
				t.Fatalf("gone reported after %v, before SlowGrace %v", d, tc.slowGrace)
			}
		}
		cancel()
	}
	// Refused from now on: gone after Grace.
	o := fast()
	o.Timeout, o.SlowGrace = 30*time.Millisecond, time.Hour
	b := newStore(t, o)
	ch, err := b.Watch(ctxT(t), name)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	mu.Lock()
	for _, c := range held {
		c.Close()
	}
	held = nil
	mu.Unlock()
	expectNil(t, ch, 5*time.Second)
}
