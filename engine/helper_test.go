package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
)

// helper is a keeper whose held slices the caller of Wait completes
// itself (driver.Helper) when complete is set; it records what Help saw.
type helper struct {
	*keeper
	complete bool
	calls    int
	sawDone  bool // done reported true after Help completed the slices
}

func (h *helper) Driver() driver.Transport { return h }
func (h *helper) Help(ctx context.Context, done func() bool) {
	h.calls++
	if !h.complete {
		return
	}
	ss := h.take()
	driver.DoneAll(ss)
	h.sawDone = done()
}

// TestWaitHelper: Wait asks a driver.Helper transport to complete the
// batch on the waiting goroutine and returns once done says so; a Helper
// that leaves the batch in flight leaves Wait to the completions that
// come later (or to its ctx); a batch already finished is not helped.
func TestWaitHelper(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 1<<16, &fake{name: "x"})
	h := &helper{keeper: &keeper{fake: &fake{name: "x"}, sliceSize: 1024}, complete: true}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes())}}

	b, _ := e.AllocateBatch(1)
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if h.calls != 1 || !h.sawDone {
		t.Fatalf("Help called %d times, saw done %v; want once, true", h.calls, h.sawDone)
	}
	if bs, _ := e.BatchStatus(b); bs.State != engine.StateCompleted || bs.Transferred != 4096 {
		t.Fatalf("helped batch: %+v", bs)
	}
	// Finished: Wait does not ask again.
	if err := e.Wait(ctx, b); err != nil || h.calls != 1 {
		t.Fatalf("second wait: %v, Help called %d times", err, h.calls)
	}
	e.FreeBatch(b)

	// A Helper that completes nothing: Wait waits for the completion
	// that comes from elsewhere, and honours its ctx meanwhile.
	h.complete = false
	b, _ = e.AllocateBatch(1)
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err = e.Wait(short, b)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with nothing completed: %v, want the ctx's deadline", err)
	}
	go driver.DoneAll(h.take())
	if err := e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	// Asked again unless the completion came first.
	if h.calls != 2 && h.calls != 3 {
		t.Fatalf("Help called %d times, want 2 or 3", h.calls)
	}
	e.FreeBatch(b)
}
