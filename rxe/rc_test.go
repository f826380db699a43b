package rxe_test

import (
	"bytes"
	"context"
	"errors"
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
func (s *side) recvOff() int        { return s.mr.Len() / 2 }
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

// pollOnly busy-polls (never arms) for one completion.
func (s *side) pollOnly() uverbs.WC {
	s.t.Helper()
	wc := make([]uverbs.WC, 1)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		n, err := s.cq.Poll(wc)
		if err != nil {
			s.t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		time.Sleep(50 * time.Microsecond)
	}
	s.t.Fatalf("%s: no completion", s.dev.Name)
	return uverbs.WC{}
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

var sizes = []int{1, 63, 4096, 65537, 1 << 20, maxMsg}

func TestRCSendRecv(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 2*maxMsg, nil)
			for i, n := range sizes {
				for _, withImm := range []bool{false, true} {
					src := a.buf()[:n]
					fill(src, uint64(n)+uint64(i))
					dst := b.buf()[b.recvOff() : b.recvOff()+n]
					clear(dst)
					b.postRecv(100+uint64(i), b.mr.SGE(b.recvOff(), n))
					wr := uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, n)}}
					if withImm {
						wr.Opcode, wr.Imm = uverbs.WRSendWithImm, 0xdeadbeef^uint32(n)
					}
					a.postSend(wr)
					sc := a.wait1(uint64(i), uverbs.WCSuccess)
					if sc.Opcode != uverbs.WCSend || sc.QPN != a.qp.QPN() {
						t.Errorf("send completion %+v", sc)
					}
					rc := b.wait1(100+uint64(i), uverbs.WCSuccess)
					if rc.Opcode != uverbs.WCRecv || rc.ByteLen != uint32(n) || rc.QPN != b.qp.QPN() {
						t.Errorf("recv completion %+v, want RECV of %d bytes", rc, n)
					}
					if withImm != (rc.Flags&uverbs.WCFlagWithImm != 0) || (withImm && rc.Imm != wr.Imm) {
						t.Errorf("recv completion imm flags %#x imm %#x, want imm=%v %#x", rc.Flags, rc.Imm, withImm, wr.Imm)
					}
					if !bytes.Equal(src, dst) {
						t.Fatalf("SEND of %d bytes (imm %v): data differs", n, withImm)
					}
				}
			}
		})
	}
}

func TestRCWriteRead(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 2*maxMsg, nil)
			for i, n := range sizes {
				// RDMA WRITE a[0:n] -> b[recv half]
				src := a.buf()[:n]
				fill(src, uint64(3*n))
				dst := b.buf()[b.recvOff() : b.recvOff()+n]
				clear(dst)
				a.postSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(0, n)}, RemoteAddr: b.addr(b.recvOff()), RKey: b.mr.RKey()})
				if wc := a.wait1(uint64(i), uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMAWrite {
					t.Errorf("write completion %+v", wc)
				}
				if !bytes.Equal(src, dst) {
					t.Fatalf("RDMA WRITE of %d bytes: data differs", n)
				}
				// RDMA WRITE WITH IMM consumes a receive and reports the immediate.
				fill(src, uint64(5*n))
				b.postRecv(500 + uint64(i))
				a.postSend(uverbs.SendWR{ID: 50 + uint64(i), Opcode: uverbs.WRRDMAWriteWithImm, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(0, n)}, RemoteAddr: b.addr(b.recvOff()), RKey: b.mr.RKey(), Imm: uint32(n) * 7})
				a.wait1(50+uint64(i), uverbs.WCSuccess)
				rc := b.wait1(500+uint64(i), uverbs.WCSuccess)
				if rc.Opcode != uverbs.WCRecvRDMAWithImm || rc.Flags&uverbs.WCFlagWithImm == 0 || rc.Imm != uint32(n)*7 || rc.ByteLen != uint32(n) {
					t.Errorf("write-with-imm receive completion %+v", rc)
				}
				if !bytes.Equal(src, dst) {
					t.Fatalf("RDMA WRITE WITH IMM of %d bytes: data differs", n)
				}
				// RDMA READ b[send half] -> a[recv half]
				rsrc := b.buf()[:n]
				fill(rsrc, uint64(7*n))
				rdst := a.buf()[a.recvOff() : a.recvOff()+n]
				clear(rdst)
				a.postSend(uverbs.SendWR{ID: 90 + uint64(i), Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(a.recvOff(), n)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
				if wc := a.wait1(90+uint64(i), uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMARead || wc.ByteLen != uint32(n) {
					t.Errorf("read completion %+v", wc)
				}
				if !bytes.Equal(rsrc, rdst) {
					t.Fatalf("RDMA READ of %d bytes: data differs", n)
				}
			}
		})
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

