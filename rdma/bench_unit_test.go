package rdma

import (
	"context"
	"testing"

	"github.com/rdmago/te/engine"
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
