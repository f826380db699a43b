package rxe_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

const maxMsg = 8 << 20 // rxe max_msg_sz

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}

// side is one end of an RC connection: its own context (a "host"), PD,
// CQ with completion channel, QP, and one MR split into a send half [0,maxMsg)
// and a receive half [maxMsg, 2*maxMsg).
type side struct {
	t   testing.TB
	dev srenv.Dev
	ctx *uverbs.Context
	pd  *uverbs.PD
	ch  *uverbs.CompChannel
	cq  *uverbs.CQ
	qp  *uverbs.QP
	mr  *uverbs.MR
	gid uverbs.GIDEntry
	psn uverbs.PSN
}

func newSide(t *testing.T, dev srenv.Dev, bufSize int) *side { return newSideTB(t, dev, bufSize) }

func newBenchSide(b *testing.B, dev srenv.Dev) *side { return newSideTB(b, dev, 1<<20) }

func newSideTB(t testing.TB, dev srenv.Dev, bufSize int) *side {
	return newSideCQ(t, dev, bufSize, 256)
}

func newSideCQ(t testing.TB, dev srenv.Dev, bufSize, cqEntries int) *side {
	t.Helper()
	s := &side{t: t, dev: dev}
	var err error
	if s.ctx, err = uverbs.Open(dev.Name, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.ctx.Close(); err != nil {
			t.Errorf("%s: context close: %v", dev.Name, err)
		}
	})
	ip, _ := netip.AddrFromSlice(dev.IP)
	if s.gid, err = s.ctx.FindRoCEv2GID(1, ip.Unmap()); err != nil {
		t.Fatal(err)
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = s.ctx.CreateCQ(uverbs.CQConfig{Entries: cqEntries, Channel: s.ch, SpinPolls: 100}); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.AllocMR(bufSize, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead|uverbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(uverbs.QPConfig{SendCQ: s.cq, RecvCQ: s.cq,
		Caps: uverbs.QPCaps{MaxSendWR: uint32(min(64, cqEntries)), MaxRecvWR: uint32(min(64, cqEntries)), MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 128}}); err != nil {
		t.Fatal(err)
	}
	s.psn = uverbs.PSN(rand.Uint32() & 0xffffff)
	t.Cleanup(s.close)
	return s
}

// close releases everything in order; every Close is called twice to prove
// idempotence.
func (s *side) close() {
	for i := 0; i < 2; i++ {
		for _, c := range []interface{ Close() error }{s.qp, s.cq, s.ch, s.mr, s.pd} {
			if err := c.Close(); err != nil {
				s.t.Errorf("%s: close %T: %v", s.dev.Name, c, err)
			}
		}
	}
}

// endpoint returns the side's endpoint as its peer receives it: encoded,
// sent "over the wire", decoded.
func (s *side) endpoint() uverbs.Endpoint {
	e, err := s.qp.LocalEndpoint(1, s.gid.GID, s.psn)
	if err != nil {
		s.t.Fatal(err)
	}
	wire, err := e.MarshalBinary()
	if err != nil {
		s.t.Fatal(err)
	}
	var got uverbs.Endpoint
	if err := got.UnmarshalBinary(wire); err != nil || got != e {
		s.t.Fatalf("endpoint round trip: %+v %v", got, err)
	}
	return got
}

func (s *side) connect(peer uverbs.Endpoint, tweak func(*uverbs.ConnectConfig)) {
	cfg := uverbs.ConnectConfig{SGIDIndex: uint8(s.gid.Index), LocalPSN: s.psn, Remote: peer}
	if tweak != nil {
		tweak(&cfg)
	}
	if err := s.qp.Connect(cfg); err != nil {
		s.t.Fatal(err)
	}
	if a, err := s.qp.Query(); err != nil || a.State != uverbs.QPStateRTS || a.DestQPN != peer.QPN || a.SQPSN != s.psn {
		s.t.Fatalf("%s: after connect: %v %+v", s.dev.Name, err, a)
	}
}

func (s *side) buf() []byte         { return s.mr.Bytes() }
func (s *side) addr(off int) uint64 { return s.mr.Addr() + uint64(off) }

// wait collects n completions (any order) within a deadline.
func (s *side) wait(n int) []uverbs.WC {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]uverbs.WC, 0, n)
	wc := make([]uverbs.WC, 16)
	for len(out) < n {
		m, err := s.cq.Wait(ctx, wc[:min(len(wc), n-len(out))])
		if err != nil {
			s.t.Fatalf("%s: waiting for %d completions, got %d %+v: %v", s.dev.Name, n, len(out), out, err)
		}
		out = append(out, wc[:m]...)
	}
	return out
}

