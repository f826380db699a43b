// Package hostile runs one table of hostile-peer cases against every te
// server: the tcp transport's data port, the p2p store's metadata port,
// the shm transport's socket and the RDMA transport's control port (in
// the Soft-RoCE guest: test/softroce/run.sh ./test/hostile; on any host on
// a simulated ConnectX, internal/mlx5sim). Each server
// speaks te's one handshake (internal/control) and admits connections
// under one policy (internal/acceptor.Gate), so each must pass every case:
// held connections lock nobody out, stalled frames are dropped within the
// handshake timeout, a peer without the secret, with another one,
// replaying a holder's handshake, skipping the challenge or speaking
// another protocol gets nothing, and the target logs each with the peer.
package hostile

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/shm"
	"github.com/rdmago/te/tcp"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// Bounds every server is started with: small, so the lockout case holds
// more connections than the server admits.
const (
	maxConns = 16
	timeout  = 2 * time.Second
)

// server is one running te server, seen from outside.
type server struct {
	spec *control.Spec
	// name and epoch are the target's, as a hello addresses it.
	name  string
	epoch uint64
	// dial opens a raw connection to the server's port.
	dial func(t *testing.T) (control.Conn, io.Closer)
	// use runs a real client with the secret s against the server: nil
	// once it got what it asked for (memory written, a descriptor).
	use func(t *testing.T, s *auth.Secret) error
	// protocolMsg is one of the carrier's own messages, sent where the
	// answer belongs.
	protocolMsg wire.Type
	log         *testenv.Buffer
}

// kind starts one kind of server with the secret s (nil: none).
type kind struct {
	name  string
	start func(t *testing.T, s *auth.Secret) *server
}

var kinds = []kind{
	{"tcp", startTCP},
	{"p2p", startP2P},
	{"shm", startSHM},
	{"rdma", startRDMA},
	{"rdma on mlx5sim", startRDMASim},
}

func logger(buf *testenv.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func streamDial(addr string, spec *control.Spec) func(t *testing.T) (control.Conn, io.Closer) {
	return func(t *testing.T) (control.Conn, io.Closer) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return control.Stream(c, c, spec.Frames()), c
	}
}

// write moves 4 KiB from ini to tgt's memory and checks it arrived.
func write(ctx context.Context, ini, tgt *enginetest.Node, name string) error {
	seg, err := ini.Engine.OpenSegment(ctx, name, nil)
	if err != nil {
		return err
	}
	rand.Read(ini.Mem.Bytes()[:4096])
	if err := ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes())}}); err != nil {
		return err
	}
	if !bytes.Equal(ini.Mem.Bytes()[:4096], tgt.Mem.Bytes()[:4096]) {
		return errors.New("the target's memory differs after a completed WRITE")
	}
	return nil
}

func startTCP(t *testing.T, s *auth.Secret) *server {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	buf := &testenv.Buffer{}
	tr := tcp.New(tcp.Config{Auth: s, IOTimeout: timeout, MaxConns: maxConns, MaxConnsPerSource: maxConns})
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st, Logger: logger(buf)}, 1<<16, tr)
	return &server{
		spec: &control.TCP, name: "target", epoch: tgt.Engine.Epoch(), log: buf, protocolMsg: 9,
		dial: streamDial(tr.Endpoint(), &control.TCP),
		use: func(t *testing.T, s *auth.Secret) error {
			ini := enginetest.NewNode(t, engine.Config{Name: fmt.Sprintf("initiator-%d", time.Now().UnixNano()), Store: st}, 1<<16,
				tcp.New(tcp.Config{Auth: s, IOTimeout: timeout}))
			return write(ctxT(t), ini, tgt, "target")
		},
	}
}

