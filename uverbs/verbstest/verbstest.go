// Package verbstest is a provider-neutral conformance suite for the verbs
// data path: it runs the same RC checks (SEND/RECV with and without
// immediate, RDMA WRITE/READ, atomics, inline data, multi-SGE gather and
// scatter, unsignaled runs across ring wrap, error statuses, local and
// remote protection, a vanished peer, posting before RTS, queue limits,
// completion events (next and solicited-only arms), zero allocations, no
// stale completion matched to work posted after a RESET) against any uverbs
// provider on real devices. The rxe provider's tests run it in the
// Soft-RoCE guest (across a rail and on the loopback device, messages up to
// 8 MiB); the mlx5 hardware tier runs it on ConnectX.
package verbstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmago/te/uverbs"
)

// Device names one RDMA device port and the GID index to use on it.
// InfiniBand ports are addressed by LID and need no GID.
type Device struct {
	Name     string
	Port     uint8 // default 1
	GIDIndex int   // RoCE v2 GID to use as source (RoCE links)
}

// Target is what Run tests: two devices that can reach each other (or the
// same device twice, for loopback), opened with Options.
type Target struct {
	A, B    Device
	Options *uverbs.Options
	// MaxMsg bounds message sizes (default 1 MiB).
	MaxMsg int
}

// side is one end of an RC connection.
type side struct {
	t   testing.TB
	dev Device
	ctx *uverbs.Context
	pd  *uverbs.PD
	ch  *uverbs.CompChannel
	cq  *uverbs.CQ
	qp  *uverbs.QP
	mr  *uverbs.MR
	gid uverbs.GID
	psn uverbs.PSN
	ib  bool // InfiniBand link layer: LID routing
}

const (
	qpDepth   = 64
	maxInline = 128
)

