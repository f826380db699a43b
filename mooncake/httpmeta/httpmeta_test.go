package httpmeta

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/test/consul/consulagent"
)

func serve(t *testing.T, o ServerOptions) *Server {
	t.Helper()
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	s, err := Serve(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// call makes one raw request the way Mooncake's libcurl client does.
func call(t *testing.T, method, u string, body []byte) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// protocolCases checks the server's answers to Mooncake's requests over
// real HTTP, whatever the backend.
func protocolCases(t *testing.T, s *Server) {
	u := s.URL("")
	key := "mooncake/ram/127.0.0.1:15001"
	k := u + "?key=" + url.QueryEscape(key)
	for _, tc := range []struct {
		method, url string
		body        []byte
		code        int
		reply       string
	}{
		{"GET", k, nil, 404, "metadata not found"},
		{"PUT", k, []byte(`{"name":"x"}`), 200, "metadata updated"},
		{"GET", k, nil, 200, `{"name":"x"}`},
		{"PUT", k, []byte(`{"name":"y"}`), 200, "metadata updated"},
		{"GET", k, nil, 200, `{"name":"y"}`},
		{"DELETE", k, nil, 200, "metadata deleted"},
		{"GET", k, nil, 404, "metadata not found"},
		{"DELETE", k, nil, 200, "metadata deleted"},
		{"GET", u, nil, 400, "invalid request"},
		{"GET", u + "?key=" + strings.Repeat("k", MaxKey+1), nil, 400, "invalid request"},
		{"POST", k, nil, 405, "method not allowed"},
		{"PUT", k, make([]byte, MaxValue+1), 413, "larger than"},
		{"GET", strings.TrimSuffix(u, DefaultPath) + "/other?key=a", nil, 404, "the metadata endpoint is /metadata"},
	} {
		code, reply := call(t, tc.method, tc.url, tc.body)
		if code != tc.code || !strings.Contains(reply, tc.reply) {
			t.Errorf("%s %.80s: %d %.80q, want %d %q", tc.method, tc.url, code, reply, tc.code, tc.reply)
		}
	}
}

func TestServerMemory(t *testing.T) {
	protocolCases(t, serve(t, ServerOptions{}))
}

// TestServerConsul: the same protocol backed by a real Consul agent, and
// the keys land under the prefix, shared by two servers.
func TestServerConsul(t *testing.T) {
	a := consulagent.Start(t)
	b1, err := NewConsul(a.Addr(), "mc")
	if err != nil {
		t.Fatal(err)
	}
	s1 := serve(t, ServerOptions{Backend: b1})
	protocolCases(t, s1)
	b2, _ := NewConsul(a.Addr(), "mc")
	s2 := serve(t, ServerOptions{Backend: b2})
	if code, _ := call(t, "PUT", s1.URL("")+"?key=k1", []byte("v1")); code != 200 {
		t.Fatal(code)
	}
	if code, v := call(t, "GET", s2.URL("")+"?key=k1", nil); code != 200 || v != "v1" {
		t.Fatalf("second server: %d %q", code, v)
	}
	a.Stop()
	if code, _ := call(t, "GET", s2.URL("")+"?key=k1", nil); code != 503 {
		t.Fatalf("consul down: %d, want 503", code)
	}
}

func teDesc(name string, dataPort int, bufs ...segment.Buffer) *segment.Descriptor {
	return &segment.Descriptor{
		Name: name, Epoch: 9, Version: 1,
		Protocols: []segment.Protocol{{Name: mooncake.TEProtoTCP, Endpoint: "127.0.0.1:" + strconv.Itoa(dataPort), TCP: &segment.TCP{Wire: 2}}},
		Buffers:   bufs,
	}
}

// TestStoreRoundTrip: te publishes through a metadata server in Mooncake's
// key layout (with a cluster id) and another te reads it back.
func TestStoreRoundTrip(t *testing.T) {
	mem := &Memory{}
	srv := serve(t, ServerOptions{Backend: mem})
	ctx := context.Background()
	st, err := Open(ctx, srv.URL("")+"?cluster_id=c1")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	if err := st.Publish(ctx, teDesc("node-a", 16100, buf)); err != nil {
		t.Fatal(err)
	}
	raw, err := mem.Get(ctx, "mooncake/c1/ram/node-a")
	if err != nil {
		t.Fatal(err)
	}
	md, err := mooncake.Decode(raw)
	if err != nil || md.TCPDataPort != 16100 || md.Buffers[0].Name != "node-a" {
		t.Fatalf("%+v %v", md, err)
	}
	if meta, _ := mem.Get(ctx, "mooncake/c1/rpc_meta/node-a"); string(meta) != `{"ip_or_host_name":"127.0.0.1","rpc_port":0}` {
		t.Fatalf("rpc_meta %s", meta)
	}
	reader, err := New(ctx, Options{URL: srv.URL(""), ClusterID: "c1/"})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	d, err := reader.Get(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Protocol(mooncake.TEProtoTCP); p.Endpoint != "127.0.0.1:16100" || d.Buffers[0].Addr != buf.Addr || d.Version != 1 {
		t.Fatalf("%+v", d)
	}
	// Another cluster does not see it.
	other, _ := New(ctx, Options{URL: srv.URL("")})
	defer other.Close()
	if _, err := other.Get(ctx, "node-a"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatal(err)
	}
	// Close removes what was published.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Get(ctx, "node-a"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatal(err)
	}
}

// TestReadMooncakeSegment: a descriptor and rpc_meta as a Mooncake target
// writes them; data goes to the rpc_meta host.
func TestReadMooncakeSegment(t *testing.T) {
	srv := serve(t, ServerOptions{})
	ctx := context.Background()
	c, err := NewClient(srv.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	desc := `{"buffers":[{"addr":140547117285376,"length":1073741824,"name":"target_seg"}],"name":"target_seg","protocol":"tcp","tcp_data_port":15601,"tcp_proto_version":2,"timestamp":"2026-11-30 08:16:59.409522"}`
	if err := c.Put(ctx, "mooncake/ram/target_seg", []byte(desc)); err != nil {
		t.Fatal(err)
	}
	st, _ := New(ctx, Options{URL: srv.URL("")})
	defer st.Close()
	d, err := st.Get(ctx, "target_seg")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Protocol(mooncake.TEProtoTCP); p.Endpoint != "target_seg:15601" {
		t.Fatalf("without rpc_meta: %+v", p)
	}
	if err := c.Put(ctx, "mooncake/rpc_meta/target_seg", []byte(`{"ip_or_host_name":"192.0.2.2","rpc_port":12345}`)); err != nil {
		t.Fatal(err)
	}
	d, err = st.Get(ctx, "target_seg")
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := d.Protocol(mooncake.TEProtoTCP); p.Endpoint != "192.0.2.2:15601" || d.Buffers[0].Addr != 140547117285376 {
		t.Fatalf("with rpc_meta: %+v", d)
	}
	// Bad values are refused with clear errors.
	c.Put(ctx, "mooncake/rpc_meta/target_seg", []byte(`[]`))
	if _, err := st.Get(ctx, "target_seg"); !errors.Is(err, mooncake.ErrInvalid) || !strings.Contains(err.Error(), "rpc_meta") {
		t.Fatal(err)
	}
	c.Put(ctx, "mooncake/ram/target_seg", []byte(`{"name":"target_seg","protocol":"tcp","tcp_data_port":"1"}`))
	if _, err := st.Get(ctx, "target_seg"); !errors.Is(err, mooncake.ErrInvalid) {
		t.Fatal(err)
	}
	// A server that is gone is unavailable, not absent.
	srv.Close()
	if _, err := st.Get(ctx, "target_seg"); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatal(err)
	}
}

func TestBadURLs(t *testing.T) {
	for _, u := range []string{"ftp://h/p", "http://", "http://h:1/p?x=1", "::"} {
		if _, err := NewClient(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if _, err := Open(context.Background(), "http://127.0.0.1:1/m?bogus=1"); err == nil || !strings.Contains(err.Error(), "cluster_id") {
		t.Fatal(err)
	}
}

// TestServerBounds: connections beyond MaxConns are closed on accept; a
// non-loopback listener warns once.
func TestServerBounds(t *testing.T) {
	var logs testenv.Buffer
	s := serve(t, ServerOptions{Listen: "0.0.0.0:0", MaxConns: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if n := strings.Count(logs.String(), "no authentication"); n != 1 {
		t.Fatalf("%d warnings: %s", n, logs.String())
	}
	addr := "127.0.0.1:" + strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	get := func() (string, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET /metadata?key=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		b, err := io.ReadAll(c)
		return string(b), err
	}
	// The held connection may not be accepted yet: wait until a request is refused.
	deadline := time.Now().Add(5 * time.Second)
	for {
		reply, err := get()
		if err == nil && reply == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second connection was served: %q %v", reply, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	held.Close()
	for {
		reply, err := get()
		if err == nil && strings.HasPrefix(reply, "HTTP/1.1 404") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served after the slot was freed: %q %v", reply, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNilClose(t *testing.T) {
	var s *Store
	var srv *Server
	if s.Close() != nil || srv.Close() != nil {
		t.Fatal("nil Close failed")
	}
}

// TestReadMooncakeRDMASegment: an RDMA descriptor and rpc_meta as a
// Mooncake RDMA target writes them through HTTP metadata: te's entry is
// mooncake-rdma, its endpoint the handshake socket from rpc_meta, its NIC
// paths' server the segment's name, one key per device.
func TestReadMooncakeRDMASegment(t *testing.T) {
	srv := serve(t, ServerOptions{})
	ctx := context.Background()
	c, err := NewClient(srv.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	desc := `{"buffers":[{"addr":140547117285376,"length":1073741824,"lkey":[11,12],"name":"cpu:0","rkey":[21,22]}],"devices":[{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:02","lid":0,"name":"mlx5_0"},{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:02","lid":0,"name":"mlx5_1"}],"name":"mc_target","priority_matrix":{"cpu:0":[["mlx5_0","mlx5_1"],[]]},"protocol":"rdma","tcp_data_port":0,"timestamp":"2026-12-02 00:54:14.585488"}`
	if err := c.Put(ctx, "mooncake/ram/mc_target", []byte(desc)); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "mooncake/rpc_meta/mc_target", []byte(`{"ip_or_host_name":"192.0.2.2","rpc_port":15123}`)); err != nil {
		t.Fatal(err)
	}
	st, _ := New(ctx, Options{URL: srv.URL("")})
	defer st.Close()
	d, err := st.Get(ctx, "mc_target")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := d.Protocol(mooncake.TEProtoRDMA)
	if !ok || p.Endpoint != "192.0.2.2:15123" || mooncake.NICServer(p, d.Name) != "mc_target" || p.RDMA == nil ||
		len(p.RDMA.Devices) != 2 || p.RDMA.Devices[1].Name != "mlx5_1" || p.RDMA.Devices[1].GID != "::ffff:10.0.2.2" ||
		len(p.RDMA.Keys(0)) != 2 || p.RDMA.Keys(0)[1] != 22 {
		t.Fatalf("te entry %+v (rdma %+v)", p, p.RDMA)
	}
	if _, ok := d.Protocol(mooncake.TEProtoTCP); ok {
		t.Fatalf("an RDMA segment with no tcp_data_port offers tcp: %+v", d.Protocols)
	}
}
