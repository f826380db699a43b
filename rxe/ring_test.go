package rxe

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"sync"
	"testing"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/uverbs"
)

// fakeQueue lays out an rxe_queue_buf in anonymous memory, as the kernel would.
func fakeQueue(t testing.TB, slots int, log2 uint32) []byte {
	t.Helper()
	r, err := dma.Alloc(offData + slots<<log2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Unmap() })
	b := r.Bytes()
	binary.LittleEndian.PutUint32(b[offLog2Elem:], log2)
	binary.LittleEndian.PutUint32(b[offMask:], uint32(slots-1))
	return b
}

func TestNewRingValidatesHeader(t *testing.T) {
	b := fakeQueue(t, 8, 8)
	if _, err := newRing(b); err != nil {
		t.Fatal(err)
	}
	bad := func(mut func([]byte), what string) {
		c := make([]byte, len(b))
		copy(c, b)
		mut(c)
		if _, err := newRing(c); err == nil {
			t.Errorf("%s accepted", what)
		}
	}
	bad(func(c []byte) { binary.LittleEndian.PutUint32(c[offMask:], 6) }, "non power-of-two slots")
	bad(func(c []byte) { binary.LittleEndian.PutUint32(c[offLog2Elem:], 12) }, "slots beyond the mapping")
	bad(func(c []byte) { binary.LittleEndian.PutUint32(c[offLog2Elem:], 2) }, "tiny element")
	if _, err := newRing(b[:100]); err == nil {
		t.Error("short mapping accepted")
	}
}

func newTestSQ(t testing.TB, slots int) (*sendQueue, []byte) {
	b := fakeQueue(t, slots, 9) // 512-byte slots: 208 header + 304 payload
	r, err := newRing(b)
	if err != nil {
		t.Fatal(err)
	}
	q := newSendQueue(r, uverbs.QPCaps{MaxSendSGE: 4, MaxInlineData: 256})
	return &q, b
}

func TestSendWQEEncoding(t *testing.T) {
	q, b := newTestSQ(t, 4)
	buf, _ := dma.Alloc(4096)
	defer buf.Unmap()
	data := buf.Bytes()
	copy(data, "hello, inline world")
	addr := dma.Addr(data)
	wrs := []uverbs.SendWR{
		{ID: 11, Opcode: uverbs.WRSendWithImm, Flags: uverbs.SendSignaled | uverbs.SendSolicited, Imm: 0x01020304,
			SGL: []uverbs.SGE{{Addr: 0x1000, Length: 100, LKey: 7}, {Addr: 0x3000, Length: 28, LKey: 8}}},
		{ID: 12, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendInline,
			SGL: []uverbs.SGE{{Addr: addr, Length: 5}, {Addr: addr + 7, Length: 12}}, RemoteAddr: 0xabc000, RKey: 0x1234},
		{ID: 13, Opcode: uverbs.WRAtomicCmpAndSwp, SGL: []uverbs.SGE{{Addr: 0x2000, Length: 8, LKey: 9}},
			RemoteAddr: 0x5008, RKey: 0x99, CompareAdd: 5, Swap: 6},
	}
	if n, payload, err := q.post(wrs); err != nil || n != 3 || payload != 128+17+8 { // payload sizes the kick choice in PostSend
		t.Fatalf("post: %d WRs of %d payload bytes, %v; want 3 of %d", n, payload, err, 128+17+8)
	}
	// A READ's bytes come back from the peer: its request is one packet.
	rq, _ := newTestSQ(t, 4)
	if _, payload, err := rq.post([]uverbs.SendWR{{Opcode: uverbs.WRRDMARead, SGL: []uverbs.SGE{{Addr: 0x1000, Length: 1 << 20, LKey: 7}}}}); err != nil || payload != 0 {
		t.Fatalf("READ post: %v, %d payload bytes, want 0", err, payload)
	}
	if p := binary.LittleEndian.Uint32(b[offProducer:]); p != 3 {
		t.Fatalf("producer %d", p)
	}
	w0 := dma.View[uapi.RxeSendWQE](b, offData)
	if w0.WR.WRID != 11 || w0.WR.Opcode != 3 || w0.WR.SendFlags != 6 || w0.WR.Ex != bits.ReverseBytes32(0x01020304) ||
		w0.DMA.NumSGE != 2 || w0.DMA.Length != 128 || w0.DMA.Resid != 128 || w0.State != 0 || w0.IOVA != 0 {
		t.Fatalf("send WQE %+v", *w0)
	}
	// imm_data is big-endian in memory.
	if got := b[offData+20 : offData+24]; got[0] != 1 || got[3] != 4 {
		t.Fatalf("imm bytes %x", got)
	}
	s1 := dma.View[uapi.RxeSGE](b, offData+208+16)
	if s1.Addr != 0x3000 || s1.Length != 28 || s1.LKey != 8 {
		t.Fatalf("sge[1] %+v", *s1)
	}
	off1 := offData + 512
	w1 := dma.View[uapi.RxeSendWQE](b, off1)
	if w1.WR.Opcode != 0 || w1.WR.RemoteAddr != 0xabc000 || binary.LittleEndian.Uint32(b[off1+32:]) != 0x1234 ||
		binary.LittleEndian.Uint32(b[off1+36:]) != 0 || w1.IOVA != 0xabc000 || w1.DMA.NumSGE != 0 || w1.DMA.Length != 17 {
		t.Fatalf("inline write WQE %+v", *w1)
	}
	if got := string(b[off1+208 : off1+208+17]); got != "hello"+"inline world" {
		t.Fatalf("inline payload %q", got)
	}
	off2 := offData + 1024
	w2 := dma.View[uapi.RxeSendWQE](b, off2)
	if w2.WR.Opcode != 5 || w2.WR.RemoteAddr != 0x5008 || w2.WR.CompareAdd != 5 || w2.WR.Swap != 6 ||
		w2.WR.AtomicRKey != 0x99 || binary.LittleEndian.Uint32(b[off2+48:]) != 0x99 || w2.IOVA != 0x5008 || w2.DMA.Length != 8 {
		t.Fatalf("atomic WQE %+v", *w2)
	}
	// Capacity is slots-1: the fourth post finds the ring full.
	if n, _, err := q.post(wrs[:1]); !errors.Is(err, uverbs.ErrQueueFull) || n != 0 {
		t.Fatalf("post into a full ring: %d %v", n, err)
	}
}

