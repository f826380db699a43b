package rdma_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// The control protocol as a hostile client speaks it (the frame layout is
// internal/wire's; the types are the transport's).
var ctl = wire.Proto{Name: "test", Magic: control.RDMA.Magic, Version: control.RDMA.Version,
	Limit: func(wire.Type) (int, bool) { return 1 << 16, true }}

const (
	tConnect   wire.Type = 1
	tAccept    wire.Type = 2
	tReject    wire.Type = 3
	tHello     wire.Type = 5
	tChallenge wire.Type = 6
	tAnswer    wire.Type = 7
	tVerdict   wire.Type = 8
)

type rawClient struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{c: c, rd: bufio.NewReader(c)}
}

func (r *rawClient) send(t *testing.T, typ wire.Type, payload []byte) {
	t.Helper()
	if err := ctl.Write(r.c, typ, 0, payload); err != nil {
		t.Fatal(err)
	}
}

// next reads one frame; ok is false when the target closed the connection.
func (r *rawClient) next(t *testing.T) (wire.Header, []byte, bool) {
	t.Helper()
	var hdr [wire.HeaderLen]byte
	h, p, err := ctl.Read(r.rd, hdr[:], nil)
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
		return h, nil, false
	}
	if err != nil {
		t.Fatalf("read from target: %v", err)
	}
	return h, p, true
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

// closed waits for the target to close the connection (after at most a
// refusal: a reject, or a handshake message with a status not OK).
func (r *rawClient) closed(t *testing.T) {
	t.Helper()
	for range 3 {
		h, p, ok := r.next(t)
		if !ok {
			return
		}
		refusal := h.Type == tReject || (h.Type == tChallenge || h.Type == tVerdict) && len(p) >= 2 && p[1] != 0
		if !refusal {
			t.Fatalf("target answered with frame type %d instead of closing", h.Type)
		}
	}
	t.Fatal("target kept the connection open")
}

// hello runs the auth handshake as initiator with secret s.
func (r *rawClient) hello(t *testing.T, s *auth.Secret, target *segment.Descriptor) (accepted bool) {
	t.Helper()
	in := s.Initiate(segment.ProtoRDMA, auth.Party{Name: "mallory", Epoch: 7}, auth.Party{Name: target.Name, Epoch: target.Epoch})
	r.send(t, tHello, auth.AppendHello(nil, in.Hello()))
	h, p, ok := r.next(t)
	if !ok || h.Type != tChallenge || len(p) < 2 || p[1] != 0 {
		return false
	}
	ch, _, err := auth.ParseChallenge(p[2:])
	if err != nil {
		t.Fatal(err)
	}
	ans, err := in.Finish(ch)
	if err != nil {
		ans = auth.Answer{} // a client without the secret answers without a proof
	}
	r.send(t, tAnswer, control.AppendAnswer(nil, control.StatusOK, ans))
	h, p, ok = r.next(t)
	return ok && h.Type == tVerdict && len(p) == 2 && p[1] == 0
}

// loGID is the loopback device's RoCE GID, which the target's QPs can
// reach (set by the tests before they connect).
var loGID uverbs.GID

func connectPayload(initiator string, initEpoch, targetEpoch uint64, nqp int) []byte {
	var e wire.Enc
	e.String(initiator)
	e.U64(initEpoch)
	e.U64(targetEpoch)
	e.U32(1) // endpoint id
	e.U16(0) // local rail
	e.U16(0) // remote rail
	e.Fixed(loGID[:])
	e.U16(0)
	e.U8(uint8(uverbs.MTU1024))
	e.U8(uint8(nqp))
	for i := range nqp {
		e.U32(uint32(0x100 + i))
		e.U32(0x1234)
	}
	return e.B
}

type targetSide struct {
	node *enginetest.Node
	tr   *rdma.Transport
	desc *segment.Descriptor
}

func startTarget(t *testing.T, devs []string, cfg rdma.Config) *targetSide {
	t.Helper()
	cfg.Options, cfg.Devices = opts, devs
	cfg.HandshakeTimeout = time.Second
	tr := rdma.New(cfg)
	n := enginetest.NewNode(t, engine.Config{Name: "target"}, 1<<20, tr)
	d := n.Engine.LocalDescriptor()
	return &targetSide{node: n, tr: tr, desc: d}
}

