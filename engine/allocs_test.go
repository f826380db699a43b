package engine_test

import (
	"context"
	"github.com/rdmago/te/engine/enginetest"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/tcp"
)

// TestSteadyStateAllocsLocal: the engine's own path (batch reuse, request
// validation, slicing, completion, status) allocates nothing once warm.
// The tcp package proves the same over sockets.
func TestSteadyStateAllocsLocal(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	n := newNode(t, nil, "solo", 1<<20, tcp.Config{})
	reqs := make([]engine.Request, 64)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: n.buf()[i*4096 : (i+1)*4096], Target: engine.LocalSegment, TargetAddr: n.base() + 512<<10 + uint64(i*4096)}
	}
	ctx := context.Background()
	var failed error
	run := func() {
		b, err := n.e.AllocateBatch(len(reqs))
		if err == nil {
			err = n.e.Submit(b, reqs)
		}
		if err == nil {
			err = n.e.Wait(ctx, b)
		}
		if err == nil {
			_, err = n.e.Status(b, 3)
		}
		if err == nil {
			_, err = n.e.BatchStatus(b)
		}
		if err == nil {
			err = n.e.FreeBatch(b)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	run()
	if a := enginetest.AllocsPerRun(100, run); a != 0 || failed != nil {
		t.Fatalf("%v allocations per batch (%v)", a, failed)
	}
}