func TestSendValidation(t *testing.T) {
	q, _ := newTestSQ(t, 8)
	cases := []struct {
		wr  uverbs.SendWR
		err error
	}{
		{uverbs.SendWR{Opcode: 7}, uverbs.ErrInvalidWR},
		{uverbs.SendWR{Opcode: uverbs.WRSend, SGL: make([]uverbs.SGE, 5)}, uverbs.ErrTooManySGE},
		{uverbs.SendWR{Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: []uverbs.SGE{{Length: 257}}}, uverbs.ErrInlineTooLarge},
		{uverbs.SendWR{Opcode: uverbs.WRRDMARead, Flags: uverbs.SendInline}, uverbs.ErrInvalidWR},
		{uverbs.SendWR{Opcode: uverbs.WRAtomicFetchAndAdd, SGL: []uverbs.SGE{{Length: 8}}, RemoteAddr: 4}, uverbs.ErrInvalidWR},
		{uverbs.SendWR{Opcode: uverbs.WRAtomicFetchAndAdd, SGL: []uverbs.SGE{{Length: 4}}}, uverbs.ErrInvalidWR},
		{uverbs.SendWR{Opcode: uverbs.WRAtomicFetchAndAdd}, uverbs.ErrInvalidWR},
		{uverbs.SendWR{Opcode: uverbs.WRSend, SGL: []uverbs.SGE{{Length: 1 << 31}, {Length: 1 << 31}}}, uverbs.ErrInvalidWR},
	}
	for i, c := range cases {
		if n, _, err := q.post([]uverbs.SendWR{c.wr}); !errors.Is(err, c.err) || n != 0 {
			t.Errorf("case %d: %d %v, want %v", i, n, err, c.err)
		}
	}
	// A batch stops at the first bad WR and reports how many were posted.
	n, _, err := q.post([]uverbs.SendWR{{Opcode: uverbs.WRSend}, {Opcode: 9}, {Opcode: uverbs.WRSend}})
	if n != 1 || !errors.Is(err, uverbs.ErrInvalidWR) {
		t.Fatalf("batch: %d %v", n, err)
	}
}

// TestSendRingWithKernel runs a simulated kernel consumer concurrently with
// the producer through many wrap-arounds (run with -race).
func TestSendRingWithKernel(t *testing.T) {
	q, b := newTestSQ(t, 8)
	const total = 5000
	var wg sync.WaitGroup
	wg.Add(1)
	errc := make(chan error, 1)
	go func() { // the "kernel": load-acquire producer, check WQE, release consumer
		defer wg.Done()
		r, _ := newRing(b)
		var cons uint32
		for want := uint64(0); want < total; {
			if r.producer() == cons {
				continue
			}
			w := dma.View[uapi.RxeSendWQE](b, r.slot(cons))
			if w.WR.WRID != want || w.DMA.Length != uint32(want%1000) {
				errc <- errors.New("out of order or torn WQE")
				return
			}
			want++
			cons = (cons + 1) & r.mask
			r.publishConsumer(cons)
		}
	}()
	wr := []uverbs.SendWR{{Opcode: uverbs.WRSend, SGL: []uverbs.SGE{{}}}}
	for i := uint64(0); i < total; {
		wr[0].ID = i
		wr[0].SGL[0].Length = uint32(i % 1000)
		if _, _, err := q.post(wr); errors.Is(err, uverbs.ErrQueueFull) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		i++
	}
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
}