func TestRCAtomics(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 1<<16, nil)
			target := b.buf()[64:72]
			put64(target, 1000)
			res := a.buf()[128:136]
			// FETCH_ADD returns the old value and adds.
			a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRAtomicFetchAndAdd, Flags: uverbs.SendSignaled,
				SGL: []uverbs.SGE{a.mr.SGE(128, 8)}, RemoteAddr: b.addr(64), RKey: b.mr.RKey(), CompareAdd: 23})
			if wc := a.wait1(1, uverbs.WCSuccess); wc.Opcode != uverbs.WCFetchAdd || wc.ByteLen != 8 {
				t.Errorf("fetch-add completion %+v", wc)
			}
			if le64(res) != 1000 || le64(target) != 1023 {
				t.Fatalf("FETCH_ADD: returned %d (want 1000), target %d (want 1023)", le64(res), le64(target))
			}
			// CMP_AND_SWP that matches swaps; one that does not leaves the target.
			a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRAtomicCmpAndSwp, Flags: uverbs.SendSignaled,
				SGL: []uverbs.SGE{a.mr.SGE(128, 8)}, RemoteAddr: b.addr(64), RKey: b.mr.RKey(), CompareAdd: 1023, Swap: 0xfeedface})
			if wc := a.wait1(2, uverbs.WCSuccess); wc.Opcode != uverbs.WCCompSwap {
				t.Errorf("cmp-swap completion %+v", wc)
			}
			if le64(res) != 1023 || le64(target) != 0xfeedface {
				t.Fatalf("CMP_AND_SWP hit: returned %d, target %#x", le64(res), le64(target))
			}
			a.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRAtomicCmpAndSwp, Flags: uverbs.SendSignaled,
				SGL: []uverbs.SGE{a.mr.SGE(128, 8)}, RemoteAddr: b.addr(64), RKey: b.mr.RKey(), CompareAdd: 1, Swap: 2})
			a.wait1(3, uverbs.WCSuccess)
			if le64(res) != 0xfeedface || le64(target) != 0xfeedface {
				t.Fatalf("CMP_AND_SWP miss: returned %#x, target %#x", le64(res), le64(target))
			}
			// Misaligned atomics are refused before they reach the queue.
			if _, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRAtomicFetchAndAdd, SGL: []uverbs.SGE{a.mr.SGE(128, 8)}, RemoteAddr: b.addr(65), RKey: b.mr.RKey()}}); !errors.Is(err, uverbs.ErrInvalidWR) {
				t.Errorf("misaligned atomic: %v", err)
			}
		})
	}
}

