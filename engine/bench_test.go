package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

// BenchmarkLocal measures the engine's own cost per batch (validation,
// slicing, completion, waiting) with copies inside the local segment.
// Over sockets: tcp.BenchmarkEngine.
func BenchmarkLocal(b *testing.B) {
	const batch = 128
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			n := newNode(b, nil, "solo", 2*batch*size, tcp.Config{})
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: n.buf()[i*size : (i+1)*size], Target: engine.LocalSegment, TargetAddr: n.base() + uint64((batch+i)*size)}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(batch * size))
			start := time.Now()
			for b.Loop() {
				if err := n.e.Transfer(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "req/s")
		})
	}
}

// BenchmarkCost is the per-request cost of the local segment's path (the
// engine alone: copies in the submitting goroutine), stage by stage
// (enginetest.BenchCost, docs/cost.md). The transports' are shm's, tcp's
// and rdma's BenchmarkCost.
func BenchmarkCost(b *testing.B) {
	const size = 4 << 10
	batch := enginetest.CostBatch
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		b.Run(fmt.Sprintf("op=%v/size=4KiB", op), func(b *testing.B) {
			n := newNode(b, nil, "solo", 2*batch*size, tcp.Config{})
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: n.buf()[i*size : (i+1)*size], Target: engine.LocalSegment, TargetAddr: n.base() + uint64((batch+i)*size)}
			}
			enginetest.BenchCost(b, n.e, reqs)
		})
	}
}