func TestRecvWQEEncoding(t *testing.T) {
	b := fakeQueue(t, 4, 6) // 64-byte slots: 40 header + 1 SGE
	r, _ := newRing(b)
	q := recvQueue{r: r, maxSGE: 1}
	if n, err := q.post([]uverbs.RecvWR{{ID: 5, SGL: []uverbs.SGE{{Addr: 0x10, Length: 99, LKey: 3}}}, {ID: 6}}); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	w := dma.View[uapi.RxeRecvWQE](b, offData)
	s := dma.View[uapi.RxeSGE](b, offData+40)
	if w.WRID != 5 || w.DMA.NumSGE != 1 || w.DMA.Length != 99 || w.DMA.Resid != 99 || s.Addr != 0x10 || s.LKey != 3 {
		t.Fatalf("recv WQE %+v %+v", *w, *s)
	}
	if n, err := q.post([]uverbs.RecvWR{{SGL: make([]uverbs.SGE, 2)}}); n != 0 || !errors.Is(err, uverbs.ErrTooManySGE) {
		t.Fatal(n, err)
	}
	q.post([]uverbs.RecvWR{{ID: 7}})
	if n, err := q.post([]uverbs.RecvWR{{ID: 8}}); n != 0 || !errors.Is(err, uverbs.ErrQueueFull) {
		t.Fatalf("full RQ: %d %v", n, err)
	}
}

// kernelCQE writes a CQE the way rxe does and advances the producer.
func kernelCQE(b []byte, r *ring, prod *uint32, wc uapi.WC) {
	*dma.View[uapi.WC](b, r.slot(*prod)) = wc
	*prod = (*prod + 1) & r.mask
	r.publishProducer(*prod)
}

func TestPollDecodes(t *testing.T) {
	b := fakeQueue(t, 4, 7) // 128-byte CQEs, as on x86 6.1
	r, _ := newRing(b)
	var prod, cons uint32
	wc := make([]uverbs.WC, 8)
	if n := pollRing(&r, &cons, wc); n != 0 {
		t.Fatalf("empty CQ polled %d", n)
	}
	for round := 0; round < 5; round++ { // wraps the 4-slot ring
		kernelCQE(b, &r, &prod, uapi.WC{WRID: 1, Status: 0, Opcode: 129, ByteLen: 77, Ex: bits.ReverseBytes32(0xcafe0001),
			QPNum: 0x11, SrcQP: 0x12, WCFlags: 1 | 2, PortNum: 1})
		kernelCQE(b, &r, &prod, uapi.WC{WRID: 2, Status: 5, QPNum: 0x11})
		kernelCQE(b, &r, &prod, uapi.WC{WRID: 3, Status: 200, VendorErr: 9, WCFlags: 4, Ex: 0x4455})
		n := pollRing(&r, &cons, wc[:2])
		n += pollRing(&r, &cons, wc[2:])
		if n != 3 {
			t.Fatalf("round %d: polled %d", round, n)
		}
		if binary.LittleEndian.Uint32(b[offConsumer:]) != cons || cons != prod {
			t.Fatalf("consumer not published")
		}
		if w := wc[0]; w.ID != 1 || w.Status != uverbs.WCSuccess || w.Opcode != uverbs.WCRecvRDMAWithImm || w.ByteLen != 77 ||
			w.Imm != 0xcafe0001 || w.Flags != uverbs.WCFlagGRH|uverbs.WCFlagWithImm || w.QPN != 0x11 || w.SrcQP != 0x12 || w.PortNum != 1 {
			t.Fatalf("decoded %+v", w)
		}
		if w := wc[1]; w.Status != uverbs.WCWRFlushErr || w.Err() == nil {
			t.Fatalf("flush %+v", w)
		}
		// Unknown statuses become general errors; WITH_INVALIDATE keeps the raw rkey.
		if w := wc[2]; w.Status != uverbs.WCGeneralErr || w.VendorErr != 9 || w.Flags != uverbs.WCFlagWithInvalidate || w.Imm != 0x4455 {
			t.Fatalf("general %+v", w)
		}
	}
}