func TestRCInlineAndMultiSGE(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 1<<20, nil)
			max := int(a.qp.Caps().MaxInlineData)
			if max < 128 {
				t.Fatalf("max inline %d < requested 128", max)
			}
			// Inline: the payload is copied at post time; the lkey is not used
			// and the source may be overwritten right after posting.
			for i, n := range []int{1, 17, max} {
				src := a.buf()[4096 : 4096+n]
				fill(src, uint64(n))
				want := bytes.Clone(src)
				b.postRecv(uint64(200+i), b.mr.SGE(b.recvOff(), n))
				a.postSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled | uverbs.SendInline,
					SGL: []uverbs.SGE{{Addr: a.addr(4096), Length: uint32(n), LKey: 0}}})
				clear(src)
				a.wait1(uint64(i), uverbs.WCSuccess)
				if rc := b.wait1(uint64(200+i), uverbs.WCSuccess); rc.ByteLen != uint32(n) {
					t.Errorf("inline receive %+v", rc)
				}
				if !bytes.Equal(want, b.buf()[b.recvOff():b.recvOff()+n]) {
					t.Fatalf("inline SEND of %d bytes: data differs", n)
				}
			}
			if _, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: []uverbs.SGE{a.mr.SGE(0, max+1)}}}); !errors.Is(err, uverbs.ErrInlineTooLarge) {
				t.Errorf("oversized inline: %v", err)
			}
			// Inline RDMA WRITE from two SGEs.
			fill(a.buf()[:64], 99)
			a.postSend(uverbs.SendWR{ID: 9, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled | uverbs.SendInline,
				SGL: []uverbs.SGE{a.mr.SGE(0, 10), a.mr.SGE(32, 20)}, RemoteAddr: b.addr(b.recvOff() + 1000), RKey: b.mr.RKey()})
			a.wait1(9, uverbs.WCSuccess)
			got := b.buf()[b.recvOff()+1000 : b.recvOff()+1030]
			if !bytes.Equal(got, append(bytes.Clone(a.buf()[:10]), a.buf()[32:52]...)) {
				t.Fatal("inline two-SGE RDMA WRITE: data differs")
			}
			// Gather from 3 SGEs, scatter into 2.
			fill(a.buf()[:3000], 7)
			gather := [][2]int{{0, 1000}, {1500, 700}, {2900, 100}}
			var want []byte
			var sgl []uverbs.SGE
			for _, g := range gather {
				want = append(want, a.buf()[g[0]:g[0]+g[1]]...)
				sgl = append(sgl, a.mr.SGE(g[0], g[1]))
			}
			r := b.recvOff()
			clear(b.buf()[r : r+8192])
			b.postRecv(300, b.mr.SGE(r, 500), b.mr.SGE(r+4096, 4000))
			a.postSend(uverbs.SendWR{ID: 10, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: sgl})
			a.wait1(10, uverbs.WCSuccess)
			if rc := b.wait1(300, uverbs.WCSuccess); rc.ByteLen != 1800 {
				t.Errorf("multi-SGE receive %+v", rc)
			}
			got = append(bytes.Clone(b.buf()[r:r+500]), b.buf()[r+4096:r+4096+1300]...)
			if !bytes.Equal(got, want) {
				t.Fatal("multi-SGE SEND: data differs")
			}
			if _, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: make([]uverbs.SGE, a.qp.Caps().MaxSendSGE+1)}}); !errors.Is(err, uverbs.ErrTooManySGE) {
				t.Errorf("too many SGEs: %v", err)
			}
		})
	}
}

// TestRCUnsignaled: only signaled sends complete; a batch is posted with one
// kick, and the ring wraps many times.
func TestRCUnsignaled(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 1<<16, nil)
			wrs := make([]uverbs.SendWR, 16)
			for round := 0; round < 12; round++ { // 192 WRs through a 64+ slot ring
				for i := range wrs {
					wrs[i] = uverbs.SendWR{ID: uint64(round*100 + i), Opcode: uverbs.WRRDMAWrite,
						SGL: []uverbs.SGE{a.mr.SGE(8*i, 8)}, RemoteAddr: b.addr(8 * i), RKey: b.mr.RKey()}
					put64(a.buf()[8*i:], uint64(round*1000+i))
				}
				wrs[len(wrs)-1].Flags = uverbs.SendSignaled
				if n, err := a.qp.PostSend(wrs); err != nil || n != len(wrs) {
					t.Fatalf("post batch: %d %v", n, err)
				}
				a.wait1(uint64(round*100+len(wrs)-1), uverbs.WCSuccess)
				var extra [4]uverbs.WC
				if n, _ := a.cq.Poll(extra[:]); n != 0 {
					t.Fatalf("unsignaled WRs produced %d completions: %+v", n, extra[:n])
				}
				for i := range wrs {
					if got := le64(b.buf()[8*i:]); got != uint64(round*1000+i) {
						t.Fatalf("round %d word %d = %d", round, i, got)
					}
				}
			}
		})
	}
}