func newSide(t testing.TB, tg Target, d Device, bufSize int) *side {
	t.Helper()
	if d.Port == 0 {
		d.Port = 1
	}
	s := &side{t: t, dev: d}
	var err error
	if s.ctx, err = uverbs.Open(d.Name, tg.Options); err != nil {
		t.Fatalf("open %s: %v", d.Name, err)
	}
	t.Cleanup(func() {
		if err := s.ctx.Close(); err != nil {
			t.Errorf("%s: context close: %v", d.Name, err)
		}
	})
	pa, err := s.ctx.QueryPort(d.Port)
	if err != nil {
		t.Fatal(err)
	}
	s.ib = pa.LinkLayer == uverbs.LinkLayerInfiniBand
	if !s.ib {
		ents, err := s.ctx.QueryGIDTable()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range ents {
			if e.Port == int(d.Port) && e.Index == d.GIDIndex {
				s.gid, found = e.GID, true
			}
		}
		if !found {
			t.Fatalf("%s port %d has no GID %d", d.Name, d.Port, d.GIDIndex)
		}
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = s.ctx.CreateCQ(uverbs.CQConfig{Entries: 4 * qpDepth, Channel: s.ch}); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.AllocMR(bufSize, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead|uverbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if s.qp, err = s.pd.CreateQP(uverbs.QPConfig{SendCQ: s.cq, RecvCQ: s.cq,
		Caps: uverbs.QPCaps{MaxSendWR: qpDepth, MaxRecvWR: qpDepth, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: maxInline}}); err != nil {
		t.Fatal(err)
	}
	s.psn = uverbs.PSN(rand.Uint32() & 0xffffff)
	t.Cleanup(s.close)
	return s
}

// close releases everything in order, twice, to prove Close is idempotent.
func (s *side) close() {
	for range 2 {
		for _, c := range []interface{ Close() error }{s.qp, s.cq, s.ch, s.mr, s.pd} {
			if err := c.Close(); err != nil {
				s.t.Errorf("%s: close %T: %v", s.dev.Name, c, err)
			}
		}
	}
}

// endpoint describes s for its peer as it would travel out of band: through
// MarshalBinary and UnmarshalBinary (with the LID on InfiniBand).
func (s *side) endpoint() uverbs.Endpoint {
	s.t.Helper()
	e, err := s.qp.LocalEndpoint(s.dev.Port, s.gid, s.psn)
	if err != nil {
		s.t.Fatal(err)
	}
	if s.ib != (e.LID != 0) {
		s.t.Fatalf("%s: endpoint %+v on a port with InfiniBand=%v", s.dev.Name, e, s.ib)
	}
	b, err := e.MarshalBinary()
	if err != nil {
		s.t.Fatal(err)
	}
	var got uverbs.Endpoint
	if err := got.UnmarshalBinary(b); err != nil || got != e {
		s.t.Fatalf("%s: endpoint round trip %+v -> %+v: %v", s.dev.Name, e, got, err)
	}
	return got
}

// connect brings the QP to RTS against peer; Connect picks the path by the
// port's link layer (GID and GRH on RoCE, LID on InfiniBand).
func (s *side) connect(peer *side, tweak func(*uverbs.ConnectConfig)) {
	s.t.Helper()
	cfg := uverbs.ConnectConfig{Port: s.dev.Port, SGIDIndex: uint8(s.dev.GIDIndex), LocalPSN: s.psn, Remote: peer.endpoint()}
	if tweak != nil {
		tweak(&cfg)
	}
	if err := s.qp.Connect(cfg); err != nil {
		s.t.Fatalf("%s: connect: %v", s.dev.Name, err)
	}
}

func (s *side) buf() []byte         { return s.mr.Bytes() }
func (s *side) half() int           { return s.mr.Len() / 2 }
func (s *side) addr(off int) uint64 { return s.mr.Addr() + uint64(off) }

// wait collects n completions within a deadline.
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

func (s *side) wait1(id uint64, st uverbs.WCStatus) uverbs.WC {
	s.t.Helper()
	wc := s.wait(1)[0]
	if wc.ID != id || wc.Status != st {
		s.t.Fatalf("%s: completion %+v (%s), want ID %d %s", s.dev.Name, wc, wc.Status, id, st)
	}
	return wc
}

// quiet checks that no completion arrives for a short while.
func (s *side) quiet() {
	s.t.Helper()
	var wc [4]uverbs.WC
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n, _ := s.cq.Poll(wc[:]); n > 0 {
			s.t.Fatalf("%s: unexpected completion %+v", s.dev.Name, wc[:n])
		}
		time.Sleep(time.Millisecond)
	}
}

// pollOne busy-polls (never arms the CQ) for one completion.
func (s *side) pollOne() uverbs.WC {
	s.t.Helper()
	var wc [1]uverbs.WC
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		n, err := s.cq.Poll(wc[:])
		if err != nil {
			s.t.Fatalf("%s: poll: %v", s.dev.Name, err)
		}
		if n == 1 {
			return wc[0]
		}
	}
	s.t.Fatalf("%s: no completion", s.dev.Name)
	return uverbs.WC{}
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

func pair(t testing.TB, tg Target, bufSize int, tweak func(*uverbs.ConnectConfig)) (*side, *side) {
	a := newSide(t, tg, tg.A, bufSize)
	b := newSide(t, tg, tg.B, bufSize)
	a.connect(b, tweak)
	b.connect(a, tweak)
	return a, b
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// Run runs the whole suite against tg.
func Run(t *testing.T, tg Target) {
	if tg.MaxMsg == 0 {
		tg.MaxMsg = 1 << 20
	}
	for _, c := range []struct {
		name string
		f    func(*testing.T, Target)
	}{
		{"SendRecv", testSendRecv},
		{"WriteRead", testWriteRead},
		{"Atomics", testAtomics},
		{"InlineAndSGL", testInlineAndSGL},
		{"UnsignaledWrap", testUnsignaledWrap},
		{"Errors", testErrors},
		{"Access", testAccess},
		{"PeerGone", testPeerGone},
		{"PostState", testPostState},
		{"Limits", testLimits},
		{"Events", testEvents},
		{"Allocs", testAllocs},
		{"ResetReuse", testResetReuse},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, tg) })
	}
}

