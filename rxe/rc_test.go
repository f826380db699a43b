package rxe_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/verbstest"
)

const maxMsg = 8 << 20 // rxe max_msg_sz

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}

// side is one end of an RC connection on an rxe device, built like the
// conformance suite's own.
type side = verbstest.Side

type topology struct {
	name string
	a, b srenv.Dev
}

func topologies(t *testing.T) []topology {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	return []topology{{"veth-" + a.Name + "-" + b.Name, a, b}, {"loopback-" + topo.Lo.Name, topo.Lo, topo.Lo}}
}

func device(d srenv.Dev) verbstest.Device {
	return verbstest.Device{Name: d.Name, Port: 1, GIDIndex: d.GIDIndex}
}

func target(a, b srenv.Dev) verbstest.Target {
	return verbstest.Target{A: device(a), B: device(b), Options: opts, MaxMsg: maxMsg}
}

func newSide(t testing.TB, dev srenv.Dev, cfg verbstest.SideConfig) *side {
	return verbstest.NewSide(t, target(dev, dev), device(dev), cfg)
}

// pair builds and connects two sides.
func pair(t testing.TB, tp topology, bufSize int, tweak func(*uverbs.ConnectConfig)) (*side, *side) {
	return verbstest.Pair(t, target(tp.a, tp.b), bufSize, tweak)
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
	s := newSide(t, topo.Lo, verbstest.SideConfig{BufSize: 4096})
	small, err := s.Ctx.CreateCQ(uverbs.CQConfig{Entries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	qp, err := s.PD.CreateQP(uverbs.QPConfig{SendCQ: small, RecvCQ: small, Caps: uverbs.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if err := qp.ToInit(1, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := qp.PostRecv([]uverbs.RecvWR{{ID: uint64(i), SGL: []uverbs.SGE{s.MR.SGE(0, 8)}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := qp.ToErr(); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-s.Ctx.Events():
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
			small := verbstest.SideConfig{Depth: 4, CQEntries: 4}
			a, b := newSide(t, tp.a, small), newSide(t, tp.b, small)
			a.Connect(b, nil)
			b.Connect(a, nil)
			if a.CQ.Entries() > 16 || a.QP.Caps().MaxSendWR > 16 {
				t.Fatalf("queues larger than asked: CQ %d, SQ %d", a.CQ.Entries(), a.QP.Caps().MaxSendWR)
			}
			for i := 0; i < 100; i++ {
				put64(a.Buf()[8*(i%64):], uint64(i)*0x01010101)
				b.PostRecv(uint64(1000+i), b.MR.SGE(8*(i%64), 8))
				a.PostSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.MR.SGE(8*(i%64), 8)}})
				a.Wait1(uint64(i), uverbs.WCSuccess)
				b.Wait1(uint64(1000+i), uverbs.WCSuccess)
				if got := le64(b.Buf()[8*(i%64):]); got != uint64(i)*0x01010101 {
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
			qa2, err := a.PD.CreateQP(uverbs.QPConfig{SendCQ: a.CQ, RecvCQ: a.CQ, Caps: caps})
			if err != nil {
				t.Fatal(err)
			}
			defer qa2.Close()
			qb2, err := b.PD.CreateQP(uverbs.QPConfig{SendCQ: b.CQ, RecvCQ: b.CQ, Caps: caps})
			if err != nil {
				t.Fatal(err)
			}
			defer qb2.Close()
			ea2, _ := qa2.LocalEndpoint(1, a.GID, 77)
			eb2, _ := qb2.LocalEndpoint(1, b.GID, 88)
			if err := qa2.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(a.Dev.GIDIndex), LocalPSN: 77, Remote: eb2}); err != nil {
				t.Fatal(err)
			}
			if err := qb2.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(b.Dev.GIDIndex), LocalPSN: 88, Remote: ea2}); err != nil {
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
					SGL: []uverbs.SGE{a.MR.SGE(4096*k, 512)}, RemoteAddr: b.Addr(4096 * k), RKey: b.MR.RKey()}}
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
			go poster(0, a.QP)
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
					m, err := a.CQ.Poll(wc)
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
						if want := []uverbs.QPN{a.QP.QPN(), qa2.QPN()}[k]; w.QPN != want {
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
	a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	a.Wait1(1, uverbs.WCSuccess)
	if err := a.QP.Modify(&uverbs.QPAttr{State: uverbs.QPStateSQD, EnSQDAsyncNotify: true}, uverbs.QPAttrState|uverbs.QPAttrEnSQDAsyncNotify); err != nil {
		t.Fatal(err)
	}
	// A post in SQD stays queued but runs the requester, which notices the drain.
	a.PostSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-a.Ctx.Events():
			t.Logf("event %s", ev)
			if ev.Type == uverbs.EventSQDrained {
				if ev.QP != a.QP {
					t.Fatalf("SQ_DRAINED for %v, want QP %#x", ev.QP, a.QP.QPN())
				}
				// Back to RTS: the queued WR executes.
				if err := a.QP.Modify(&uverbs.QPAttr{State: uverbs.QPStateRTS}, uverbs.QPAttrState); err != nil {
					t.Fatal(err)
				}
				a.PostSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
				for _, wc := range a.Wait(2) {
					if wc.Status != uverbs.WCSuccess {
						t.Errorf("after SQD->RTS: %+v", wc)
					}
				}
				return
			}
		case <-timeout:
			q, _ := a.QP.Query()
			t.Fatalf("no SQ_DRAINED event (QP state %s, draining %v)", q.State, q.SQDraining)
		}
	}
}
