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
	"fmt"
	"math/rand/v2"
	"strings"
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
	a, b := Pair(t, tg, 2*tg.MaxMsg+8192, nil) // receives are one byte longer
	for i, n := range []int{1, 63, 4096, 65537, tg.MaxMsg} {
		fill(a.Buf()[:n], uint64(i))
		clear(b.Buf()[b.Half() : b.Half()+n+1])
		b.PostRecv(uint64(100+i), b.MR.SGE(b.Half(), n+1))
		wr := uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.MR.SGE(0, n)}}
		if i%2 == 1 {
			wr.Opcode, wr.Imm = uverbs.WRSendWithImm, 0xc0ffee00+uint32(i)
		}
		a.PostSend(wr)
		s := a.Wait1(uint64(i), uverbs.WCSuccess)
		if s.Opcode != uverbs.WCSend || s.QPN != a.QP.QPN() {
			t.Fatalf("send completion %+v", s)
		}
		r := b.Wait1(uint64(100+i), uverbs.WCSuccess)
		// (SrcQP is defined for UD only; RC providers may leave it 0.)
		if r.Opcode != uverbs.WCRecv || r.ByteLen != uint32(n) || r.QPN != b.QP.QPN() {
			t.Fatalf("size %d: receive completion %+v", n, r)
		}
		if wr.Opcode == uverbs.WRSendWithImm && (r.Flags&uverbs.WCFlagWithImm == 0 || r.Imm != wr.Imm) {
			t.Fatalf("size %d: immediate %#x flags %v, want %#x", n, r.Imm, r.Flags, wr.Imm)
		}
		if wr.Opcode == uverbs.WRSend && r.Flags&uverbs.WCFlagWithImm != 0 {
			t.Fatalf("size %d: WITH_IMM on a plain SEND", n)
		}
		if !bytes.Equal(a.Buf()[:n], b.Buf()[b.Half():b.Half()+n]) || b.Buf()[b.Half()+n] != 0 {
			t.Fatalf("size %d: payload differs", n)
		}
	}
}

func testWriteRead(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 2*tg.MaxMsg, nil)
	for i, n := range []int{1, 4095, 65536, tg.MaxMsg} {
		fill(a.Buf()[:n], uint64(10+i))
		a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(0, n)}, RemoteAddr: b.Addr(b.Half()), RKey: b.MR.RKey()})
		if wc := a.Wait1(1, uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMAWrite {
			t.Fatalf("write completion %+v", wc)
		}
		if !bytes.Equal(a.Buf()[:n], b.Buf()[b.Half():b.Half()+n]) {
			t.Fatalf("WRITE of %d bytes: remote memory differs", n)
		}
		// READ it back into the other half of A.
		clear(a.Buf()[a.Half() : a.Half()+n])
		a.PostSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(a.Half(), n)}, RemoteAddr: b.Addr(b.Half()), RKey: b.MR.RKey()})
		if wc := a.Wait1(2, uverbs.WCSuccess); wc.Opcode != uverbs.WCRDMARead || wc.ByteLen != uint32(n) {
			t.Fatalf("read completion %+v", wc)
		}
		if !bytes.Equal(a.Buf()[:n], a.Buf()[a.Half():a.Half()+n]) {
			t.Fatalf("READ of %d bytes: local memory differs", n)
		}
	}
	// WRITE with immediate consumes a receive and reports the immediate.
	b.PostRecv(77)
	fill(a.Buf()[:100], 99)
	a.PostSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMAWriteWithImm, Flags: uverbs.SendSignaled, Imm: 0x12345678,
		SGL: []uverbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.Addr(8), RKey: b.MR.RKey()})
	a.Wait1(3, uverbs.WCSuccess)
	r := b.Wait1(77, uverbs.WCSuccess)
	if r.Opcode != uverbs.WCRecvRDMAWithImm || r.Flags&uverbs.WCFlagWithImm == 0 || r.Imm != 0x12345678 || r.ByteLen != 100 {
		t.Fatalf("WRITE_WITH_IMM receive %+v", r)
	}
	if !bytes.Equal(a.Buf()[:100], b.Buf()[8:108]) {
		t.Fatal("WRITE_WITH_IMM payload differs")
	}
}