func testSendRecv(t *testing.T, tg Target) {
	a, b := pair(t, tg, 2*tg.MaxMsg+8192, nil) // receives are one byte longer
	for i, n := range []int{1, 63, 4096, 65537, tg.MaxMsg} {
		fill(a.buf()[:n], uint64(i))
		clear(b.buf()[b.half() : b.half()+n+1])
		b.postRecv(uint64(100+i), b.mr.SGE(b.half(), n+1))
		wr := uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, n)}}
		if i%2 == 1 {
			wr.Opcode, wr.Imm = uverbs.WRSendWithImm, 0xc0ffee00+uint32(i)
		}
		a.postSend(wr)
		s := a.wait1(uint64(i), uverbs.WCSuccess)
		if s.Opcode != uverbs.WCSend || s.QPN != a.qp.QPN() {
			t.Fatalf("send completion %+v", s)
		}
		r := b.wait1(uint64(100+i), uverbs.WCSuccess)
		// (SrcQP is defined for UD only; RC providers may leave it 0.)
		if r.Opcode != uverbs.WCRecv || r.ByteLen != uint32(n) || r.QPN != b.qp.QPN() {
			t.Fatalf("size %d: receive completion %+v", n, r)
		}
		if wr.Opcode == uverbs.WRSendWithImm && (r.Flags&uverbs.WCFlagWithImm == 0 || r.Imm != wr.Imm) {
			t.Fatalf("size %d: immediate %#x flags %v, want %#x", n, r.Imm, r.Flags, wr.Imm)
		}
		if wr.Opcode == uverbs.WRSend && r.Flags&uverbs.WCFlagWithImm != 0 {
			t.Fatalf("size %d: WITH_IMM on a plain SEND", n)
		}
		if !bytes.Equal(a.buf()[:n], b.buf()[b.half():b.half()+n]) || b.buf()[b.half()+n] != 0 {
			t.Fatalf("size %d: payload differs", n)
		}
	}
}

func testWriteRead(t *testing.T, tg Target) {
	a, b := pair(t, tg, 2*tg.MaxMsg, nil)
	for i, n := range []int{1, 4095, 65536, tg.MaxMsg} {
		fill(a.buf()[:n], uint64(10+i))
		a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, n)}, RemoteAddr: b.addr(b.half()), RKey: b.mr.RKey()})
		if wc := a.wait1(1, uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMAWrite {
			t.Fatalf("write completion %+v", wc)
		}
		if !bytes.Equal(a.buf()[:n], b.buf()[b.half():b.half()+n]) {
			t.Fatalf("WRITE of %d bytes: remote memory differs", n)
		}
		// READ it back into the other half of A.
		clear(a.buf()[a.half() : a.half()+n])
		a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(a.half(), n)}, RemoteAddr: b.addr(b.half()), RKey: b.mr.RKey()})
		if wc := a.wait1(2, uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMARead || wc.ByteLen != uint32(n) {
			t.Fatalf("read completion %+v", wc)
		}
		if !bytes.Equal(a.buf()[:n], a.buf()[a.half():a.half()+n]) {
			t.Fatalf("READ of %d bytes: local memory differs", n)
		}
	}
	// WRITE with immediate consumes a receive and reports the immediate.
	b.postRecv(77)
	fill(a.buf()[:100], 99)
	a.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMAWriteWithImm, Flags: uverbs.SendSignaled, Imm: 0x12345678,
		SGL: []uverbs.SGE{a.mr.SGE(0, 100)}, RemoteAddr: b.addr(8), RKey: b.mr.RKey()})
	a.wait1(3, uverbs.WCSuccess)
	r := b.wait1(77, uverbs.WCSuccess)
	if r.Opcode != uverbs.WCRecvRDMAWithImm || r.Flags&uverbs.WCFlagWithImm == 0 || r.Imm != 0x12345678 || r.ByteLen != 100 {
		t.Fatalf("WRITE_WITH_IMM receive %+v", r)
	}
	if !bytes.Equal(a.buf()[:100], b.buf()[8:108]) {
		t.Fatal("WRITE_WITH_IMM payload differs")
	}
}