// transferWorks checks the target still serves a real initiator.
func transferWorks(t *testing.T, ts *targetSide, devs []string, s *auth.Secret) error {
	t.Helper()
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Publish(ctx, ts.desc); err != nil {
		t.Fatal(err)
	}
	ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 1<<20, rdma.New(rdma.Config{Options: opts, Devices: devs, Auth: s}))
	seg, err := ini.Engine.OpenSegment(ctx, ts.desc.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	rand.Read(ini.Mem.Bytes()[:4096])
	b, _ := ini.Engine.AllocateBatch(1)
	defer ini.Engine.FreeBatch(b)
	if err := ini.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(ts.node.Mem.Bytes())}}); err != nil {
		t.Fatal(err)
	}
	if err := ini.Engine.Wait(ctx, b); err != nil {
		return err
	}
	if !bytes.Equal(ini.Mem.Bytes()[:4096], ts.node.Mem.Bytes()[:4096]) {
		t.Fatal("target memory differs after a completed WRITE")
	}
	return nil
}

// TestHostileControl: garbage, truncated, out-of-order and stale-epoch
// messages on the control port are refused, no QP is created for them,
// and the target keeps serving real initiators.
func TestHostileControl(t *testing.T) {
	topo := srenv.Require(t)
	lo := []string{topo.Lo.Name}
	loGID = topo.Lo.GID
	ts := startTarget(t, lo, rdma.Config{MaxInitiatorQPs: 2})
	addr := ts.tr.ControlAddr()

	t.Run("garbage", func(t *testing.T) {
		r := dialRaw(t, addr)
		junk := make([]byte, 200)
		rand.Read(junk)
		r.c.Write(junk)
		r.closed(t)
	})
	t.Run("truncated-header-then-silence", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.c.Write(ctl.Append(nil, tHello, 0, []byte("x"))[:7])
		start := time.Now()
		r.closed(t)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("silent half frame held the connection for %v", d)
		}
	})
	t.Run("connect-before-hello", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.send(t, tConnect, connectPayload("mallory", 7, ts.desc.Epoch, 1))
		r.closed(t)
	})
	t.Run("oversized-frame", func(t *testing.T) {
		r := dialRaw(t, addr)
		f := ctl.Append(nil, tHello, 0, nil)
		f[8], f[9], f[10], f[11] = 0x7f, 0xff, 0xff, 0xff
		r.c.Write(f)
		r.closed(t)
	})
	t.Run("stale-epoch", func(t *testing.T) {
		r := dialRaw(t, addr)
		if !r.hello(t, nil, ts.desc) {
			t.Fatal("no challenge")
		}
		r.send(t, tConnect, connectPayload("mallory", 7, ts.desc.Epoch+1, 1))
		h, p, ok := r.next(t)
		if !ok || h.Type != tReject || !strings.Contains(string(p), "stale epoch") {
			t.Fatalf("stale-epoch connect: frame %v ok %v %q", h.Type, ok, p)
		}
	})
	t.Run("truncated-connect", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.hello(t, nil, ts.desc)
		p := connectPayload("mallory", 7, ts.desc.Epoch, 1)
		r.send(t, tConnect, p[:len(p)-3])
		r.closed(t)
	})
	t.Run("qp-limit", func(t *testing.T) {
		r := dialRaw(t, addr)
		r.hello(t, nil, ts.desc)
		r.send(t, tConnect, connectPayload("mallory", 7, ts.desc.Epoch, 3))
		if h, p, ok := r.next(t); !ok || h.Type != tReject || !strings.Contains(string(p), "QP limit") {
			t.Fatalf("connect over the QP limit: frame %v ok %v %q", h.Type, ok, p)
		}
		r.send(t, tConnect, connectPayload("mallory", 7, ts.desc.Epoch, 2))
		if h, p, ok := r.next(t); !ok || h.Type != tAccept {
			t.Fatalf("connect within the limit: frame %v ok %v %q", h.Type, ok, p)
		}
		if n := ts.tr.TargetQPs(); n != 2 {
			t.Fatalf("target holds %d QPs, want 2", n)
		}
		r.c.Close() // the lease ends: the target drops the QPs
		deadline := time.Now().Add(10 * time.Second)
		for ts.tr.TargetQPs() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("target still holds %d QPs after the initiator left", ts.tr.TargetQPs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Run("initiator-restart-drops-old-qps", func(t *testing.T) {
		old := dialRaw(t, addr)
		old.hello(t, nil, ts.desc) // mallory, epoch 7
		old.send(t, tConnect, connectPayload("mallory", 7, ts.desc.Epoch, 1))
		if h, p, ok := old.next(t); !ok || h.Type != tAccept {
			t.Fatalf("connect: frame %v ok %v %q", h.Type, ok, p)
		}
		if n := ts.tr.TargetQPs(); n != 1 {
			t.Fatalf("target holds %d QPs, want 1", n)
		}
		// The same initiator comes back from a new epoch: its old QPs go.
		nw := dialRaw(t, addr)
		in := (*auth.Secret)(nil).Initiate(segment.ProtoRDMA, auth.Party{Name: "mallory", Epoch: 8}, auth.Party{Name: ts.desc.Name, Epoch: ts.desc.Epoch})
		nw.send(t, tHello, auth.AppendHello(nil, in.Hello()))
		if h, _, ok := nw.next(t); !ok || h.Type != tChallenge {
			t.Fatal("no challenge")
		}
		nw.send(t, tAnswer, control.AppendAnswer(nil, control.StatusOK, auth.Answer{}))
		if h, _, ok := nw.next(t); !ok || h.Type != tVerdict {
			t.Fatal("no verdict")
		}
		old.closed(t)
		deadline := time.Now().Add(10 * time.Second)
		for ts.tr.TargetQPs() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("old epoch's QPs still held: %d", ts.tr.TargetQPs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	if n := ts.tr.TargetQPs(); n != 0 {
		t.Fatalf("hostile clients left %d QPs", n)
	}
	if err := transferWorks(t, ts, lo, nil); err != nil {
		t.Fatalf("target stopped serving after hostile clients: %v", err)
	}
}

// TestAuth: with a cluster secret, initiators without it, with another
// one, or replaying a captured answer get no QP and move no byte; with it
// everything works.
func TestAuth(t *testing.T) {
	topo := srenv.Require(t)
	lo := []string{topo.Lo.Name}
	secret, _ := auth.New([]byte("the cluster secret, 32 bytes ..."))
	other, _ := auth.New([]byte("another secret of 32 bytes......"))
	ts := startTarget(t, lo, rdma.Config{Auth: secret})

	for _, c := range []struct {
		name string
		s    *auth.Secret
	}{{"no-secret", nil}, {"wrong-secret", other}} {
		t.Run(c.name, func(t *testing.T) {
			err := transferWorks(t, ts, lo, c.s)
			if err == nil {
				t.Fatal("transfer succeeded")
			}
			t.Logf("refused: %v", err)
			if n := ts.tr.TargetQPs(); n != 0 {
				t.Fatalf("target created %d QPs for an unauthenticated initiator", n)
			}
		})
	}
	t.Run("replayed-answer", func(t *testing.T) {
		// A good exchange, captured.
		r := dialRaw(t, ts.tr.ControlAddr())
		in := secret.Initiate(segment.ProtoRDMA, auth.Party{Name: "alice", Epoch: 1}, auth.Party{Name: ts.desc.Name, Epoch: ts.desc.Epoch})
		hello := auth.AppendHello(nil, in.Hello())
		r.send(t, tHello, hello)
		_, p, _ := r.next(t)
		ch, _, _ := auth.ParseChallenge(p[2:])
		ans, err := in.Finish(ch)
		if err != nil {
			t.Fatal(err)
		}
		answer := control.AppendAnswer(nil, control.StatusOK, ans)
		r.c.Close()
		// Replayed on a new connection: the target's nonce is new.
		r2 := dialRaw(t, ts.tr.ControlAddr())
		r2.send(t, tHello, hello)
		if h, _, ok := r2.next(t); !ok || h.Type != tChallenge {
			t.Fatal("no challenge")
		}
		r2.send(t, tAnswer, answer)
		r2.send(t, tConnect, connectPayload("alice", 1, ts.desc.Epoch, 1))
		r2.closed(t)
		if n := ts.tr.TargetQPs(); n != 0 {
			t.Fatalf("target created %d QPs for a replayed answer", n)
		}
	})
	t.Run("skip-challenge", func(t *testing.T) {
		r := dialRaw(t, ts.tr.ControlAddr())
		in := secret.Initiate(segment.ProtoRDMA, auth.Party{Name: "eve", Epoch: 1}, auth.Party{Name: ts.desc.Name, Epoch: ts.desc.Epoch})
		r.send(t, tHello, auth.AppendHello(nil, in.Hello()))
		r.send(t, tConnect, connectPayload("eve", 1, ts.desc.Epoch, 1))
		if h, _, ok := r.next(t); !ok || h.Type != tChallenge {
			t.Fatal("no challenge")
		}
		r.closed(t) // the connect came where the answer belongs
		if n := ts.tr.TargetQPs(); n != 0 {
			t.Fatalf("target created %d QPs for an initiator that skipped the challenge", n)
		}
	})
	t.Run("with-secret", func(t *testing.T) {
		if err := transferWorks(t, ts, lo, secret); err != nil {
			t.Fatal(err)
		}
	})
}
