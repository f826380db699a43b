//go:build amd64 || arm64

package mlx5

import (
	"slices"
	"testing"

	"github.com/rdmago/te/uverbs"
)

// twoQPs finds the rig's QP and a second one, whose receive queue has
// endless receives outstanding: its CQEs are receive completions.
type twoQPs struct{ a, b *qpRings }

func (l twoQPs) lookup(uidx uint32) *qpRings {
	switch uidx {
	case l.a.uidx:
		return l.a
	case l.b.uidx:
		return l.b
	}
	return nil
}

// polledQPNs polls everything and returns the QPN of each completion.
func polledQPNs(t *testing.T, r *simRig) []uint32 {
	t.Helper()
	other := &qpRings{uidx: 78}
	other.rq = recvQueue{cnt: 1, wrid: []uint64{9}}
	other.rq.pub.Store(1 << 30)
	var out []uint32
	var wcs [4]uverbs.WC
	for {
		n, err := r.cq.poll(wcs[:], twoQPs{r.qp, other})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		for _, wc := range wcs[:n] {
			out = append(out, uint32(wc.QPN))
		}
	}
}

// TestCQCleanKeepsOthersInOrder interleaves the CQEs of two QPs across the
// end of the ring (owner bit flipping mid-way), cleans one QP out, and
// checks the other's survive in order, the consumer record moves past the
// freed slots, and the ring keeps working on the next passes.
func TestCQCleanKeepsOthersInOrder(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 15, 0)
	const mine, other = 0x2a2a2a, 0x0b0b0b
	emit := func(qpn, uidx uint32) {
		c := fakeCQE{opcode: cqeReq, sop: opcodeSend, qpn: qpn, uidx: uidx}
		if uidx != r.qp.uidx {
			c.opcode = cqeRespSend
		}
		r.hca.emit(&c)
	}
	for _, start := range []uint32{0, 11, 16 - 1, 1<<32 - 5} {
		initInvalid(r.cq.buf) // a fresh ring at each starting index
		r.cq.ci = start
		r.hca.SetCQProducer(start)
		storeRecord(r.cq.setCI, byteSwap32(start&0xffffff))
		pattern := []uint32{mine, other, other, mine, mine, other, mine, other, mine}
		var want []uint32
		for _, q := range pattern {
			if q == mine {
				emit(q, r.qp.uidx)
			} else {
				emit(q, 78)
				want = append(want, q)
			}
		}
		r.cqObj.Clean(r.qpObj)
		if r.cq.ci != start+5 {
			t.Fatalf("start %#x: consumer index %#x after freeing 5 of 9", start, r.cq.ci)
		}
		if got := record(r.cqRec, 0); got != r.cq.ci&0xffffff {
			t.Fatalf("start %#x: consumer record %#x, ci %#x", start, got, r.cq.ci)
		}
		if got := polledQPNs(t, r); !slices.Equal(got, want) {
			t.Fatalf("start %#x: polled QPNs %x, want %x", start, got, want)
		}
		// Nothing to clean: a no-op. Then the next entries, written with
		// the next pass's owner bit where the ring wrapped, are polled.
		r.cqObj.Clean(r.qpObj)
		for range 20 {
			emit(other, 78)
			if got := polledQPNs(t, r); !slices.Equal(got, []uint32{other}) {
				t.Fatalf("start %#x: after cleaning, polled %x", start, got)
			}
		}
	}

	// A full ring of only the cleaned QP's entries empties it.
	for range r.cq.cnt {
		emit(mine, r.qp.uidx)
	}
	r.cqObj.Clean(r.qpObj)
	if got := polledQPNs(t, r); len(got) != 0 {
		t.Fatalf("full ring of the cleaned QP: polled %x", got)
	}
	if r.hca.CQProducer() != r.cq.ci {
		t.Fatalf("consumer %#x behind producer %#x", r.cq.ci, r.hca.CQProducer())
	}
}

// TestResetDropsStaleCompletions is the case Clean exists for: work
// completes but is not polled, the QP is reset (its queue counters restart)
// and new work is posted and completed. Without cleaning, the stale CQEs
// complete the new work requests before the HCA ran them; with the core's
// order (Clean, then StateChanged) only the new CQEs complete them.
func TestResetDropsStaleCompletions(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 4, MaxRecvSGE: 1}, 15, 0)
	post := func(first uint64) {
		for i := range uint64(3) {
			wr := []uverbs.SendWR{{ID: first + i, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled}}
			if n, err := r.qp.postSend(wr); n != 1 || err != nil {
				t.Fatalf("post %d: %d %v", first+i, n, err)
			}
		}
	}
	post(100)
	if !r.hca.step() { // completed, never polled
		t.Fatal("HCA stalled")
	}
	r.cqObj.Clean(r.qpObj)
	r.qpObj.StateChanged(uverbs.QPStateReset)
	r.hca.Reset() // the HCA restarts the queues too
	post(200)
	var wcs [8]uverbs.WC
	// The new work has not been executed: nothing may complete yet.
	if n, err := r.cq.poll(wcs[:], r.lookup); n != 0 || err != nil {
		t.Fatalf("before the HCA ran the new work, %d completions: %+v", n, wcs[:n])
	}
	if !r.hca.step() {
		t.Fatal("HCA stalled")
	}
	n, err := r.cq.poll(wcs[:], r.lookup)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, wc := range wcs[:n] {
		if wc.Status != uverbs.WCSuccess {
			t.Errorf("completion %+v", wc)
		}
		ids = append(ids, wc.ID)
	}
	if want := []uint64{200, 201, 202}; !slices.Equal(ids, want) {
		t.Fatalf("IDs after reset %v, want %v", ids, want)
	}
}

// TestStrayCompletionIsAnError: a CQE naming a user index the context never
// gave out ends the poll with ErrStrayCompletion after the completions
// before it; it is consumed, and the next poll returns the ones after it.
func TestStrayCompletionIsAnError(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 15, 0)
	other := &qpRings{uidx: 78}
	other.rq = recvQueue{cnt: 1, wrid: []uint64{9}}
	other.rq.pub.Store(1 << 30)
	for _, uidx := range []uint32{78, 78, 500, 78} {
		r.hca.emit(&fakeCQE{opcode: cqeRespSend, qpn: uidx, uidx: uidx})
	}
	var wcs [8]uverbs.WC
	n, err := r.cq.poll(wcs[:], twoQPs{r.qp, other})
	if n != 2 || err != uverbs.ErrStrayCompletion || wcs[0].QPN != 78 || wcs[1].QPN != 78 {
		t.Fatalf("first poll: %d %v %+v", n, err, wcs[:n])
	}
	if r.cq.ci != 3 || record(r.cqRec, 0) != 3 {
		t.Fatalf("stray CQE not consumed: ci %d, record %d", r.cq.ci, record(r.cqRec, 0))
	}
	n, err = r.cq.poll(wcs[:], twoQPs{r.qp, other})
	if n != 1 || err != nil || wcs[0].QPN != 78 {
		t.Fatalf("second poll: %d %v %+v", n, err, wcs[:n])
	}
	// Through the provider object and the data-path contract: no allocation.
	if allocs := testing.AllocsPerRun(100, func() {
		r.hca.emit(&fakeCQE{opcode: cqeRespSend, qpn: 1, uidx: 501})
		if _, err := r.cq.poll(wcs[:], r.lookup); err != uverbs.ErrStrayCompletion {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per stray completion", allocs)
	}
}