func TestRCErrors(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			t.Run("bad-lkey", func(t *testing.T) {
				a, b := pair(t, tp, 1<<16, nil)
				sge := a.mr.SGE(0, 64)
				sge.LKey ^= 0x55
				a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{sge}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
				wc := a.wait(1)[0]
				// The status is kernel-dependent: 6.1's rxe reports a local
				// protection (or QP operation) error; 6.12's moves the QP to
				// the error state first and completes the WR as flushed. Any
				// of them is a failed WR; success or another status is not.
				switch wc.Status {
				case uverbs.WCLocProtErr, uverbs.WCLocQPOpErr, uverbs.WCWRFlushErr:
				default:
					t.Fatalf("bad lkey: %+v (%s), want a local protection, QP operation or flush error", wc, wc.Status)
				}
				if wc.ID != 1 {
					t.Fatalf("bad lkey: completion for WR %d, want 1", wc.ID)
				}
				t.Logf("bad lkey -> %s", wc.Status)
			})
			t.Run("bad-rkey", func(t *testing.T) {
				a, b := pair(t, tp, 1<<16, nil)
				a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey() ^ 0x5500})
				a.wait1(2, uverbs.WCRemAccessErr)
				// Out of range with the right key is a remote access error too.
				a2, b2 := pair(t, tp, 1<<16, nil)
				a2.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a2.mr.SGE(0, 64)}, RemoteAddr: b2.addr(b2.mr.Len() - 8), RKey: b2.mr.RKey()})
				a2.wait1(3, uverbs.WCRemAccessErr)
			})
			t.Run("mr-access", func(t *testing.T) {
				a, b := pair(t, tp, 1<<16, nil)
				ro, err := b.pd.AllocMR(4096, uverbs.AccessLocalWrite|uverbs.AccessRemoteRead)
				if err != nil {
					t.Fatal(err)
				}
				defer ro.Close()
				// Reading a read-only region works; writing it is a remote access error.
				a.postSend(uverbs.SendWR{ID: 4, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
				a.wait1(4, uverbs.WCSuccess)
				a.postSend(uverbs.SendWR{ID: 5, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
				a.wait1(5, uverbs.WCRemAccessErr)
			})
			t.Run("rnr-retry", func(t *testing.T) {
				// No receive posted and a bounded RNR retry count: the SEND fails.
				a, _ := pair(t, tp, 1<<16, func(c *uverbs.ConnectConfig) { c.RNRRetry = 1; c.MinRNRTimer = 1 })
				a.postSend(uverbs.SendWR{ID: 6, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}})
				a.wait1(6, uverbs.WCRNRRetryExcErr)
			})
			t.Run("flush-on-err", func(t *testing.T) {
				a, _ := pair(t, tp, 1<<16, nil)
				const n = 5
				for i := 0; i < n; i++ {
					a.postRecv(uint64(10+i), a.mr.SGE(64*i, 64))
				}
				if err := a.qp.ToErr(); err != nil {
					t.Fatal(err)
				}
				// Sends posted in ERR flush too (the kick runs the flush).
				a.postSend(uverbs.SendWR{ID: 99, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.mr.SGE(0, 8)}})
				got := map[uint64]bool{}
				for _, wc := range a.wait(n + 1) {
					if wc.Status != uverbs.WCWRFlushErr {
						t.Errorf("flushed WR %d: %s", wc.ID, wc.Status)
					}
					got[wc.ID] = true
				}
				for _, id := range []uint64{10, 11, 12, 13, 14, 99} {
					if !got[id] {
						t.Errorf("WR %d not flushed (got %v)", id, got)
					}
				}
			})
			t.Run("peer-gone", func(t *testing.T) {
				a, b := pair(t, tp, 1<<16, func(c *uverbs.ConnectConfig) { c.Timeout = 8; c.RetryCnt = 2 })
				if err := b.qp.Close(); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				a.postSend(uverbs.SendWR{ID: 7, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
				a.postSend(uverbs.SendWR{ID: 8, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.mr.SGE(0, 8)}})
				a.wait1(7, uverbs.WCRetryExcErr)
				a.wait1(8, uverbs.WCWRFlushErr)
				t.Logf("retry exceeded after %v", time.Since(start))
			})
			t.Run("post-not-rts", func(t *testing.T) {
				s := newSide(t, tp.a, 4096)
				if _, err := s.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend}}); !errors.Is(err, uverbs.ErrQPState) {
					t.Errorf("post in RESET: %v", err)
				}
				if err := s.qp.ToInit(1, 0); err != nil {
					t.Fatal(err)
				}
				if _, err := s.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend}}); !errors.Is(err, uverbs.ErrQPState) {
					t.Errorf("post in INIT: %v", err)
				}
			})
		})
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

