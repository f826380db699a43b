package enginetest

import (
	"context"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/cost"
)

// CostBatch is the batch size of the per-request cost benchmarks.
const CostBatch = 128

// BenchCost runs te bench's loop over e (allocate a batch, submit reqs,
// wait, read the batch's status, free it) with the stage clock of
// internal/cost on, and reports each stage's nanoseconds per request
// (metrics "<stage>-ns/req", docs/cost.md), their sum without Wait
// ("cpu-ns/req"), the wall time per request ("ns/req") and the process's
// CPU time per request ("proc-cpu-ns/req": every goroutine, the target's
// too when it runs in this process, spinning included; unlike the stage
// clock it does not count time the scheduler gave other processes). Nothing else in the process
// may move bytes meanwhile: the clock's totals are process-wide. Run it
// with -benchmem: allocs/op are per batch.
func BenchCost(b *testing.B, e *engine.Engine, reqs []engine.Request) {
	b.Helper()
	ctx := context.Background()
	step := func() {
		id, err := e.AllocateBatch(len(reqs))
		if err == nil {
			err = e.Submit(id, reqs)
		}
		if err == nil {
			err = e.Wait(ctx, id)
		}
		if err == nil {
			var st engine.TaskStatus
			if st, err = e.BatchStatus(id); err == nil && st.State != engine.StateCompleted {
				b.Fatalf("batch %v after Wait", st.State)
			}
		}
		if err == nil {
			err = e.FreeBatch(id)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	// Warm up: connections made, queues and rings sized, memory touched.
	for range 8 {
		step()
	}
	var bytes int64
	for i := range reqs {
		n := int64(reqs[i].Length)
		if n == 0 {
			n = int64(len(reqs[i].Local))
		}
		bytes += n
	}
	b.SetBytes(bytes)
	b.ReportAllocs()
	cost.Reset()
	cost.Enable(true)
	defer cost.Enable(false)
	start, cpu := time.Now(), cost.ProcessCPU()
	n := 0
	for b.Loop() {
		step()
		n++
	}
	el, cpu := time.Since(start), cost.ProcessCPU()-cpu
	cost.Enable(false)
	cost.Report(b, n*len(reqs))
	b.ReportMetric(float64(el.Nanoseconds())/float64(n*len(reqs)), "ns/req")
	b.ReportMetric(float64(cpu)/float64(n*len(reqs)), "proc-cpu-ns/req")
}
