package rdma

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/uverbs"
)

// TestNoLostWakeup: a QP destroyed on a rail while that rail's owner has
// work in flight must not cost the owner its wake-up. Destroying a QP
// takes the CQ's single-owner guard (mlx5 cleans the CQ of the QP's
// completions); an owner whose Arm is refused meanwhile, and which then
// sleeps with the CQ unarmed, never hears of the completion that follows.
//
// Node B has a WRITE to A in flight (held by the fabric) and its owner
// asleep on the armed CQ. A closes its segment of B, so B's target
// session ends and B destroys the QPs it held for A. While the destroy
// holds the guard, B's WRITE completes: the event wakes B's owner, whose
// polls and arm the guard refuses while it lasts. B must still see the
// completion.
func TestNoLostWakeup(t *testing.T) {
	f := newFabric()
	const blk = 4096
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	a := newFakeNode(t, st, "a", Config{}, blk, f.dev("a0", -1))
	b := newFakeNode(t, st, "b", Config{}, blk, f.dev("b0", -1))
	segB, segA := openSeg(t, a, "b"), openSeg(t, b, "a")
	devB := b.devs[0]

	// A's endpoint to B: B holds target QPs for it on its rail.
	if err := transfer(t, a.Engine, fakeRequests(engine.Write, a, b, segB, 1, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := b.tr.TargetQPs(); n == 0 {
		t.Fatal("B holds no QPs for A")
	}

	// B's WRITE to A, held in flight; B's owner arms and sleeps.
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if q.d == devB {
			return hold, 0
		}
		return deliver, 0
	})
	rand.Read(b.Mem.Bytes())
	errc := make(chan error, 1)
	go func() { errc <- transfer(t, b.Engine, fakeRequests(engine.Write, b, a, segA, 1, blk), 3*time.Second) }()
	waitFor(t, "B's write held and B's CQ armed", func() bool { return f.nheld() == 1 && devB.arms.Load() > 0 })

	// While a destroy on B's rail holds the guard, B's write completes.
	var once sync.Once
	f.mu.Lock()
	f.onDestroy = func(q *fakeQP) {
		if q.d != devB {
			return
		}
		once.Do(func() { stall(f, devB) })
	}
	f.mu.Unlock()
	if err := a.Engine.CloseSegment(segB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to destroy the QPs it held for A", func() bool { return b.tr.TargetQPs() == 0 && devB.nqps.Load() == 2 })
	if err := <-errc; err != nil {
		t.Fatalf("B's write (completed while a QP on B's rail was being destroyed): %v; "+
			"CQ guard conflicts: %d, refused arms: %d", err, f.conflicts.Load(), devB.refused.Load())
	}
	if !bytes.Equal(a.Mem.Bytes(), b.Mem.Bytes()) {
		t.Fatal("A's memory differs from what B wrote")
	}
	if n := f.conflicts.Load(); n != 0 {
		t.Errorf("%d Poll or Arm calls found the CQ guard taken: a QP was destroyed off the rail's owner", n)
	}
}

// stall runs inside the destroy of a QP on d, with d's CQ guard held: it
// completes the held work request (an event: the CQ was armed), waits (at
// most 300 ms) until the rail's owner tried to arm the CQ again, and a
// little longer for the owner to go back to sleep.
func stall(f *fabric, d *fakeDev) {
	refused := d.refused.Load()
	if n := f.release(-1); n != 1 {
		panic(fmt.Sprintf("released %d work requests, want 1", n))
	}
	for deadline := time.Now().Add(300 * time.Millisecond); d.refused.Load() == refused && time.Now().Before(deadline); {
		time.Sleep(100 * time.Microsecond)
	}
	time.Sleep(5 * time.Millisecond)
}
