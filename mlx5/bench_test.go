//go:build amd64 || arm64

package mlx5

import (
	"testing"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

// driverObjects wraps a simRig's rings in the provider's QP and CQ types,
// so allocation checks and benchmarks go through the uverbs interfaces the
// core calls.
func driverObjects(r *simRig) (uverbs.DriverQP, uverbs.DriverCQ) {
	ctx := &Context{}
	ctx.qps.set(r.qp.uidx, r.qp)
	r.qpObj.ctx, r.cqObj.ctx = ctx, ctx
	return r.qpObj, r.cqObj
}

// TestDataPathDoesNotAllocate proves with testing.AllocsPerRun that posting
// (regular doorbell and BlueFlame), receiving, polling and arming allocate
// nothing, through the DriverQP/DriverCQ interfaces.
func TestDataPathDoesNotAllocate(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 64, MaxSendSGE: 2, MaxInlineData: 64, MaxRecvWR: 64, MaxRecvSGE: 1}, 255, 512)
	qp, cq := driverObjects(r)
	r.hca = newSimHCA(t, r.qp, r.qpRec, r.cq, r.cqRec, r.qp.uidx)
	sge := []uverbs.SGE{{Addr: dma.Addr(r.bufs), Length: 4096, LKey: 1}}
	inl := []uverbs.SGE{{Addr: dma.Addr(r.bufs), Length: 64}}
	write := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, SGL: sge, RemoteAddr: 0x1000, RKey: 2}}
	send := []uverbs.SendWR{{ID: 2, Opcode: uverbs.WRSendWithImm, Flags: uverbs.SendSignaled | uverbs.SendInline, SGL: inl, Imm: 9}}
	recv := []uverbs.RecvWR{{ID: 3, SGL: sge}}
	var wc [4]uverbs.WC
	cases := []struct {
		name string
		f    func()
		want int // completions per round
	}{
		{"write", func() { qp.PostSend(write) }, 1},
		{"inline send (BlueFlame)", func() { qp.PostRecv(recv); qp.PostSend(send) }, 2},
	}
	for _, c := range cases {
		allocs := testing.AllocsPerRun(1000, func() {
			c.f()
			r.hca.step()
			got := 0
			for got < c.want {
				n, err := cq.Poll(wc[:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
			cq.Arm(false)
			cq.EventConsumed()
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per post+poll+arm", c.name, allocs)
		}
	}
	// Failing posts do not allocate either.
	bad := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, SGL: make([]uverbs.SGE, 3)}}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := qp.PostSend(bad); err != uverbs.ErrTooManySGE {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("rejected post: %v allocations", allocs)
	}
}

// BenchmarkPostSendWrite builds one RDMA WRITE WQE (one SGE, signaled) and
// rings the doorbell (record, SFENCE, 64-bit store to an anonymous page
// standing in for the UAR, SFENCE). The queue is recycled without an HCA.
func BenchmarkPostSendWrite(b *testing.B) {
	for _, bc := range []struct {
		name   string
		inline bool
		bf     uint32
	}{{"doorbell", false, 0}, {"inline64-blueflame", true, 512}, {"inline64-doorbell", true, 0}} {
		b.Run(bc.name, func(b *testing.B) {
			r := newSimRig(b, uverbs.QPCaps{MaxSendWR: 256, MaxSendSGE: 1, MaxInlineData: 64, MaxRecvWR: 1, MaxRecvSGE: 1}, 255, bc.bf)
			qp, _ := driverObjects(r)
			wr := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, RemoteAddr: 0x10000, RKey: 7,
				SGL: []uverbs.SGE{{Addr: dma.Addr(r.bufs), Length: 64, LKey: 3}}}}
			if bc.inline {
				wr[0].Flags |= uverbs.SendInline
			}
			sq := &r.qp.sq
			b.ReportAllocs()
			for b.Loop() {
				if _, err := qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				sq.tail.Store(sq.head) // as if completed
			}
		})
	}
}

// BenchmarkPollCQ polls one CQE per call from a CQ the simulated HCA has
// filled (refills happen outside the timer, once per 64 Ki completions).
func BenchmarkPollCQ(b *testing.B) {
	r := newSimRig(b, uverbs.QPCaps{MaxSendWR: 1 << 15, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 1<<16-1, 0)
	_, cq := driverObjects(r)
	ring := r.cq
	r.qp.sq.head = 1 << 31 // plenty of work "outstanding" for the CQEs to complete
	r.qp.sq.pub.Store(r.qp.sq.head)
	fill := func() {
		for i := range ring.cnt {
			c := fakeCQE{opcode: cqeReq, sop: opcodeRDMAWrite, qpn: r.qp.sq.qpn, uidx: r.qp.uidx, wqeCounter: uint16(ring.ci + i)}
			pi := ring.ci + i
			if pi&ring.cnt != 0 {
				c.owner = 1
			}
			c.put(ring.buf[int(pi&(ring.cnt-1))*cqeSize:])
		}
	}
	var wc [1]uverbs.WC
	b.ReportAllocs()
	left := uint32(0)
	for b.Loop() {
		if left == 0 {
			b.StopTimer()
			fill()
			left = ring.cnt
			b.StartTimer()
		}
		if n, err := cq.Poll(wc[:]); n != 1 || err != nil {
			b.Fatal("no completion:", err)
		}
		left--
	}
}

// BenchmarkPostPollRoundTrip posts a signaled WRITE, lets the simulated HCA
// consume it and write the CQE, and polls it: the whole software loop.
func BenchmarkPostPollRoundTrip(b *testing.B) {
	r := newSimRig(b, uverbs.QPCaps{MaxSendWR: 256, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 255, 0)
	qp, cq := driverObjects(r)
	r.hca = newSimHCA(b, r.qp, r.qpRec, r.cq, r.cqRec, r.qp.uidx)
	wr := []uverbs.SendWR{{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, RemoteAddr: 0x10000, RKey: 7,
		SGL: []uverbs.SGE{{Addr: dma.Addr(r.bufs), Length: 4096, LKey: 3}}}}
	var wc [1]uverbs.WC
	b.ReportAllocs()
	for b.Loop() {
		qp.PostSend(wr)
		r.hca.step()
		if n, err := cq.Poll(wc[:]); n != 1 || err != nil {
			b.Fatal("no completion:", err)
		}
	}
}