func testAtomics(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<16, nil)
	le := binary.LittleEndian
	le.PutUint64(b.Buf()[64:], 1000)
	// FETCH_ADD returns the old value and adds.
	a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRAtomicFetchAndAdd, Flags: uverbs.SendSignaled, CompareAdd: 5,
		SGL: []uverbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.Addr(64), RKey: b.MR.RKey()})
	if wc := a.Wait1(1, uverbs.WCSuccess); wc.Opcode != uverbs.WCFetchAdd {
		t.Fatalf("fetch-add completion %+v", wc)
	}
	if old, now := le.Uint64(a.Buf()), le.Uint64(b.Buf()[64:]); old != 1000 || now != 1005 {
		t.Fatalf("FETCH_ADD: old %d new %d", old, now)
	}
	// CMP_AND_SWP that matches swaps; one that does not leaves memory alone.
	for i, c := range []struct{ cmp, swap, wantOld, wantNow uint64 }{{1005, 7, 1005, 7}, {1005, 9, 7, 7}} {
		a.PostSend(uverbs.SendWR{ID: uint64(2 + i), Opcode: uverbs.WRAtomicCmpAndSwp, Flags: uverbs.SendSignaled, CompareAdd: c.cmp, Swap: c.swap,
			SGL: []uverbs.SGE{a.MR.SGE(8, 8)}, RemoteAddr: b.Addr(64), RKey: b.MR.RKey()})
		if wc := a.Wait1(uint64(2+i), uverbs.WCSuccess); wc.Opcode != uverbs.WCCompSwap {
			t.Fatalf("cmp-swap completion %+v", wc)
		}
		if old, now := le.Uint64(a.Buf()[8:]), le.Uint64(b.Buf()[64:]); old != c.wantOld || now != c.wantNow {
			t.Fatalf("CMP_AND_SWP %d: old %d new %d, want %d %d", i, old, now, c.wantOld, c.wantNow)
		}
	}
	// A misaligned atomic is rejected at post time.
	_, err := a.QP.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRAtomicFetchAndAdd, SGL: []uverbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.Addr(65), RKey: b.MR.RKey()}})
	if !errors.Is(err, uverbs.ErrInvalidWR) {
		t.Fatalf("misaligned atomic: %v, want ErrInvalidWR", err)
	}
}

func testInlineAndSGL(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<20, nil)
	caps := a.QP.Caps()
	if caps.MaxInlineData < maxInline {
		t.Fatalf("asked for %d inline bytes, granted %d", maxInline, caps.MaxInlineData)
	}
	// Inline SEND from three pieces; the source is overwritten right after
	// the post, before completion, which inline makes legal.
	fill(a.Buf()[:maxInline], 5)
	want := append([]byte{}, a.Buf()[:maxInline]...)
	b.PostRecv(1, b.MR.SGE(b.Half(), 4096))
	a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled | uverbs.SendInline,
		SGL: []uverbs.SGE{a.MR.SGE(0, 10), a.MR.SGE(10, 50), a.MR.SGE(60, maxInline-60)}})
	clear(a.Buf()[:maxInline])
	a.Wait1(1, uverbs.WCSuccess)
	if r := b.Wait1(1, uverbs.WCSuccess); r.ByteLen != maxInline || !bytes.Equal(b.Buf()[b.Half():b.Half()+maxInline], want) {
		t.Fatalf("inline SEND: %+v", r)
	}
	// Inline RDMA WRITE.
	fill(a.Buf()[:100], 6)
	want = append(want[:0], a.Buf()[:100]...)
	a.PostSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled | uverbs.SendInline,
		SGL: []uverbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	clear(a.Buf()[:100])
	a.Wait1(2, uverbs.WCSuccess)
	if !bytes.Equal(b.Buf()[:100], want) {
		t.Fatal("inline WRITE payload differs")
	}
	// Gather 4 SGEs, scatter into 3 (one empty).
	fill(a.Buf()[:4000], 7)
	b.PostRecv(3, b.MR.SGE(b.Half(), 1000), b.MR.SGE(b.Half()+5000, 0), b.MR.SGE(b.Half()+8192, 9000))
	a.PostSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 1), a.MR.SGE(1, 999), a.MR.SGE(1000, 2000), a.MR.SGE(3000, 1000)}})
	a.Wait1(3, uverbs.WCSuccess)
	if r := b.Wait1(3, uverbs.WCSuccess); r.ByteLen != 4000 {
		t.Fatalf("scatter receive %+v", r)
	}
	got := append(append([]byte{}, b.Buf()[b.Half():b.Half()+1000]...), b.Buf()[b.Half()+8192:b.Half()+8192+3000]...)
	if !bytes.Equal(got, a.Buf()[:4000]) {
		t.Fatal("gather/scatter payload differs")
	}
}

