//go:build amd64 || arm64

package mlx5sim_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs"
)

// side is one end of an RC connection on a simulated device, built through
// uverbs and the real mlx5 provider: context, PD, completion channel, CQ,
// QP and a registered buffer.
type side struct {
	t    *testing.T
	ctx  *uverbs.Context
	port uverbs.RCPort
	pd   *uverbs.PD
	ch   *uverbs.CompChannel
	cq   *uverbs.CQ
	qp   *uverbs.QP
	mr   *uverbs.MR
}

func newSide(t *testing.T, f *mlx5sim.Fabric, d uverbs.Device) *side {
	t.Helper()
	s := &side{t: t}
	var err error
	if s.ctx, err = uverbs.Open(d.Name, f.Options(mlx5.Provider())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{s.qp, s.cq, s.ch, s.mr, s.pd, s.ctx} {
			if err := c.Close(); err != nil {
				t.Errorf("%s: close %T: %v", d.Name, c, err)
			}
		}
	})
	if s.port, err = s.ctx.RCPort(1, -1); err != nil {
		t.Fatal(err)
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = s.ctx.CreateCQ(uverbs.CQConfig{Entries: 64, Channel: s.ch}); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.AllocMR(1<<16, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(uverbs.QPConfig{SendCQ: s.cq, RecvCQ: s.cq,
		Caps: uverbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// pair connects an RC QP on device a with one on device b.
func pair(t *testing.T, f *mlx5sim.Fabric) (a, b *side) {
	a = newSide(t, f, f.AddDevice("mlx5_0"))
	b = newSide(t, f, f.AddDevice("mlx5_1"))
	if a.port.GID.GID == b.port.GID.GID || a.port.Attr.ActiveMTU != uverbs.MTU1024 {
		t.Fatalf("ports %+v and %+v", a.port, b.port)
	}
	for _, c := range [][2]*side{{a, b}, {b, a}} {
		if err := c[0].qp.ToInit(1, uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range [][2]*side{{a, b}, {b, a}} {
		if err := c[0].port.Connect(c[0].qp, 1, c[1].port.Endpoint(c[1].qp, 1), uverbs.ConnectConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

func newFabric(t *testing.T) *mlx5sim.Fabric {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	return f
}

// wait polls s's CQ until n completions arrived (10 s at most).
func (s *side) wait(n int) []uverbs.WC {
	s.t.Helper()
	var out []uverbs.WC
	wc := make([]uverbs.WC, 8)
	for deadline := time.Now().Add(10 * time.Second); len(out) < n; {
		k, err := s.cq.Poll(wc)
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, wc[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				s.t.Fatalf("%d of %d completions after 10 s: %+v", len(out), n, out)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	return out
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i)*7 + seed
	}
}

// TestRCPair: RDMA WRITE, READ and SEND with immediate between QPs of two
// contexts on two devices move the bytes the work requests say, with a
// CQE on the requester's CQ and, for the SEND, on the responder's.
func TestRCPair(t *testing.T) {
	f := newFabric(t)
	a, b := pair(t, f)
	ab, bb := a.mr.Bytes(), b.mr.Bytes()
	fill(ab[:4096], 1)
	if _, err := a.qp.PostSend([]uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(1)[0]; wc.ID != 1 || wc.Status != uverbs.WCSuccess || wc.Opcode != uverbs.WCRDMAWrite || wc.QPN != a.qp.QPN() {
		t.Fatalf("write completion %+v", wc)
	}
	if !bytes.Equal(ab[:4096], bb[8192:8192+4096]) {
		t.Fatal("WRITE: remote memory differs")
	}

	fill(bb[:1000], 2)
	if _, err := a.qp.PostSend([]uverbs.SendWR{{ID: 2, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(20000, 600), a.mr.SGE(30000, 400)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(1)[0]; wc.ID != 2 || wc.Status != uverbs.WCSuccess || wc.Opcode != uverbs.WCRDMARead || wc.ByteLen != 1000 {
		t.Fatalf("read completion %+v", wc)
	}
	if !bytes.Equal(ab[20000:20600], bb[:600]) || !bytes.Equal(ab[30000:30400], bb[600:1000]) {
		t.Fatal("READ: local memory differs")
	}

	if _, err := b.qp.PostRecv([]uverbs.RecvWR{{ID: 7, SGL: []uverbs.SGE{b.mr.SGE(40000, 100), b.mr.SGE(50000, 100)}}}); err != nil {
		t.Fatal(err)
	}
	fill(ab[:150], 3)
	if _, err := a.qp.PostSend([]uverbs.SendWR{{ID: 3, Opcode: uverbs.WRSendWithImm, Flags: uverbs.SendSignaled, Imm: 0xabcd,
		SGL: []uverbs.SGE{a.mr.SGE(0, 150)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(1)[0]; wc.ID != 3 || wc.Status != uverbs.WCSuccess || wc.Opcode != uverbs.WCSend {
		t.Fatalf("send completion %+v", wc)
	}
	r := b.wait(1)[0]
	if r.ID != 7 || r.Status != uverbs.WCSuccess || r.Opcode != uverbs.WCRecv || r.ByteLen != 150 || r.Imm != 0xabcd || r.Flags&uverbs.WCFlagWithImm == 0 {
		t.Fatalf("receive completion %+v", r)
	}
	if !bytes.Equal(ab[:100], bb[40000:40100]) || !bytes.Equal(ab[100:150], bb[50000:50050]) {
		t.Fatal("SEND: receive buffers differ")
	}
	if c := f.Counters("mlx5_0"); c.WQEs != 3 || c.CQEs != 3 {
		t.Errorf("mlx5_0 counters %+v, want 3 WQEs and 3 CQEs", c)
	}
}

// TestRKeyChecks: a WRITE with an rkey the peer never registered, or past
// the end of its MR, completes with a remote access error and moves the QP
// to the error state, where the requests behind it flush; nothing is
// written.
func TestRKeyChecks(t *testing.T) {
	for _, c := range []struct {
		name string
		wr   func(a, b *side) uverbs.SendWR
	}{
		{"unknown rkey", func(a, b *side) uverbs.SendWR {
			return uverbs.SendWR{RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() + 0x100}
		}},
		{"past the MR", func(a, b *side) uverbs.SendWR {
			return uverbs.SendWR{RemoteAddr: b.mr.Addr() + uint64(b.mr.Len()) - 10, RKey: b.mr.RKey()}
		}},
		{"local key as remote", func(a, b *side) uverbs.SendWR {
			return uverbs.SendWR{RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFabric(t)
			a, b := pair(t, f)
			fill(a.mr.Bytes()[:64], 9)
			bad := c.wr(a, b)
			bad.ID, bad.Opcode, bad.Flags, bad.SGL = 1, uverbs.WRRDMAWrite, uverbs.SendSignaled, []uverbs.SGE{a.mr.SGE(0, 64)}
			good := uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
			if _, err := a.qp.PostSend([]uverbs.SendWR{bad, good}); err != nil {
				t.Fatal(err)
			}
			wcs := a.wait(2)
			if wcs[0].ID != 1 || wcs[0].Status != uverbs.WCRemAccessErr || wcs[1].ID != 2 || wcs[1].Status != uverbs.WCWRFlushErr {
				t.Fatalf("completions %+v, want a remote access error then a flush", wcs)
			}
			if bytes.Contains(b.mr.Bytes(), a.mr.Bytes()[:64]) {
				t.Fatal("the refused WRITE reached the peer's memory")
			}
		})
	}
}

// TestCompletionEvent: a completion raises an event on the CQ's channel
// only when the CQ was armed, once per arm.
func TestCompletionEvent(t *testing.T) {
	f := newFabric(t)
	a, b := pair(t, f)
	write := func(id uint64) {
		t.Helper()
		if _, err := a.qp.PostSend([]uverbs.SendWR{{ID: id, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	noEvent := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if cq, err := a.ch.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: event for %v (%v)", what, cq, err)
		}
	}
	write(1)
	a.wait(1)
	noEvent("unarmed CQ")
	for i := range 3 {
		if err := a.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		write(uint64(10 + i))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cq, err := a.ch.Wait(ctx)
		cancel()
		if err != nil || cq != a.cq {
			t.Fatalf("arm %d: event %v, %v", i, cq, err)
		}
		a.wait(1)
		write(uint64(20 + i))
		a.wait(1)
		noEvent("CQ whose event was consumed")
	}
	if c := f.Counters("mlx5_0"); c.Events != 3 {
		t.Errorf("%d events, want 3", c.Events)
	}
}

// TestHold: a held WRITE stays in flight (no CQE, memory untouched) until
// Release; the policy sees the WQE's device, QP and opcode.
func TestHold(t *testing.T) {
	f := newFabric(t)
	a, b := pair(t, f)
	var seen []mlx5sim.WQE
	f.SetPolicy(func(w mlx5sim.WQE) mlx5sim.Verdict {
		seen = append(seen, w)
		return mlx5sim.Hold
	})
	fill(a.mr.Bytes()[:64], 5)
	if _, err := a.qp.PostSend([]uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); f.Held() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("nothing held after 10 s")
		}
	}
	wc := make([]uverbs.WC, 1)
	if n, _ := a.cq.Poll(wc); n != 0 || bytes.Equal(a.mr.Bytes()[:64], b.mr.Bytes()[:64]) {
		t.Fatal("the held WRITE completed")
	}
	if n := f.Release(); n != 1 {
		t.Fatalf("released %d", n)
	}
	if w := a.wait(1)[0]; w.ID != 1 || w.Status != uverbs.WCSuccess || !bytes.Equal(a.mr.Bytes()[:64], b.mr.Bytes()[:64]) {
		t.Fatalf("after release: %+v", w)
	}
	f.SetPolicy(nil)
	if len(seen) != 1 || seen[0].Device != "mlx5_0" || seen[0].QPN != uint32(a.qp.QPN()) || seen[0].Opcode != 0x08 {
		t.Fatalf("policy saw %+v", seen)
	}
}

// TestSetPort: a port taken down raises PORT_ERR on its contexts and
// reads DOWN; work to its device waits, goes through if the link comes
// back (PORT_ACTIVE) within the QP's retry bound, and else fails with
// retry-exceeded, flushing what follows.
func TestSetPort(t *testing.T) {
	f := newFabric(t)
	a, b := pair(t, f)
	event := func(want uverbs.AsyncEventType) {
		t.Helper()
		select {
		case ev := <-b.ctx.Events():
			if ev.Type != want || ev.Port != 1 {
				t.Fatalf("event %v, want %v on port 1", ev, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %v after 10 s", want)
		}
	}
	if err := f.SetPort("mlx5_1", false); err != nil {
		t.Fatal(err)
	}
	event(uverbs.EventPortErr)
	if pa, err := b.ctx.QueryPort(1); err != nil || pa.State != uverbs.PortDown {
		t.Fatalf("port of a device taken down: %+v, %v", pa, err)
	}
	wr := uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	// Back up within the retry bound (~470 ms): the write goes through.
	if _, err := a.qp.PostSend([]uverbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	wc := make([]uverbs.WC, 1)
	if n, _ := a.cq.Poll(wc); n != 0 {
		t.Fatalf("a write over a link that is down completed at once: %+v", wc[0])
	}
	if err := f.SetPort("mlx5_1", true); err != nil {
		t.Fatal(err)
	}
	event(uverbs.EventPortActive)
	if w := a.wait(1)[0]; w.Status != uverbs.WCSuccess {
		t.Fatalf("write retransmitted once the link came back: %+v", w)
	}
	// Down for good: the retries run out.
	if err := f.SetPort("mlx5_1", false); err != nil {
		t.Fatal(err)
	}
	event(uverbs.EventPortErr)
	if _, err := a.qp.PostSend([]uverbs.SendWR{wr, wr}); err != nil {
		t.Fatal(err)
	}
	if wcs := a.wait(2); wcs[0].Status != uverbs.WCRetryExcErr || wcs[1].Status != uverbs.WCWRFlushErr {
		t.Fatalf("writes to a device whose port is down: %+v", wcs)
	}
	if err := f.SetPort("mlx5_1", true); err != nil {
		t.Fatal(err)
	}
	event(uverbs.EventPortActive)
	if err := f.SetPort("nosuch", true); !errors.Is(err, uverbs.ErrNoDevice) {
		t.Errorf("SetPort of an unknown device: %v", err)
	}
}
