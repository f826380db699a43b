package rdma

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// BenchmarkFakeBatch is the CPU cost of one batch of 128 small WRITEs
// over two rails of the fake fabric (the device's work is a 64-byte
// copy): the engine, Submit, the rail owners and the completions.
func BenchmarkFakeBatch(b *testing.B) {
	f := newFabric()
	const tasks, blk = 128, 64
	ini, tgt, seg := fakePair(b, f, Config{}, tasks*blk, 2)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		id, err := ini.Engine.AllocateBatch(tasks)
		if err == nil {
			err = ini.Engine.Submit(id, reqs)
		}
		if err == nil {
			err = ini.Engine.Wait(ctx, id)
		}
		if err == nil {
			err = ini.Engine.FreeBatch(id)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCost is rdma's per-request cost, stage by stage
// (enginetest.BenchCost, docs/cost.md), over two rails of the fake fabric:
// batches of 128 × 4 KiB, the fake device copying in the post.
func BenchmarkCost(b *testing.B) {
	const blk = 4 << 10
	batch := enginetest.CostBatch
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		b.Run(fmt.Sprintf("op=%v/size=4KiB", op), func(b *testing.B) {
			f := newFabric()
			ini, tgt, seg := fakePair(b, f, Config{}, batch*blk, 2)
			enginetest.BenchCost(b, ini.Engine, fakeRequests(op, ini, tgt, seg, batch, blk))
		})
	}
}