func testUnsignaledWrap(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<20, nil)
	// Many laps of the send queue with only every 16th request signaled:
	// completions must come in order and cover the gaps.
	const total = 40 * qpDepth
	var wrs [8]uverbs.SendWR
	signaled := 0
	for i := 0; i < total; {
		k := min(len(wrs), total-i)
		for j := range k {
			id := uint64(i + j)
			wrs[j] = uverbs.SendWR{ID: id, Opcode: uverbs.WRRDMAWrite, SGL: []uverbs.SGE{a.MR.SGE(int(id%1024)*8, 8)},
				RemoteAddr: b.Addr(int(id%1024) * 8), RKey: b.MR.RKey()}
			if id%16 == 15 {
				wrs[j].Flags = uverbs.SendSignaled
			}
		}
		n, err := a.QP.PostSend(wrs[:k])
		if err != nil && !errors.Is(err, uverbs.ErrQueueFull) {
			t.Fatal(err)
		}
		i += n
		if n < k {
			wc := a.Wait(1)[0]
			if wc.Status != uverbs.WCSuccess || wc.ID != uint64(signaled*16+15) {
				t.Fatalf("completion %+v, want ID %d", wc, signaled*16+15)
			}
			signaled++
		}
	}
	for signaled < total/16 {
		wc := a.Wait(1)[0]
		if wc.Status != uverbs.WCSuccess || wc.ID != uint64(signaled*16+15) {
			t.Fatalf("completion %+v, want ID %d", wc, signaled*16+15)
		}
		signaled++
	}
	a.Quiet()
}