func TestStatusMapping(t *testing.T) {
	b := fakeQueue(t, 64, 7)
	r, _ := newRing(b)
	var prod, cons uint32
	for st := uint32(0); st < 30; st++ {
		kernelCQE(b, &r, &prod, uapi.WC{WRID: uint64(st), Status: st})
	}
	wc := make([]uverbs.WC, 64)
	n := pollRing(&r, &cons, wc)
	for i := 0; i < n; i++ {
		want := uverbs.WCStatus(i)
		if i > int(uverbs.WCGeneralErr) {
			want = uverbs.WCGeneralErr
		}
		if wc[i].Status != want || wc[i].Status.String() == "" {
			t.Errorf("status %d -> %s", i, wc[i].Status)
		}
	}
	if uverbs.WCRetryExcErr.String() != "transport retry counter exceeded" || uverbs.WCStatus(99).String() != "WCStatus(99)" {
		t.Error("status names")
	}
}

func TestHostDataPathAllocs(t *testing.T) {
	q, b := newTestSQ(t, 64)
	r, _ := newRing(b)
	wr := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, SGL: []uverbs.SGE{{Addr: 1, Length: 8, LKey: 1}}}}
	var cons uint32
	if a := testing.AllocsPerRun(1000, func() {
		if _, _, err := q.post(wr); err != nil {
			panic(err)
		}
		cons = (cons + 1) & r.mask // the kernel consumes it
		r.publishConsumer(cons)
	}); a != 0 {
		t.Errorf("send post: %v allocs", a)
	}
	cb := fakeQueue(t, 64, 7)
	cr, _ := newRing(cb)
	var prod, ccons uint32
	wc := make([]uverbs.WC, 4)
	if a := testing.AllocsPerRun(1000, func() {
		kernelCQE(cb, &cr, &prod, uapi.WC{WRID: 1})
		if pollRing(&cr, &ccons, wc) != 1 {
			panic("poll")
		}
	}); a != 0 {
		t.Errorf("poll: %v allocs", a)
	}
}

func TestKickEncoding(t *testing.T) {
	reg, _ := dma.Alloc(64)
	defer reg.Unmap()
	cmd, err := encodeKick(reg.Bytes(), 0x42)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if len(cmd) != 32 || le.Uint32(cmd[0:]) != 28 || le.Uint16(cmd[4:]) != 8 || le.Uint16(cmd[6:]) != 1 ||
		le.Uint64(cmd[8:]) != dma.Addr(reg.Bytes())+32 || le.Uint32(cmd[16:]) != 0x42 ||
		le.Uint32(cmd[20:]) != 0 || le.Uint32(cmd[24:]) != 0 || le.Uint32(cmd[28:]) != 56 {
		t.Fatalf("kick % x", cmd)
	}
}

func FuzzDecodeWC(f *testing.F) {
	f.Add(make([]byte, 48))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var k uapi.WC
		b := make([]byte, 48)
		copy(b, raw)
		k = *dma.View[uapi.WC](b, 0)
		var w uverbs.WC
		decodeWC(&k, &w)
		if w.Status > uverbs.WCGeneralErr || w.Flags > 15 {
			t.Fatalf("decoded out of range %+v", w)
		}
		if (w.Status == uverbs.WCSuccess) != (w.Err() == nil) {
			t.Fatal("Err disagrees with Status")
		}
	})
}

// BenchmarkPostPollRing measures the provider's own cost per WR (WQE
// encoding, index publication, CQE decoding) against simulated rings; no
// kernel involved.
func BenchmarkPostPollRing(b *testing.B) {
	q, sb := newTestSQ(b, 256)
	sr, _ := newRing(sb)
	cb := fakeQueue(b, 256, 7)
	cr, _ := newRing(cb)
	wr := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: []uverbs.SGE{{Addr: 1, Length: 8, LKey: 1}}, RemoteAddr: 8, RKey: 2}}
	wc := make([]uverbs.WC, 1)
	var scons, prod, ccons uint32
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := q.post(wr); err != nil {
			b.Fatal(err)
		}
		scons = (scons + 1) & sr.mask
		sr.publishConsumer(scons)
		kernelCQE(cb, &cr, &prod, uapi.WC{WRID: 1})
		if pollRing(&cr, &ccons, wc) != 1 {
			b.Fatal("no CQE")
		}
	}
}

// FuzzNewRing: whatever header the mapping holds, newRing either rejects it
// or returns a ring whose every slot lies inside the mapping.
func FuzzNewRing(f *testing.F) {
	f.Add(uint32(7), uint32(3), 4096)
	f.Fuzz(func(t *testing.T, log2, mask uint32, size int) {
		if size < 0 || size > 1<<20 {
			return
		}
		b := make([]byte, size)
		if size >= 8 {
			binary.LittleEndian.PutUint32(b[offLog2Elem:], log2)
			binary.LittleEndian.PutUint32(b[offMask:], mask)
		}
		r, err := newRing(b)
		if err != nil {
			return
		}
		last := r.slot(r.mask)
		if last < offData || last+r.elem > len(b) {
			t.Fatalf("slot %d+%d outside %d bytes", last, r.elem, len(b))
		}
	})
}