func testAtomics(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, nil)
	le := binary.LittleEndian
	le.PutUint64(b.buf()[64:], 1000)
	// FETCH_ADD returns the old value and adds.
	a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRAtomicFetchAndAdd, Flags: uverbs.SendSignaled, CompareAdd: 5,
		SGL: []uverbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.addr(64), RKey: b.mr.RKey()})
	if wc := a.wait1(1, uverbs.WCSuccess); wc.Opcode != uverbs.WCFetchAdd {
		t.Fatalf("fetch-add completion %+v", wc)
	}
	if old, now := le.Uint64(a.buf()), le.Uint64(b.buf()[64:]); old != 1000 || now != 1005 {
		t.Fatalf("FETCH_ADD: old %d new %d", old, now)
	}
	// CMP_AND_SWP that matches swaps; one that does not leaves memory alone.
	for i, c := range []struct{ cmp, swap, wantOld, wantNow uint64 }{{1005, 7, 1005, 7}, {1005, 9, 7, 7}} {
		a.postSend(uverbs.SendWR{ID: uint64(2 + i), Opcode: uverbs.WRAtomicCmpAndSwp, Flags: uverbs.SendSignaled, CompareAdd: c.cmp, Swap: c.swap,
			SGL: []uverbs.SGE{a.mr.SGE(8, 8)}, RemoteAddr: b.addr(64), RKey: b.mr.RKey()})
		if wc := a.wait1(uint64(2+i), uverbs.WCSuccess); wc.Opcode != uverbs.WCCompSwap {
			t.Fatalf("cmp-swap completion %+v", wc)
		}
		if old, now := le.Uint64(a.buf()[8:]), le.Uint64(b.buf()[64:]); old != c.wantOld || now != c.wantNow {
			t.Fatalf("CMP_AND_SWP %d: old %d new %d, want %d %d", i, old, now, c.wantOld, c.wantNow)
		}
	}
	// A misaligned atomic is rejected at post time.
	_, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRAtomicFetchAndAdd, SGL: []uverbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.addr(65), RKey: b.mr.RKey()}})
	if !errors.Is(err, uverbs.ErrInvalidWR) {
		t.Fatalf("misaligned atomic: %v, want ErrInvalidWR", err)
	}
}

func testInlineAndSGL(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<20, nil)
	caps := a.qp.Caps()
	if caps.MaxInlineData < maxInline {
		t.Fatalf("asked for %d inline bytes, granted %d", maxInline, caps.MaxInlineData)
	}
	// Inline SEND from three pieces; the source is overwritten right after
	// the post, before completion, which inline makes legal.
	fill(a.buf()[:maxInline], 5)
	want := append([]byte{}, a.buf()[:maxInline]...)
	b.postRecv(1, b.mr.SGE(b.half(), 4096))
	a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled | uverbs.SendInline,
		SGL: []uverbs.SGE{a.mr.SGE(0, 10), a.mr.SGE(10, 50), a.mr.SGE(60, maxInline-60)}})
	clear(a.buf()[:maxInline])
	a.wait1(1, uverbs.WCSuccess)
	if r := b.wait1(1, uverbs.WCSuccess); r.ByteLen != maxInline || !bytes.Equal(b.buf()[b.half():b.half()+maxInline], want) {
		t.Fatalf("inline SEND: %+v", r)
	}
	// Inline RDMA WRITE.
	fill(a.buf()[:100], 6)
	want = append(want[:0], a.buf()[:100]...)
	a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled | uverbs.SendInline,
		SGL: []uverbs.SGE{a.mr.SGE(0, 100)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
	clear(a.buf()[:100])
	a.wait1(2, uverbs.WCSuccess)
	if !bytes.Equal(b.buf()[:100], want) {
		t.Fatal("inline WRITE payload differs")
	}
	// Gather 4 SGEs, scatter into 3 (one empty).
	fill(a.buf()[:4000], 7)
	b.postRecv(3, b.mr.SGE(b.half(), 1000), b.mr.SGE(b.half()+5000, 0), b.mr.SGE(b.half()+8192, 9000))
	a.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 1), a.mr.SGE(1, 999), a.mr.SGE(1000, 2000), a.mr.SGE(3000, 1000)}})
	a.wait1(3, uverbs.WCSuccess)
	if r := b.wait1(3, uverbs.WCSuccess); r.ByteLen != 4000 {
		t.Fatalf("scatter receive %+v", r)
	}
	got := append(append([]byte{}, b.buf()[b.half():b.half()+1000]...), b.buf()[b.half()+8192:b.half()+8192+3000]...)
	if !bytes.Equal(got, a.buf()[:4000]) {
		t.Fatal("gather/scatter payload differs")
	}
}