func testErrors(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.RNRRetry = 1; c.MinRNRTimer = 1 })
	// A WRITE with a bad rkey fails remotely; the QP enters ERR and what
	// was posted after it is flushed.
	a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey() ^ 0x5a5a00})
	a.PostSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	wcs := a.Wait(2)
	if wcs[0].ID != 1 || wcs[0].Status != uverbs.WCRemAccessErr {
		t.Fatalf("bad rkey: %+v (%s), want REM_ACCESS_ERR", wcs[0], wcs[0].Status)
	}
	if wcs[1].ID != 2 || wcs[1].Status != uverbs.WCWRFlushErr {
		t.Fatalf("after error: %+v (%s), want WR_FLUSH_ERR", wcs[1], wcs[1].Status)
	}
	// The refusal is permanent and names the key and range; the flushed
	// request behind it is worth a retry on a fresh QP.
	badKey := b.MR.RKey() ^ 0x5a5a00
	if err := wcs[0].ErrRemote(badKey, b.Addr(0), 64); !errors.Is(err, uverbs.ErrCompletionAccess) || errors.Is(err, uverbs.ErrCompletionTransient) ||
		!strings.Contains(err.Error(), fmt.Sprintf("rkey %#x range [%#x, %#x)", badKey, b.Addr(0), b.Addr(0)+64)) {
		t.Errorf("bad rkey error: %v, want an access error naming the key and range", err)
	}
	if err := wcs[1].Err(); !errors.Is(err, uverbs.ErrCompletionTransient) || errors.Is(err, uverbs.ErrCompletionAccess) {
		t.Errorf("flush error: %v, want transient", err)
	}
	// Receives posted on a QP moved to ERR are flushed too.
	b.PostRecv(10, b.MR.SGE(0, 64))
	b.PostRecv(11, b.MR.SGE(64, 64))
	if err := b.QP.ToErr(); err != nil {
		t.Fatal(err)
	}
	for i, wc := range b.Wait(2) {
		if wc.ID != uint64(10+i) || wc.Status != uverbs.WCWRFlushErr {
			t.Fatalf("flushed receive %+v (%s)", wc, wc.Status)
		}
	}
	// So are sends posted while it is in ERR.
	b.PostSend(uverbs.SendWR{ID: 12, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{b.MR.SGE(0, 8)}})
	b.Wait1(12, uverbs.WCWRFlushErr)
	// RNR: a SEND with no receive posted and rnr_retry 1 fails.
	c, d := Pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.RNRRetry = 1; c.MinRNRTimer = 1 })
	c.PostSend(uverbs.SendWR{ID: 5, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{c.MR.SGE(0, 8)}})
	if wc := c.Wait1(5, uverbs.WCRNRRetryExcErr); !errors.Is(wc.Err(), uverbs.ErrCompletionTransient) {
		t.Errorf("RNR retries exceeded: %v, want transient", wc.Err())
	}
	_ = d
	// A receive buffer smaller than the message fails on both sides. The
	// receiver's status is the device's choice: ConnectX reports a local
	// length error, rxe (6.1) a local QP operation error.
	e, f := Pair(t, tg, 1<<16, nil)
	f.PostRecv(7, f.MR.SGE(0, 8))
	e.PostSend(uverbs.SendWR{ID: 8, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{e.MR.SGE(0, 64)}})
	if wc := f.Wait(1)[0]; wc.ID != 7 || (wc.Status != uverbs.WCLocLenErr && wc.Status != uverbs.WCLocQPOpErr) {
		t.Fatalf("short receive buffer: %+v (%s)", wc, wc.Status)
	}
	if wc := e.Wait(1)[0]; wc.ID != 8 || wc.Status == uverbs.WCSuccess {
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
		a, b := Pair(t, tg, 1<<16, nil)
		sge := a.MR.SGE(0, 64)
		sge.LKey ^= 0x55
		a.PostSend(uverbs.SendWR{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{sge}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
		wc := a.Wait(1)[0]
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
		// Whatever the device reports, the class follows the status: a
		// protection error is permanent, a flush is transient (the engine
		// never posts an unregistered lkey, so a retry of it is bounded by
		// its retry count), a QP operation error is neither.
		err := wc.Err()
		if errors.Is(err, uverbs.ErrCompletionAccess) != (wc.Status != uverbs.WCLocQPOpErr && wc.Status != uverbs.WCWRFlushErr) ||
			errors.Is(err, uverbs.ErrCompletionTransient) != (wc.Status == uverbs.WCWRFlushErr) {
			t.Errorf("bad lkey: %v classified wrongly", err)
		}
		t.Logf("bad lkey -> %s (transient %v, access %v)", wc.Status, errors.Is(err, uverbs.ErrCompletionTransient), errors.Is(err, uverbs.ErrCompletionAccess))
	})
	t.Run("bad-rkey", func(t *testing.T) {
		a, b := Pair(t, tg, 1<<16, nil)
		a.PostSend(uverbs.SendWR{ID: 2, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey() ^ 0x5500})
		a.Wait1(2, uverbs.WCRemAccessErr)
	})
	t.Run("out-of-range", func(t *testing.T) {
		a, b := Pair(t, tg, 1<<16, nil)
		a.PostSend(uverbs.SendWR{ID: 3, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(b.MR.Len() - 8), RKey: b.MR.RKey()})
		a.Wait1(3, uverbs.WCRemAccessErr)
	})
	t.Run("read-only-region", func(t *testing.T) {
		a, b := Pair(t, tg, 1<<16, nil)
		ro, err := b.PD.AllocMR(4096, uverbs.AccessLocalWrite|uverbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		fill(ro.Bytes()[:64], 4)
		a.PostSend(uverbs.SendWR{ID: 4, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
		a.Wait1(4, uverbs.WCSuccess)
		if !bytes.Equal(a.Buf()[:64], ro.Bytes()[:64]) {
			t.Fatal("READ of a read-only region: data differs")
		}
		a.PostSend(uverbs.SendWR{ID: 5, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()})
		a.Wait1(5, uverbs.WCRemAccessErr)
	})
}

// testPeerGone: with the peer's QP destroyed and a small retry count, a
// WRITE fails with RETRY_EXC_ERR within the transport timeout instead of
// hanging, and what was queued behind it is flushed.
func testPeerGone(t *testing.T, tg Target) {
	// Timeout 8 is 4.096 us << 8, about 1 ms per try; 3 tries.
	a, b := Pair(t, tg, 1<<16, func(c *uverbs.ConnectConfig) { c.Timeout = 8; c.RetryCnt = 2 })
	if err := b.QP.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a.PostSend(uverbs.SendWR{ID: 7, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()})
	a.PostSend(uverbs.SendWR{ID: 8, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.MR.SGE(0, 8)}})
	a.Wait1(7, uverbs.WCRetryExcErr)
	a.Wait1(8, uverbs.WCWRFlushErr)
	t.Logf("retry exceeded after %v", time.Since(start))
}

// testPostState: posting sends on a QP that is not yet in RTS (RESET, INIT)
// is refused with ErrQPState before anything reaches the queue.
func testPostState(t *testing.T, tg Target) {
	s := NewSide(t, tg, tg.A, SideConfig{BufSize: 4096})
	wr := []uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: []uverbs.SGE{s.MR.SGE(0, 8)}}}
	if _, err := s.QP.PostSend(wr); !errors.Is(err, uverbs.ErrQPState) {
		t.Fatalf("post in RESET: %v, want ErrQPState", err)
	}
	if err := s.QP.ToInit(s.Dev.Port, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.QP.PostSend(wr); !errors.Is(err, uverbs.ErrQPState) {
		t.Fatalf("post in INIT: %v, want ErrQPState", err)
	}
}

func testLimits(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<16, nil)
	caps := a.QP.Caps()
	sge := a.MR.SGE(0, 8)
	// More SGEs than the QP was created with.
	many := make([]uverbs.SGE, caps.MaxSendSGE+1)
	for i := range many {
		many[i] = sge
	}
	if _, err := a.QP.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: many}}); !errors.Is(err, uverbs.ErrTooManySGE) {
		t.Fatalf("too many send SGEs: %v", err)
	}
	rmany := make([]uverbs.SGE, a.QP.Caps().MaxRecvSGE+1)
	for i := range rmany {
		rmany[i] = sge
	}
	if _, err := a.QP.PostRecv([]uverbs.RecvWR{{SGL: rmany}}); !errors.Is(err, uverbs.ErrTooManySGE) {
		t.Fatalf("too many receive SGEs: %v", err)
	}
	// Inline data over the limit.
	if _, err := a.QP.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, Flags: uverbs.SendInline,
		SGL: []uverbs.SGE{a.MR.SGE(0, int(caps.MaxInlineData)+1)}}}); !errors.Is(err, uverbs.ErrInlineTooLarge) {
		t.Fatalf("inline too large: %v", err)
	}
	// The receive queue takes at least MaxRecvWR requests (a provider may
	// round its ring up: rxe does), then refuses with ErrQueueFull, and a
	// batch reports how many went in.
	rwrs := make([]uverbs.RecvWR, 4*caps.MaxRecvWR+1)
	for i := range rwrs {
		rwrs[i] = uverbs.RecvWR{ID: uint64(i), SGL: []uverbs.SGE{b.MR.SGE(0, 8)}}
	}
	n, err := a.QP.PostRecv(rwrs)
	if n < int(caps.MaxRecvWR) || n == len(rwrs) || !errors.Is(err, uverbs.ErrQueueFull) {
		t.Fatalf("filling the receive queue: %d posted, %v (capacity %d)", n, err, caps.MaxRecvWR)
	}
	t.Logf("receive queue: %d requests fit (MaxRecvWR %d)", n, caps.MaxRecvWR)
	// Likewise the send queue (every request signaled; the CQ has room
	// for four queues' worth); once they complete it takes work again.
	swrs := make([]uverbs.SendWR, 4*caps.MaxSendWR+1)
	for i := range swrs {
		swrs[i] = uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{sge}, RemoteAddr: b.Addr(0), RKey: b.MR.RKey()}
	}
	n, err = a.QP.PostSend(swrs)
	if n < int(caps.MaxSendWR) || n == len(swrs) || !errors.Is(err, uverbs.ErrQueueFull) {
		t.Fatalf("filling the send queue: %d posted, %v (capacity %d)", n, err, caps.MaxSendWR)
	}
	t.Logf("send queue: %d requests fit (MaxSendWR %d)", n, caps.MaxSendWR)
	for i, wc := range a.Wait(n) {
		if wc.ID != uint64(i) || wc.Status != uverbs.WCSuccess {
			t.Fatalf("completion %d of a full queue: %+v (%s)", i, wc, wc.Status)
		}
	}
	a.Quiet()
	if n, err := a.QP.PostSend(swrs[:1]); n != 1 || err != nil {
		t.Fatalf("after the queue drained: %d %v", n, err)
	}
	a.Wait1(0, uverbs.WCSuccess)
}

