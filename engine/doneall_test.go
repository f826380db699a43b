package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
)

// keeper is a fake transport that keeps the slices it is given until the
// test completes them, with driver.DoneAll, and cuts requests into slices
// of sliceSize bytes.
type keeper struct {
	*fake
	sliceSize uint64
	mu        sync.Mutex
	held      []*driver.Slice
}

func (h *keeper) Driver() driver.Transport { return h }
func (h *keeper) SliceSize() uint64        { return h.sliceSize }
func (h *keeper) Submit(ss []*driver.Slice) {
	h.mu.Lock()
	h.held = append(h.held, ss...)
	h.mu.Unlock()
}

func (h *keeper) take() []*driver.Slice {
	h.mu.Lock()
	defer h.mu.Unlock()
	ss := h.held
	h.held = nil
	return ss
}

// TestDoneAll: one DoneAll call completes the slices of two batches, one
// of whose tasks has several slices, in an order that mixes them: every
// task ends COMPLETED with its bytes, each batch's status sums them, and
// the pins and in-flight counts are all dropped (the memory unregisters,
// the segment closes and the transport uninstalls at once). Completing a
// slice twice panics.
func TestDoneAll(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 1<<16, &fake{name: "x"})
	h := &keeper{fake: &fake{name: "x"}, sliceSize: 1024}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	taddr := engine.AddrOf(tgt.Mem.Bytes())
	mem := ini.Mem.Bytes()
	b1, _ := e.AllocateBatch(3)
	b2, _ := e.AllocateBatch(2)
	sizes := map[engine.BatchID][]int{b1: {512, 4096, 64}, b2: {1000, 1024}}
	off := 0
	for _, b := range []engine.BatchID{b1, b2} {
		var reqs []engine.Request
		for _, n := range sizes[b] {
			reqs = append(reqs, engine.Request{Op: engine.Write, Local: mem[off : off+n], Target: seg, TargetAddr: taddr + uint64(off)})
			off += n
		}
		if err := e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
	}
	ss := h.take()
	if len(ss) != 1+4+1+1+1 {
		t.Fatalf("%d slices, want 8 (4096 bytes cut into 4)", len(ss))
	}
	// Interleave the batches and split the multi-slice task.
	mixed := []*driver.Slice{ss[1], ss[5], ss[2], ss[0], ss[6], ss[3], ss[7], ss[4]}
	if bs, _ := e.BatchStatus(b1); bs.State != engine.StatePending {
		t.Fatalf("batch 1 %v before its slices are done", bs.State)
	}
	driver.DoneAll(mixed)
	for _, b := range []engine.BatchID{b1, b2} {
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for i, n := range sizes[b] {
			ts, _ := e.Status(b, i)
			if ts.State != engine.StateCompleted || ts.Transferred != uint64(n) {
				t.Errorf("batch %v task %d: %+v, want COMPLETED with %d bytes", b, i, ts, n)
			}
			sum += uint64(n)
		}
		if bs, _ := e.BatchStatus(b); bs.State != engine.StateCompleted || bs.Transferred != sum || bs.Transport != "x" || bs.Layer != engine.LayerCompleted {
			t.Errorf("batch %v: %+v, want COMPLETED, %d bytes over x", b, bs, sum)
		}
		if err := e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a second DoneAll of the same slices did not panic")
			}
		}()
		driver.DoneAll(mixed[:1])
	}()
	if err := e.CloseSegment(seg); err != nil {
		t.Fatalf("close segment after DoneAll: %v (in-flight count left)", err)
	}
	if err := e.UnregisterLocalMemory(mem); err != nil {
		t.Fatalf("unregister after DoneAll: %v (pin left)", err)
	}
	if err := e.Uninstall("x"); err != nil {
		t.Fatalf("uninstall after DoneAll: %v (transport's in-flight count left)", err)
	}
}

// TestDoneAllStates: the tasks DoneAll completes are published as
// COMPLETED in runs (a bit per task, words of 64): in a batch of 200
// tasks of one slice submitted in two calls, slices completed in a
// shuffled order, piece by piece, leave exactly those tasks COMPLETED
// with their bytes and the others PENDING with none; one failed with
// Done is FAILED with what it reported. A freed and reallocated batch
// (the same one, from the pool) starts with every task pending.
func TestDoneAllStates(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 1<<16, &fake{name: "x"})
	h := &keeper{fake: &fake{name: "x"}, sliceSize: 1 << 20}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	taddr := engine.AddrOf(tgt.Mem.Bytes())
	mem := ini.Mem.Bytes()
	const n = 200
	size := func(i int) int { return 64 + i }
	reqs := make([]engine.Request, n)
	off := 0
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Read, Local: mem[off : off+size(i)], Target: seg, TargetAddr: taddr + uint64(off)}
		off += size(i)
	}
	for round := range 2 {
		b, _ := e.AllocateBatch(n)
		for _, part := range [][]engine.Request{reqs[:70], reqs[70:]} {
			if err := e.Submit(b, part); err != nil {
				t.Fatal(err)
			}
		}
		ss := h.take()
		if len(ss) != n {
			t.Fatalf("%d slices, want %d", len(ss), n)
		}
		index := make(map[*driver.Slice]int, n)
		for i, s := range ss {
			index[s] = i
		}
		check := func(done map[int]bool, failed int) {
			t.Helper()
			for i := range n {
				ts, _ := e.Status(b, i)
				switch {
				case i == failed:
					if ts.State != engine.StateFailed || ts.Transferred != 3 {
						t.Fatalf("round %d task %d: %v with %d bytes, want FAILED with 3", round, i, ts.State, ts.Transferred)
					}
				case done[i]:
					if ts.State != engine.StateCompleted || ts.Transferred != uint64(size(i)) {
						t.Fatalf("round %d task %d: %v with %d bytes, want COMPLETED with %d", round, i, ts.State, ts.Transferred, size(i))
					}
				default:
					if ts.State != engine.StatePending || ts.Transferred != 0 {
						t.Fatalf("round %d task %d: %v with %d bytes, want PENDING with none", round, i, ts.State, ts.Transferred)
					}
				}
			}
		}
		check(nil, -1)
		order := rand.New(rand.NewPCG(uint64(round), 1)).Perm(n)
		// Long runs of consecutive tasks too: sort pieces of the order.
		slices.Sort(order[:90])
		slices.Sort(order[120:180])
		failed := order[n-1]
		done := map[int]bool{}
		for lo := 0; lo < n-1; {
			hi := min(lo+1+lo%37, n-1)
			piece := make([]*driver.Slice, 0, hi-lo)
			for _, i := range order[lo:hi] {
				piece = append(piece, ss[i])
				done[index[ss[i]]] = true
			}
			driver.DoneAll(piece)
			check(done, -1)
			lo = hi
		}
		ss[failed].Done(3, errors.New("test: refused"))
		check(done, failed)
		if err := e.Wait(ctx, b); err == nil {
			t.Fatalf("round %d: Wait succeeded with task %d failed", round, failed)
		}
		if bs, _ := e.BatchStatus(b); bs.State != engine.StateFailed {
			t.Fatalf("round %d: batch %v, want FAILED", round, bs.State)
		}
		if err := e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
	}
}