func testUnsignaledWrap(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<20, nil)
	// Many laps of the send queue with only every 16th request signaled:
	// completions must come in order and cover the gaps.
	const total = 40 * qpDepth
	var wrs [8]uverbs.SendWR
	signaled := 0
	for i := 0; i < total; {
		k := min(len(wrs), total-i)
		for j := range k {
			id := uint64(i + j)
			wrs[j] = uverbs.SendWR{ID: id, Opcode: uverbs.WRRDMAWrite, SGL: []uverbs.SGE{a.mr.SGE(int(id%1024)*8, 8)},
				RemoteAddr: b.addr(int(id%1024) * 8), RKey: b.mr.RKey()}
			if id%16 == 15 {
				wrs[j].Flags = uverbs.SendSignaled
			}
		}
		n, err := a.qp.PostSend(wrs[:k])
		if err != nil && !errors.Is(err, uverbs.ErrQueueFull) {
			t.Fatal(err)
		}
		i += n
		if n < k {
			wc := a.wait(1)[0]
			if wc.Status != uverbs.WCSuccess || wc.ID != uint64(signaled*16+15) {
				t.Fatalf("completion %+v, want ID %d", wc, signaled*16+15)
			}
			signaled++
		}
	}
	for signaled < total/16 {
		wc := a.wait(1)[0]
		if wc.Status != uverbs.WCSuccess || wc.ID != uint64(signaled*16+15) {
			t.Fatalf("completion %+v, want ID %d", wc, signaled*16+15)
		}
		signaled++
	}
	a.quiet()
}

func testErrors(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.RNRRetry = 1; c.MinRNRTimer = 1 })
	// A WRITE with a bad rkey fails remotely; the QP enters ERR and what
	// was posted after it is flushed.
	a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey() ^ 0x5a5a00})
	a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
	wcs := a.wait(2)
	if wcs[0].ID != 1 || wcs[0].Status != uverbs.WCRemAccessErr {
		t.Fatalf("bad rkey: %+v (%s), want REM_ACCESS_ERR", wcs[0], wcs[0].Status)
	}
	if wcs[1].ID != 2 || wcs[1].Status != uverbs.WCWRFlushErr {
		t.Fatalf("after error: %+v (%s), want WR_FLUSH_ERR", wcs[1], wcs[1].Status)
	}
	// Receives posted on a QP moved to ERR are flushed too.
	b.postRecv(10, b.mr.SGE(0, 64))
	b.postRecv(11, b.mr.SGE(64, 64))
	if err := b.qp.ToErr(); err != nil {
		t.Fatal(err)
	}
	for i, wc := range b.wait(2) {
		if wc.ID != uint64(10+i) || wc.Status != uverbs.WCWRFlushErr {
			t.Fatalf("flushed receive %+v (%s)", wc, wc.Status)
		}
	}
	// So are sends posted while it is in ERR.
	b.postSend(uverbs.SendWR{ID: 12, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{b.mr.SGE(0, 8)}})
	b.wait1(12, uverbs.WCWRFlushErr)
	// RNR: a SEND with no receive posted and rnr_retry 1 fails.
	c, d := pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.RNRRetry = 1; c.MinRNRTimer = 1 })
	c.postSend(uverbs.SendWR{ID: 5, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{c.mr.SGE(0, 8)}})
	c.wait1(5, uverbs.WCRNRRetryExcErr)
	_ = d
	// A receive buffer smaller than the message fails on both sides. The
	// receiver's status is the device's choice: ConnectX reports a local
	// length error, rxe (6.1) a local QP operation error.
	e, f := pair(t, tg, 1<<16, nil)
	f.postRecv(7, f.mr.SGE(0, 8))
	e.postSend(uverbs.SendWR{ID: 8, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{e.mr.SGE(0, 64)}})
	if wc := f.wait(1)[0]; wc.ID != 7 || (wc.Status != uverbs.WCLocLenErr && wc.Status != uverbs.WCLocQPOpErr) {
		t.Fatalf("short receive buffer: %+v (%s)", wc, wc.Status)
	}
	if wc := e.wait(1)[0]; wc.ID != 8 || wc.Status == uverbs.WCSuccess {
		t.Fatalf("SEND into a short receive buffer: %+v (%s)", wc, wc.Status)
	} else {
		t.Logf("sender of an overlong SEND: %s", wc.Status)
	}
}