func (s *side) wait1(wantID uint64, status uverbs.WCStatus) uverbs.WC {
	s.t.Helper()
	wc := s.wait(1)[0]
	if wc.ID != wantID || wc.Status != status {
		s.t.Fatalf("%s: completion %+v (%s), want id %d status %s", s.dev.Name, wc, wc.Status, wantID, status)
	}
	return wc
}

func (s *side) postRecv(id uint64, sgl ...uverbs.SGE) {
	s.t.Helper()
	if n, err := s.qp.PostRecv([]uverbs.RecvWR{{ID: id, SGL: sgl}}); err != nil || n != 1 {
		s.t.Fatalf("%s: post_recv: %d %v", s.dev.Name, n, err)
	}
}

func (s *side) postSend(wr uverbs.SendWR) {
	s.t.Helper()
	if n, err := s.qp.PostSend([]uverbs.SendWR{wr}); err != nil || n != 1 {
		s.t.Fatalf("%s: post_send %s: %d %v", s.dev.Name, wr.Opcode, n, err)
	}
}

type topology struct {
	name string
	a, b srenv.Dev
}

func topologies(t *testing.T) []topology {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	return []topology{{"veth-" + a.Name + "-" + b.Name, a, b}, {"loopback-" + topo.Lo.Name, topo.Lo, topo.Lo}}
}

// pair builds and connects two sides.
func pair(t *testing.T, tp topology, bufSize int, tweak func(*uverbs.ConnectConfig)) (*side, *side) {
	a := newSide(t, tp.a, bufSize)
	b := newSide(t, tp.b, bufSize)
	ea, eb := a.endpoint(), b.endpoint()
	a.connect(eb, tweak)
	b.connect(ea, tweak)
	return a, b
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func le64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func put64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}

