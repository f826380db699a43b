package shm

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// BenchmarkTransfer: batches of 128 requests between two engines of this
// process over shm, next to a single-thread copy of the same blocks
// between the same buffers (run with -benchmem: zero allocations per
// batch).
func BenchmarkTransfer(b *testing.B) {
	const batch = 128
	for _, blk := range []int{4 << 10, 64 << 10, 1 << 20} {
		ini, tgt, _, _, seg := inProcessPair(b, batch*blk, Config{})
		e := ini.Engine
		base := engine.AddrOf(tgt.Mem.Bytes())
		for _, op := range []engine.Op{engine.Write, engine.Read} {
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: seg, TargetAddr: base + uint64(i*blk)}
			}
			b.Run(fmt.Sprintf("%v/%dKiB", op, blk>>10), func(b *testing.B) {
				b.SetBytes(int64(batch * blk))
				b.ReportAllocs()
				ctx := context.Background()
				for b.Loop() {
					id, _ := e.AllocateBatch(batch)
					if err := e.Submit(id, reqs); err != nil {
						b.Fatal(err)
					}
					if err := e.Wait(ctx, id); err != nil {
						b.Fatal(err)
					}
					e.FreeBatch(id)
				}
			})
		}
		b.Run(fmt.Sprintf("memcpy/%dKiB", blk>>10), func(b *testing.B) {
			b.SetBytes(int64(batch * blk))
			src, dst := ini.Mem.Bytes(), tgt.Mem.Bytes()
			for b.Loop() {
				for off := 0; off < batch*blk; off += blk {
					copy(dst[off:off+blk], src[off:off+blk])
				}
			}
		})
	}
}

// BenchmarkCost is shm's per-request cost, stage by stage
// (enginetest.BenchCost, docs/cost.md): batches of 128 × 4 KiB between two
// engines of this process.
func BenchmarkCost(b *testing.B) {
	const blk = 4 << 10
	batch := enginetest.CostBatch
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		b.Run(fmt.Sprintf("op=%v/size=4KiB", op), func(b *testing.B) {
			ini, tgt, _, _, seg := inProcessPair(b, batch*blk, Config{})
			base := engine.AddrOf(tgt.Mem.Bytes())
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: seg, TargetAddr: base + uint64(i*blk)}
			}
			enginetest.BenchCost(b, ini.Engine, reqs)
		})
	}
}