// testAccess: local and remote protection. A bad lkey fails locally; a bad
// rkey, a range past the end of the remote region, and a WRITE to a region
// registered read-only fail remotely; READ of that region works.
func testAccess(t *testing.T, tg Target) {
	t.Run("bad-lkey", func(t *testing.T) {
		a, b := pair(t, tg, 1<<16, nil)
		sge := a.mr.SGE(0, 64)
		sge.LKey ^= 0x55
		a.postSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{sge}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
		wc := a.wait(1)[0]
		// The status is the device's choice: a local protection error
		// (ConnectX, rxe on 6.1), a QP operation error, or (rxe on 6.12,
		// which moves the QP to ERR first) a flush. Success is not.
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
		a, b := pair(t, tg, 1<<16, nil)
		a.postSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey() ^ 0x5500})
		a.wait1(2, uverbs.WCRemAccessErr)
	})
	t.Run("out-of-range", func(t *testing.T) {
		a, b := pair(t, tg, 1<<16, nil)
		a.postSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(b.mr.Len() - 8), RKey: b.mr.RKey()})
		a.wait1(3, uverbs.WCRemAccessErr)
	})
	t.Run("read-only-region", func(t *testing.T) {
		a, b := pair(t, tg, 1<<16, nil)
		ro, err := b.pd.AllocMR(4096, uverbs.AccessLocalWrite|uverbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		fill(ro.Bytes()[:64], 4)
		a.postSend(uverbs.SendWR{ID: 4, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
		a.wait1(4, uverbs.WCSuccess)
		if !bytes.Equal(a.buf()[:64], ro.Bytes()[:64]) {
			t.Fatal("READ of a read-only region: data differs")
		}
		a.postSend(uverbs.SendWR{ID: 5, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
		a.wait1(5, uverbs.WCRemAccessErr)
	})
}

// testPeerGone: with the peer's QP destroyed and a small retry count, a
// WRITE fails with RETRY_EXC_ERR within the transport timeout instead of
// hanging, and what was queued behind it is flushed.
func testPeerGone(t *testing.T, tg Target) {
	// Timeout 8 is 4.096 us << 8, about 1 ms per try; 3 tries.
	a, b := pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.Timeout = 8; c.RetryCnt = 2 })
	if err := b.qp.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a.postSend(uverbs.SendWR{ID: 7, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()})
	a.postSend(uverbs.SendWR{ID: 8, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.mr.SGE(0, 8)}})
	a.wait1(7, uverbs.WCRetryExcErr)
	a.wait1(8, uverbs.WCWRFlushErr)
	t.Logf("retry exceeded after %v", time.Since(start))
}

// testPostState: posting sends on a QP that is not yet in RTS (RESET, INIT)
// is refused with ErrQPState before anything reaches the queue.
func testPostState(t *testing.T, tg Target) {
	s := newSide(t, tg, tg.A, 4096)
	wr := []uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: []uverbs.SGE{s.mr.SGE(0, 8)}}}
	if _, err := s.qp.PostSend(wr); !errors.Is(err, uverbs.ErrQPState) {
		t.Fatalf("post in RESET: %v, want ErrQPState", err)
	}
	if err := s.qp.ToInit(s.dev.Port, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.qp.PostSend(wr); !errors.Is(err, uverbs.ErrQPState) {
		t.Fatalf("post in INIT: %v, want ErrQPState", err)
	}
}