// TestDataPathAllocs: post and poll allocate nothing, on the real device.
func TestDataPathAllocs(t *testing.T) {
	topo := srenv.Require(t)
	a, b := pair(t, topology{"lo", topo.Lo, topo.Lo}, 1<<16, nil)
	send := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}}
	recv := []uverbs.RecvWR{{ID: 2, SGL: []uverbs.SGE{b.mr.SGE(128, 64)}}}
	wc := make([]uverbs.WC, 4)
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := a.qp.PostSend(send); err != nil {
			panic(err)
		}
		for got := 0; got == 0; {
			n, err := a.cq.Poll(wc)
			if err != nil || (n > 0 && wc[0].Status != uverbs.WCSuccess) {
				panic(err)
			}
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("PostSend+Poll: %v allocations per run", allocs)
	}
	allocs = testing.AllocsPerRun(20, func() {
		if _, err := b.qp.PostRecv(recv); err != nil {
			panic(err)
		}
	})
	if allocs != 0 {
		t.Errorf("PostRecv: %v allocations per run", allocs)
	}
	allocs = testing.AllocsPerRun(50, func() {
		if _, err := a.cq.Poll(wc); err != nil {
			panic(err)
		}
	})
	if allocs != 0 {
		t.Errorf("empty Poll: %v allocations per run", allocs)
	}
}

// TestCompletionEvents: an armed CQ raises one event for the next completion
// (woken through the channel, not by polling); a solicited-only arm ignores
// unsolicited completions.
func TestCompletionEvents(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := pair(t, tp, 1<<16, nil)
			send := func(id uint64, flags uverbs.SendFlags) {
				a.postSend(uverbs.SendWR{ID: id, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled | flags, SGL: []uverbs.SGE{a.mr.SGE(0, 16)}})
				a.wait1(id, uverbs.WCSuccess)
			}
			waitEvent := func(d time.Duration) (*uverbs.CQ, error) {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				return b.ch.Wait(ctx)
			}
			// Next-completion arm: the event names b's CQ.
			b.postRecv(1, b.mr.SGE(0, 64))
			if err := b.cq.ReqNotify(false); err != nil {
				t.Fatal(err)
			}
			got := make(chan *uverbs.CQ, 1)
			go func() {
				cq, err := waitEvent(20 * time.Second)
				if err != nil {
					t.Error(err)
				}
				got <- cq
			}()
			send(10, 0)
			if cq := <-got; cq != b.cq {
				t.Fatalf("event for %v, want b's CQ", cq)
			}
			b.wait1(1, uverbs.WCSuccess)
			before := b.cq.CompEvents()
			// Solicited-only arm: an unsolicited SEND completes without an event ...
			b.postRecv(2, b.mr.SGE(0, 64))
			b.postRecv(3, b.mr.SGE(0, 64))
			if err := b.cq.ReqNotify(true); err != nil {
				t.Fatal(err)
			}
			send(11, 0)
			// Poll only: CQ.Wait could re-arm the CQ for any completion.
			if wc := b.pollOnly(); wc.ID != 2 || wc.Status != uverbs.WCSuccess {
				t.Fatalf("receive %+v", wc)
			}
			if cq, err := waitEvent(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("event %v / %v for an unsolicited completion under a solicited-only arm", cq, err)
			}
			// ... and a solicited one raises it.
			send(12, uverbs.SendSolicited)
			if cq, err := waitEvent(20 * time.Second); err != nil || cq != b.cq {
				t.Fatalf("solicited completion: event %v, %v", cq, err)
			}
			if wc := b.pollOnly(); wc.ID != 3 || wc.Status != uverbs.WCSuccess {
				t.Fatalf("receive %+v", wc)
			}
			if n := b.cq.CompEvents() - before; n != 1 {
				t.Errorf("%d completion events counted, want 1", n)
			}
		})
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
