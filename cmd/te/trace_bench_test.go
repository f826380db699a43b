package main

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/internal/testenv"
)

// BenchmarkTraceOverhead measures what tracing costs te bench: TCP over
// loopback to the in-process target, WRITE and READ at 64 KiB and 1 MiB,
// in rounds of one second that take turns untraced and traced (the
// tracer attached to this process's connections as te trace --pid does,
// and pulled once a second as te trace does), the order swapped every
// round. b.N is the number of rounds; it reports both rates and
// traced/untraced. Run: go test -run '^$' -bench TraceOverhead
// -benchtime 10x ./cmd/te (needs root).
func BenchmarkTraceOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		testenv.Unavailable(b, "tracing needs root")
	}
	for _, op := range []string{"write", "read"} {
		for _, block := range []string{"64KiB", "1MiB"} {
			b.Run(op+"/"+block, func(b *testing.B) { traceOverhead(b, op, block) })
		}
	}
}

func traceOverhead(b *testing.B, op, block string) {
	c, err := parseBench([]string{"--protocol", "tcp", "--operation", op, "--block-size", block, "--duration", "1", "--quiet"}, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	footprint := c.BlockSize * int64(c.BatchSize) * int64(c.Threads)
	env, err := setupBench(ctx, c, max(c.BufferSize, footprint), max(c.BufferSize, footprint))
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	var bytes, secs [2]float64 // untraced, traced
	measure := func(traced bool) {
		i := 0
		var tr *ebpf.Tracer
		var wg sync.WaitGroup
		stop := make(chan struct{})
		if traced {
			i = 1
			if tr, err = ebpf.Open(ebpf.Filter{PID: os.Getpid()}); errors.Is(err, ebpf.ErrUnsupported) {
				testenv.Unavailable(b, "%v", err)
			} else if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						tr.Snapshot()
					}
				}
			})
		}
		rs, err := env.run(ctx, op, c.BlockSize, io.Discard)
		close(stop)
		wg.Wait()
		if tr != nil {
			tr.Snapshot()
			tr.Close()
		}
		if err != nil {
			b.Fatal(err)
		}
		bytes[i] += float64(rs[0].Bytes)
		secs[i] += rs[0].Seconds
	}
	b.ResetTimer()
	for round := range b.N {
		first := round%2 == 1
		measure(first)
		measure(!first)
	}
	b.StopTimer()
	u, t := bytes[0]/secs[0]/1e9, bytes[1]/secs[1]/1e9
	b.ReportMetric(u, "untraced_GB/s")
	b.ReportMetric(t, "traced_GB/s")
	b.ReportMetric(t/u, "traced/untraced")
	b.ReportMetric(0, "ns/op")
}