func testEvents(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<16, nil)
	// Arm, then a completion raises exactly one event on the channel.
	for i := range 3 {
		if err := b.CQ.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		b.PostRecv(uint64(i), b.MR.SGE(0, 64))
		a.PostSend(uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.MR.SGE(0, 64)}, Flags: uverbs.SendSolicited})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cq, err := b.Ch.Wait(ctx)
		cancel()
		if err != nil || cq != b.CQ {
			t.Fatalf("event %d: %v %v", i, cq, err)
		}
		var wc [2]uverbs.WC
		if n, err := b.CQ.Poll(wc[:]); n != 1 || err != nil || wc[0].ID != uint64(i) {
			t.Fatalf("after event %d: %d %+v %v", i, n, wc[:n], err)
		}
	}
	if got := b.CQ.CompEvents(); got != 3 {
		t.Fatalf("%d completion events, want 3", got)
	}
	// A solicited-only arm lets an unsolicited completion through without
	// an event, and raises one for the next solicited one.
	waitEvent := func(d time.Duration) (*uverbs.CQ, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return b.Ch.Wait(ctx)
	}
	b.PostRecv(10, b.MR.SGE(0, 64))
	b.PostRecv(11, b.MR.SGE(0, 64))
	if err := b.CQ.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	a.PostSend(uverbs.SendWR{ID: 10, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.MR.SGE(0, 16)}})
	// Poll, never Wait: Wait could re-arm the CQ for any completion.
	if wc := b.PollOne(); wc.ID != 10 || wc.Status != uverbs.WCSuccess {
		t.Fatalf("unsolicited receive %+v", wc)
	}
	if cq, err := waitEvent(300 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("event %v / %v for an unsolicited completion under a solicited-only arm", cq, err)
	}
	a.PostSend(uverbs.SendWR{ID: 11, Opcode: uverbs.WRSend, Flags: uverbs.SendSolicited, SGL: []uverbs.SGE{a.MR.SGE(0, 16)}})
	if cq, err := waitEvent(20 * time.Second); err != nil || cq != b.CQ {
		t.Fatalf("solicited completion: event %v, %v", cq, err)
	}
	if wc := b.PollOne(); wc.ID != 11 || wc.Status != uverbs.WCSuccess {
		t.Fatalf("solicited receive %+v", wc)
	}
	if got := b.CQ.CompEvents(); got != 4 {
		t.Fatalf("%d completion events, want 4", got)
	}
}