func testLimits(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, nil)
	caps := a.qp.Caps()
	sge := a.mr.SGE(0, 8)
	// More SGEs than the QP was created with.
	many := make([]uverbs.SGE, caps.MaxSendSGE+1)
	for i := range many {
		many[i] = sge
	}
	if _, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: many}}); !errors.Is(err, uverbs.ErrTooManySGE) {
		t.Fatalf("too many send SGEs: %v", err)
	}
	rmany := make([]uverbs.SGE, a.qp.Caps().MaxRecvSGE+1)
	for i := range rmany {
		rmany[i] = sge
	}
	if _, err := a.qp.PostRecv([]uverbs.RecvWR{{SGL: rmany}}); !errors.Is(err, uverbs.ErrTooManySGE) {
		t.Fatalf("too many receive SGEs: %v", err)
	}
	// Inline data over the limit.
	if _, err := a.qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, Flags: uverbs.SendInline,
		SGL: []uverbs.SGE{a.mr.SGE(0, int(caps.MaxInlineData)+1)}}}); !errors.Is(err, uverbs.ErrInlineTooLarge) {
		t.Fatalf("inline too large: %v", err)
	}
	// The receive queue takes at least MaxRecvWR requests (a provider may
	// round its ring up: rxe does), then refuses with ErrQueueFull, and a
	// batch reports how many went in.
	rwrs := make([]uverbs.RecvWR, 4*caps.MaxRecvWR+1)
	for i := range rwrs {
		rwrs[i] = uverbs.RecvWR{ID: uint64(i), SGL: []uverbs.SGE{b.mr.SGE(0, 8)}}
	}
	n, err := a.qp.PostRecv(rwrs)
	if n < int(caps.MaxRecvWR) || n == len(rwrs) || !errors.Is(err, uverbs.ErrQueueFull) {
		t.Fatalf("filling the receive queue: %d posted, %v (capacity %d)", n, err, caps.MaxRecvWR)
	}
	t.Logf("receive queue: %d requests fit (MaxRecvWR %d)", n, caps.MaxRecvWR)
	// Likewise the send queue (every request signaled; the CQ has room
	// for four queues' worth); once they complete it takes work again.
	swrs := make([]uverbs.SendWR, 4*caps.MaxSendWR+1)
	for i := range swrs {
		swrs[i] = uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{sge}, RemoteAddr: b.addr(0), RKey: b.mr.RKey()}
	}
	n, err = a.qp.PostSend(swrs)
	if n < int(caps.MaxSendWR) || n == len(swrs) || !errors.Is(err, uverbs.ErrQueueFull) {
		t.Fatalf("filling the send queue: %d posted, %v (capacity %d)", n, err, caps.MaxSendWR)
	}
	t.Logf("send queue: %d requests fit (MaxSendWR %d)", n, caps.MaxSendWR)
	for i, wc := range a.wait(n) {
		if wc.ID != uint64(i) || wc.Status != uverbs.WCSuccess {
			t.Fatalf("completion %d of a full queue: %+v (%s)", i, wc, wc.Status)
		}
	}
	a.quiet()
	if n, err := a.qp.PostSend(swrs[:1]); n != 1 || err != nil {
		t.Fatalf("after the queue drained: %d %v", n, err)
	}
	a.wait1(0, uverbs.WCSuccess)
}

func testEvents(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, nil)
	// Arm, then a completion raises exactly one event on the channel.
	for i := range 3 {
		if err := b.cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		b.postRecv(uint64(i), b.mr.SGE(0, 64))
		a.postSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}, Flags: uverbs.SendSolicited})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cq, err := b.ch.Wait(ctx)
		cancel()
		if err != nil || cq != b.cq {
			t.Fatalf("event %d: %v %v", i, cq, err)
		}
		var wc [2]uverbs.WC
		if n, err := b.cq.Poll(wc[:]); n != 1 || err != nil || wc[0].ID != uint64(i) {
			t.Fatalf("after event %d: %d %+v %v", i, n, wc[:n], err)
		}
	}
	if got := b.cq.CompEvents(); got != 3 {
		t.Fatalf("%d completion events, want 3", got)
	}
	// A solicited-only arm lets an unsolicited completion through without
	// an event, and raises one for the next solicited one.
	waitEvent := func(d time.Duration) (*uverbs.CQ, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return b.ch.Wait(ctx)
	}
	b.postRecv(10, b.mr.SGE(0, 64))
	b.postRecv(11, b.mr.SGE(0, 64))
	if err := b.cq.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	a.postSend(uverbs.SendWR{ID: 10, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.mr.SGE(0, 16)}})
	// Poll, never Wait: Wait could re-arm the CQ for any completion.
	if wc := b.pollOne(); wc.ID != 10 || wc.Status != uverbs.WCSuccess {
		t.Fatalf("unsolicited receive %+v", wc)
	}
	if cq, err := waitEvent(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("event %v / %v for an unsolicited completion under a solicited-only arm", cq, err)
	}
	a.postSend(uverbs.SendWR{ID: 11, Opcode: uverbs.WRSend, Flags: uverbs.SendSolicited, SGL: []uverbs.SGE{a.mr.SGE(0, 16)}})
	if cq, err := waitEvent(20 * time.Second); err != nil || cq != b.cq {
		t.Fatalf("solicited completion: event %v, %v", cq, err)
	}
	if wc := b.pollOne(); wc.ID != 11 || wc.Status != uverbs.WCSuccess {
		t.Fatalf("solicited receive %+v", wc)
	}
	if got := b.cq.CompEvents(); got != 4 {
		t.Fatalf("%d completion events, want 4", got)
	}
}