func startP2P(t *testing.T, s *auth.Secret) *server {
	buf := &testenv.Buffer{}
	st, err := p2p.New(ctxT(t), p2p.Options{Auth: s, Timeout: timeout, MaxConns: maxConns, MaxConnsPerSource: maxConns, Logger: logger(buf)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := &segment.Descriptor{Name: st.Name(), Epoch: 1, Version: 1}
	if err := st.Publish(ctxT(t), d); err != nil {
		t.Fatal(err)
	}
	return &server{
		spec: &control.P2P, name: st.Name(), log: buf, protocolMsg: 1, // get
		dial: streamDial(st.ListenAddr().String(), &control.P2P),
		use: func(t *testing.T, s *auth.Secret) error {
			cl, err := p2p.New(ctxT(t), p2p.Options{Auth: s, Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			got, err := cl.Get(ctxT(t), st.Name())
			if err == nil && got.Name != st.Name() {
				err = fmt.Errorf("got descriptor %q", got.Name)
			}
			return err
		},
	}
}

func startSHM(t *testing.T, s *auth.Secret) *server {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	buf := &testenv.Buffer{}
	tr := shm.New(shm.Config{Secret: s, IOTimeout: timeout, MaxConns: maxConns, MaxConnsPerSource: maxConns})
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st, Logger: logger(buf)}, 0, tr)
	mem, err := engine.AllocShared(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	tgt.Mem = mem // NewNode's cleanup closes it after the engine
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	return &server{
		spec: &control.SHM, name: "target", epoch: tgt.Engine.Epoch(), log: buf, protocolMsg: 7, // MAPREQ
		dial: func(t *testing.T) (control.Conn, io.Closer) {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: tr.Endpoint(), Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			c.SetDeadline(time.Now().Add(20 * time.Second))
			return control.Packet(c, control.SHM.Frames(), make([]byte, 1<<16)), c
		},
		use: func(t *testing.T, s *auth.Secret) error {
			ini := enginetest.NewNode(t, engine.Config{Name: fmt.Sprintf("initiator-%d", time.Now().UnixNano()), Store: st}, 0,
				shm.New(shm.Config{Secret: s, IOTimeout: timeout}))
			m, err := engine.AllocShared(1 << 16)
			if err != nil {
				t.Fatal(err)
			}
			ini.Mem = m
			if err := ini.Engine.RegisterLocalMemory(m.Bytes(), ""); err != nil {
				t.Fatal(err)
			}
			return write(ctxT(t), ini, tgt, "target")
		},
	}
}

func startRDMA(t *testing.T, s *auth.Secret) *server {
	topo := srenv.Require(t)
	return startRDMAOn(t, s, []string{topo.Lo.Name}, nil)
}

// startRDMASim is the RDMA transport's control port on a simulated
// ConnectX (internal/mlx5sim: the real verbs and mlx5 provider over a
// simulated kernel and HCA), on any host.
func startRDMASim(t *testing.T, s *auth.Secret) *server {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	d := f.AddDevice("mlx5_0")
	return startRDMAOn(t, s, []string{d.Name}, f.Options(mlx5.Provider()))
}

// startRDMAOn starts an RDMA target on devs, opened with opts (nil: the
// host's devices and providers); its initiators use the same.
func startRDMAOn(t *testing.T, s *auth.Secret, devs []string, opts *uverbs.Options) *server {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	buf := &testenv.Buffer{}
	tr := rdma.New(rdma.Config{Devices: devs, Options: opts, Auth: s, HandshakeTimeout: timeout, MaxSessions: maxConns, MaxSessionsPerSource: maxConns})
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st, Logger: logger(buf)}, 1<<16, tr)
	d := tgt.Engine.LocalDescriptor()
	pr, _ := d.Protocol(segment.ProtoRDMA)
	return &server{
		spec: &control.RDMA, name: "target", epoch: d.Epoch, log: buf, protocolMsg: 1, // connect
		dial: streamDial(pr.Endpoint, &control.RDMA),
		use: func(t *testing.T, s *auth.Secret) error {
			ini := enginetest.NewNode(t, engine.Config{Name: fmt.Sprintf("initiator-%d", time.Now().UnixNano()), Store: st}, 1<<16,
				rdma.New(rdma.Config{Devices: devs, Options: opts, Auth: s}))
			return write(ctxT(t), ini, tgt, "target")
		},
	}
}

// recorder keeps the frames a handshake sent.
type recorder struct {
	control.Conn
	sent []sentFrame
}

type sentFrame struct {
	t wire.Type
	p []byte
}

func (r *recorder) WriteFrame(t wire.Type, p []byte) error {
	r.sent = append(r.sent, sentFrame{t, bytes.Clone(p)})
	return r.Conn.WriteFrame(t, p)
}

// hello is a hello from mallory to the server.
func (sv *server) hello(s *auth.Secret) []byte {
	in := s.Initiate(sv.spec.Label, auth.Party{Name: "mallory", Epoch: 7}, auth.Party{Name: sv.name, Epoch: sv.epoch})
	return auth.AppendHello(nil, in.Hello())
}

// noService reads what the server sends until it closes the connection:
// never a verdict OK, and nothing but handshake frames (p2p may explain
// a refusal with its error frame). It fails when the server keeps the
// connection open.
func (sv *server) noService(t *testing.T, what string, c control.Conn) {
	t.Helper()
	for range 4 {
		h, p, err := c.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%s: the server kept the connection open", what)
			}
			return
		}
		switch {
		case h.Type == sv.spec.Verdict && bytes.Equal(p, []byte{0, 0}):
			t.Fatalf("%s: the server accepted (verdict OK)", what)
		case h.Type != sv.spec.Challenge && h.Type != sv.spec.Verdict && !(sv.spec == &control.P2P && h.Type == 4):
			t.Fatalf("%s: the server sent a %d frame", what, h.Type)
		}
	}
	t.Fatalf("%s: the server kept talking", what)
}