// TestCQOverflowEvent: a CQ that overflows raises an async CQ_ERR event,
// delivered on Context.Events.
func TestCQOverflowEvent(t *testing.T) {
	topo := srenv.Require(t)
	s := newSide(t, topo.Lo, 4096)
	small, err := s.ctx.CreateCQ(uverbs.CQConfig{Entries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	qp, err := s.pd.CreateQP(uverbs.QPConfig{SendCQ: small, RecvCQ: small, Caps: uverbs.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if err := qp.ToInit(1, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := qp.PostRecv([]uverbs.RecvWR{{ID: uint64(i), SGL: []uverbs.SGE{s.mr.SGE(0, 8)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := qp.ToErr(); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-s.ctx.Events():
		if ev.Type != uverbs.EventCQErr || ev.CQ != small {
			t.Fatalf("event %s, want CQ_ERR on the small CQ", ev)
		}
		t.Logf("got %s", ev)
	case <-time.After(10 * time.Second):
		t.Fatal("no CQ_ERR event after overflowing a CQ")
	}
}

// TestRingsWrap drives the CQ, SQ and RQ rings around many times with small
// queues, checking order and data on every lap.
func TestRingsWrap(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a := newSideCQ(t, tp.a, 1<<16, 4)
			b := newSideCQ(t, tp.b, 1<<16, 4)
			ea, eb := a.endpoint(), b.endpoint()
			a.connect(eb, nil)
			b.connect(ea, nil)
			if a.cq.Entries() > 16 || a.qp.Caps().MaxSendWR > 16 {
				t.Fatalf("queues larger than asked: CQ %d, SQ %d", a.cq.Entries(), a.qp.Caps().MaxSendWR)
			}
			for i := 0; i < 100; i++ {
				put64(a.buf()[8*(i%64):], uint64(i)*0x01010101)
				b.postRecv(uint64(1000+i), b.mr.SGE(8*(i%64), 8))
				a.postSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(8*(i%64), 8)}})
				a.wait1(uint64(i), uverbs.WCSuccess)
				b.wait1(uint64(1000+i), uverbs.WCSuccess)
				if got := le64(b.buf()[8*(i%64):]); got != uint64(i)*0x01010101 {
					t.Fatalf("lap %d: got %#x", i, got)
				}
			}
		})
	}
}

// TestConcurrentQPsSharedCQ: two QPs feed one CQ; each QP's send side is
// owned by its own goroutine, a third goroutine owns the CQ, and the GC runs
// throughout. Every WR must complete exactly once, successfully.
func TestConcurrentQPsSharedCQ(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 1<<20, nil)
			// A second QP on a, sharing a's CQ, connected to a second QP on b.
			caps := uverbs.QPCaps{MaxSendWR: 64, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
			qa2, err := a.pd.CreateQP(uverbs.QPConfig{SendCQ: a.cq, RecvCQ: a.cq, Caps: caps})
			if err != nil {
				t.Fatal(err)
			}
			defer qa2.Close()
			qb2, err := b.pd.CreateQP(uverbs.QPConfig{SendCQ: b.cq, RecvCQ: b.cq, Caps: caps})
			if err != nil {
				t.Fatal(err)
			}
			defer qb2.Close()
			ea2, _ := qa2.LocalEndpoint(1, a.gid.GID, 77)
			eb2, _ := qb2.LocalEndpoint(1, b.gid.GID, 88)
			if err := qa2.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(a.gid.Index), LocalPSN: 77, Remote: eb2}); err != nil {
				t.Fatal(err)
			}
			if err := qb2.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(b.gid.Index), LocalPSN: 88, Remote: ea2}); err != nil {
				t.Fatal(err)
			}
			const perQP, depth = 1500, 16
			credits := [2]chan struct{}{make(chan struct{}, depth), make(chan struct{}, depth)}
			for i := range credits {
				for j := 0; j < depth; j++ {
					credits[i] <- struct{}{}
				}
			}
			errs := make(chan error, 3)
			poster := func(k int, qp *uverbs.QP) {
				wr := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(4096*k, 512)}, RemoteAddr: b.addr(4096 * k), RKey: b.mr.RKey()}}
				for i := 0; i < perQP; i++ {
					<-credits[k]
					wr[0].ID = uint64(k)<<32 | uint64(i)
					if _, err := qp.PostSend(wr); err != nil {
						errs <- err
						return
					}
					if i%200 == 0 {
						runtime.GC()
					}
				}
				errs <- nil
			}
			go poster(0, a.qp)
			go poster(1, qa2)
			go func() { // the CQ owner
				seen := [2][]bool{make([]bool, perQP), make([]bool, perQP)}
				wc := make([]uverbs.WC, 32)
				deadline := time.Now().Add(60 * time.Second)
				for n := 0; n < 2*perQP; {
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("only %d of %d completions", n, 2*perQP)
						return
					}
					m, err := a.cq.Poll(wc)
					if err != nil {
						errs <- err
						return
					}
					for _, w := range wc[:m] {
						k, i := int(w.ID>>32), int(uint32(w.ID))
						if w.Status != uverbs.WCSuccess || k > 1 || i >= perQP || seen[k][i] {
							errs <- fmt.Errorf("bad or duplicate completion %+v", w)
							return
						}
						if want := []uverbs.QPN{a.qp.QPN(), qa2.QPN()}[k]; w.QPN != want {
							errs <- fmt.Errorf("completion for QP %#x carries QPN %#x", want, w.QPN)
							return
						}
						seen[k][i] = true
						credits[k] <- struct{}{}
					}
					n += m
					if m == 0 {
						runtime.Gosched()
					}
				}
				errs <- nil
			}()
			for i := 0; i < 3; i++ {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestQPAsyncEvent: moving an RTS QP to SQD with async notification makes
// rxe raise SQ_DRAINED once the send queue is idle; the event arrives on
// Context.Events naming the QP.
func TestQPAsyncEvent(t *testing.T) {
	topo := srenv.Require(t)
	a, b := pair(t, topology{"lo", topo.Lo, topo.Lo}, 1<<16, nil)
	a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
	a.wait1(1, uverbs.WCSuccess)
	if err := a.qp.Modify(&uverbs.QPAttr{State: uverbs.QPStateSQD, EnSQDAsyncNotify: true}, uverbs.QPAttrState|uverbs.QPAttrEnSQDAsyncNotify); err != nil {
		t.Fatal(err)
	}
	// A post in SQD stays queued but runs the requester, which notices the drain.
	a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-a.ctx.Events():
			t.Logf("event %s", ev)
			if ev.Type == uverbs.EventSQDrained {
				if ev.QP != a.qp {
					t.Fatalf("SQ_DRAINED for %v, want QP %#x", ev.QP, a.qp.QPN())
				}
				// Back to RTS: the queued WR executes.
				if err := a.qp.Modify(&uverbs.QPAttr{State: uverbs.QPStateRTS}, uverbs.QPAttrState); err != nil {
					t.Fatal(err)
				}
				a.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
				for _, wc := range a.wait(2) {
					if wc.Status != uverbs.WCSuccess {
						t.Errorf("after SQD->RTS: %+v", wc)
					}
				}
				return
			}
		case <-timeout:
			q, _ := a.qp.Query()
			t.Fatalf("no SQ_DRAINED event (QP state %s, draining %v)", q.State, q.SQDraining)
		}
	}
}