func testAllocs(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, nil)
	wr := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)},
		RemoteAddr: b.addr(0), RKey: b.mr.RKey()}}
	var wc [1]uverbs.WC
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for {
			if n, _ := a.cq.Poll(wc[:]); n == 1 {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per WRITE post+poll", allocs)
	}
	recv := []uverbs.RecvWR{{ID: 2, SGL: []uverbs.SGE{b.mr.SGE(128, 64)}}}
	if allocs := testing.AllocsPerRun(20, func() {
		if _, err := b.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per PostRecv", allocs)
	}
	if allocs := testing.AllocsPerRun(200, func() {
		if _, err := a.cq.Poll(wc[:]); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per empty Poll", allocs)
	}
}

// testResetReuse: completions left unpolled when a QP is reset never
// complete work posted after it. A's WRITEs complete but are not polled;
// both QPs go to RESET and reconnect; A then SENDs to B, which has no
// receive posted, so the SEND waits in RNR retries: meanwhile no completion
// may carry its ID (a provider that matched a stale completion to the new
// work request, whose queue counters restarted at RESET, would report it
// done). The old WRITEs' completions may be delivered with their own IDs
// (rxe keeps them) or dropped (mlx5 cleans them), never anything else.
func testResetReuse(t *testing.T, tg Target) {
	a, b := pair(t, tg, 1<<16, nil)
	const writes, chunk = 3, 1024
	fill(a.buf()[:writes*chunk], 5)
	for i := range writes {
		a.postSend(uverbs.SendWR{ID: uint64(100 + i), Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.mr.SGE(i*chunk, chunk)}, RemoteAddr: b.addr(i * chunk), RKey: b.mr.RKey()})
	}
	// The data landing at B (A's CQ untouched) says the WRITEs ran; the
	// pause lets their completions reach A's CQ. Either way a correct
	// provider passes: timing only decides whether stale CQEs exist.
	deadline := time.Now().Add(30 * time.Second)
	for !bytes.Equal(a.buf()[:writes*chunk], b.buf()[:writes*chunk]) {
		if time.Now().After(deadline) {
			t.Fatal("the WRITEs never landed")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	for _, s := range []*side{a, b} {
		if err := s.qp.ToReset(); err != nil {
			t.Fatalf("%s: to RESET: %v", s.dev.Name, err)
		}
	}
	a.connect(b, nil)
	b.connect(a, nil)

	seen := map[uint64]bool{}
	check := func(wc uverbs.WC) {
		t.Helper()
		if wc.ID < 100 || wc.ID >= 100+writes || seen[wc.ID] {
			t.Fatalf("completion %+v after RESET: neither the SEND nor a first report of an old WRITE", wc)
		}
		seen[wc.ID] = true
	}
	const sendID = 300
	a.postSend(uverbs.SendWR{ID: sendID, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.mr.SGE(0, 64)}})
	wcs := make([]uverbs.WC, 8)
	for until := time.Now().Add(200 * time.Millisecond); time.Now().Before(until); time.Sleep(time.Millisecond) {
		n, err := a.cq.Poll(wcs)
		if err != nil {
			t.Fatalf("%s: poll: %v", a.dev.Name, err)
		}
		for _, wc := range wcs[:n] {
			if wc.ID == sendID {
				t.Fatalf("%s: the SEND completed (%+v) while its peer had no receive posted: a stale completion was matched to it", a.dev.Name, wc)
			}
			check(wc)
		}
	}
	b.postRecv(400, b.mr.SGE(b.half(), 64))
	for {
		wc := a.wait(1)[0]
		if wc.ID != sendID {
			check(wc)
			continue
		}
		if wc.Status != uverbs.WCSuccess || wc.Opcode != uverbs.WCSend {
			t.Fatalf("SEND after RESET: %+v", wc)
		}
		break
	}
	if r := b.wait1(400, uverbs.WCSuccess); r.ByteLen != 64 || !bytes.Equal(b.buf()[b.half():b.half()+64], a.buf()[:64]) {
		t.Fatalf("receive after RESET %+v, or its payload differs", r)
	}
	t.Logf("%s: %d of the %d WRITE completions left at RESET were reported after it", a.dev.Name, len(seen), writes)
}