// logged waits until the server logged want with a peer.
func (sv *server) logged(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l := sv.log.String()
		if strings.Contains(l, want) && strings.Contains(l, "peer=") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not log %q with the peer:\n%s", want, l)
		}
	}
}

// hold opens n connections that stay silent, or (handshake) complete
// the handshake without a secret and then stay silent.
func (sv *server) hold(t *testing.T, n int, handshake bool) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, _ := sv.dial(t)
			if handshake {
				sv.spec.Dial(c, nil, auth.Party{Name: "mallory", Epoch: 7}, auth.Party{Name: sv.name, Epoch: sv.epoch})
			}
		})
	}
	wg.Wait()
}

var (
	secretA, _ = auth.New([]byte("the hostile suite's cluster secret"))
	secretB, _ = auth.New([]byte("another cluster secret, not the one"))
)

// cases: each runs against a fresh server of every kind.
var cases = []struct {
	name   string
	secret *auth.Secret // the server's
	run    func(t *testing.T, sv *server)
}{
	{"lockout by silent connections", nil, func(t *testing.T, sv *server) {
		sv.hold(t, 3*maxConns, false)
		if err := sv.use(t, nil); err != nil {
			t.Fatalf("a real client with %d silent connections held: %v", 3*maxConns, err)
		}
	}},
	{"lockout by handshaken connections", nil, func(t *testing.T, sv *server) {
		sv.hold(t, 3*maxConns, true)
		if err := sv.use(t, nil); err != nil {
			t.Fatalf("a real client with %d idle handshaken connections held: %v", 3*maxConns, err)
		}
	}},
	{"lockout with auth", secretA, func(t *testing.T, sv *server) {
		sv.hold(t, 3*maxConns, true) // each fails authentication and stays
		if err := sv.use(t, secretA); err != nil {
			t.Fatalf("a real client with %d connections held: %v", 3*maxConns, err)
		}
	}},
	{"stalled frame", nil, func(t *testing.T, sv *server) {
		c, raw := sv.dial(t)
		if sv.spec != &control.SHM {
			// A packet cannot stall half way: there the stall is
			// silence from the start.
			raw.(interface{ Write([]byte) (int, error) }).Write(sv.spec.Frames().Append(nil, sv.spec.Hello, 0, sv.hello(nil))[:7])
		}
		start := time.Now()
		sv.noService(t, "half a header, then silence", c)
		if d := time.Since(start); d > timeout+5*time.Second {
			t.Fatalf("a stalled frame held the connection %v (timeout %v)", d, timeout)
		}
		sv.logged(t, "peer timed out in the handshake")
	}},
	{"no secret", secretA, func(t *testing.T, sv *server) {
		if err := sv.use(t, nil); !errors.Is(err, auth.ErrDenied) || !strings.Contains(err.Error(), "--auth-file") {
			t.Fatalf("a client without the secret: %v; want auth.ErrDenied naming --auth-file", err)
		}
		sv.logged(t, "peer failed authentication")
	}},
	{"wrong secret", secretA, func(t *testing.T, sv *server) {
		if err := sv.use(t, secretB); !errors.Is(err, auth.ErrDenied) || !strings.Contains(err.Error(), "different cluster secret") {
			t.Fatalf("a client with another secret: %v; want auth.ErrDenied", err)
		}
		sv.logged(t, "peer failed authentication")
	}},
	{"replay", secretA, func(t *testing.T, sv *server) {
		c, _ := sv.dial(t)
		rec := &recorder{Conn: c}
		if err := sv.spec.Dial(rec, secretA, auth.Party{Name: "mallory", Epoch: 7}, auth.Party{Name: sv.name, Epoch: sv.epoch}); err != nil {
			t.Fatalf("a holder's handshake: %v", err)
		}
		c2, _ := sv.dial(t)
		for _, f := range rec.sent {
			c2.WriteFrame(f.t, f.p)
		}
		sv.noService(t, "a replayed handshake", c2)
		sv.logged(t, "peer failed authentication")
	}},
	{"skipped challenge", secretA, func(t *testing.T, sv *server) {
		c, _ := sv.dial(t)
		c.WriteFrame(sv.spec.Hello, sv.hello(nil))
		c.WriteFrame(sv.protocolMsg, make([]byte, 16))
		sv.noService(t, "a request where the answer belongs", c)
		sv.logged(t, "peer broke the handshake protocol")
	}},
	{"reset mid-handshake", secretA, func(t *testing.T, sv *server) {
		// Half a hello, then a reset (a close on a packet socket): the
		// peer left, nobody failed authentication.
		_, raw := sv.dial(t)
		if tc, ok := raw.(*net.TCPConn); ok {
			tc.Write(sv.spec.Frames().Append(nil, sv.spec.Hello, 0, sv.hello(nil))[:7])
			tc.SetLinger(0)
		}
		raw.Close()
		sv.logged(t, "peer closed the connection during the handshake")
		if l := sv.log.String(); strings.Contains(l, "authentication") || strings.Contains(l, "handshake failed") {
			t.Fatalf("a peer that left is logged as a failure:\n%s", l)
		}
	}},
	{"not te", nil, func(t *testing.T, sv *server) {
		c, raw := sv.dial(t)
		raw.(interface{ Write([]byte) (int, error) }).Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		start := time.Now()
		sv.noService(t, "an HTTP request", c)
		if d := time.Since(start); d >= timeout {
			t.Fatalf("an HTTP request was dropped after %v, not at once", d)
		}
		sv.logged(t, "peer does not speak te")
	}},
}

// TestHostilePeers runs every case against every server.
func TestHostilePeers(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					sv := k.start(t, c.secret)
					c.run(t, sv)
					// Whatever came before, a real client is still served.
					if err := sv.use(t, c.secret); err != nil {
						t.Fatalf("a real client after the case: %v", err)
					}
				})
			}
		})
	}
}