func testAllocs(t *testing.T, tg Target) {
	a, b := Pair(t, tg, 1<<16, nil)
	wr := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.MR.SGE(0, 64)},
		RemoteAddr: b.Addr(0), RKey: b.MR.RKey()}}
	var wc [1]uverbs.WC
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := a.QP.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for {
			if n, _ := a.CQ.Poll(wc[:]); n == 1 {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per WRITE post+poll", allocs)
	}
	recv := []uverbs.RecvWR{{ID: 2, SGL: []uverbs.SGE{b.MR.SGE(128, 64)}}}
	if allocs := testing.AllocsPerRun(20, func() {
		if _, err := b.QP.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per PostRecv", allocs)
	}
	if allocs := testing.AllocsPerRun(200, func() {
		if _, err := a.CQ.Poll(wc[:]); err != nil {
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
	a, b := Pair(t, tg, 1<<16, nil)
	const writes, chunk = 3, 1024
	fill(a.Buf()[:writes*chunk], 5)
	for i := range writes {
		a.PostSend(uverbs.SendWR{ID: uint64(100 + i), Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
			SGL: []uverbs.SGE{a.MR.SGE(i*chunk, chunk)}, RemoteAddr: b.Addr(i * chunk), RKey: b.MR.RKey()})
	}
	// The data landing at B (A's CQ untouched) says the WRITEs ran; the
	// pause lets their completions reach A's CQ. Either way a correct
	// provider passes: timing only decides whether stale CQEs exist.
	deadline := time.Now().Add(30 * time.Second)
	for !bytes.Equal(a.Buf()[:writes*chunk], b.Buf()[:writes*chunk]) {
		if time.Now().After(deadline) {
			t.Fatal("the WRITEs never landed")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	for _, s := range []*Side{a, b} {
		if err := s.QP.ToReset(); err != nil {
			t.Fatalf("%s: to RESET: %v", s.Dev.Name, err)
		}
	}
	a.Connect(b, nil)
	b.Connect(a, nil)

	seen := map[uint64]bool{}
	check := func(wc uverbs.WC) {
		t.Helper()
		if wc.ID < 100 || wc.ID >= 100+writes || seen[wc.ID] {
			t.Fatalf("completion %+v after RESET: neither the SEND nor a first report of an old WRITE", wc)
		}
		seen[wc.ID] = true
	}
	const sendID = 300
	a.PostSend(uverbs.SendWR{ID: sendID, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{a.MR.SGE(0, 64)}})
	wcs := make([]uverbs.WC, 8)
	for until := time.Now().Add(200 * time.Millisecond); time.Now().Before(until); time.Sleep(time.Millisecond) {
		n, err := a.CQ.Poll(wcs)
		if err != nil {
			t.Fatalf("%s: poll: %v", a.Dev.Name, err)
		}
		for _, wc := range wcs[:n] {
			if wc.ID == sendID {
				t.Fatalf("%s: the SEND completed (%+v) while its peer had no receive posted: a stale completion was matched to it", a.Dev.Name, wc)
			}
			check(wc)
		}
	}
	b.PostRecv(400, b.MR.SGE(b.Half(), 64))
	for {
		wc := a.Wait(1)[0]
		if wc.ID != sendID {
			check(wc)
			continue
		}
		if wc.Status != uverbs.WCSuccess || wc.Opcode != uverbs.WCSend {
			t.Fatalf("SEND after RESET: %+v", wc)
		}
		break
	}
	if r := b.Wait1(400, uverbs.WCSuccess); r.ByteLen != 64 || !bytes.Equal(b.Buf()[b.Half():b.Half()+64], a.Buf()[:64]) {
		t.Fatalf("receive after RESET %+v, or its payload differs", r)
	}
	t.Logf("%s: %d of the %d WRITE completions left at RESET were reported after it", a.Dev.Name, len(seen), writes)
}
