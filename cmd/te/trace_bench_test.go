package main

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/internal/bench"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/internal/unix"
)

// BenchmarkTraceOverhead measures what tracing costs te bench: TCP over
// loopback to the in-process target, WRITE and READ at 64 KiB and 1 MiB,
// in rounds of one second that take turns untraced and traced (the
// tracer attached to this process's connections as te trace --pid does,
// and pulled once a second as te trace does), the order swapped every
// round. b.N is the number of rounds. It reports both rates, their
// ratio over all rounds and the median of each round's pair (robust to
// a neighbour's burst on a shared machine), and, from the kernel's BPF
// run-time statistics (enabled for the traced rounds), the CPU time the
// tracer's programs took per second of traced transfer, and the process's
// CPU time per GB moved either way. Run:
// go test -run '^$' -bench TraceOverhead -benchtime 10x ./cmd/te (root).
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
	env, err := setupBench(ctx, c, max(c.BufferSize, footprint), max(c.BufferSize, footprint), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	var bytes, secs, cpu [2]float64 // untraced, traced
	var bpfTime time.Duration
	var bpfRuns uint64
	var last [2]float64 // this round's rates
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
			stats, err := cebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				b.Fatal(err)
			}
			defer stats.Close()
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
		cpu0 := processCPU(b)
		rs, err := bench.Run(ctx, &env.Env, env.config(op, c.BlockSize))
		cpu[i] += processCPU(b) - cpu0
		close(stop)
		wg.Wait()
		if tr != nil {
			tr.Snapshot()
			d, n, cerr := tr.Cost()
			if cerr != nil {
				b.Fatal(cerr)
			}
			bpfTime += d
			bpfRuns += n
			tr.Close()
		}
		if err != nil {
			b.Fatal(err)
		}
		bytes[i] += float64(rs[0].Bytes)
		secs[i] += rs[0].Seconds
		last[i] = float64(rs[0].Bytes) / rs[0].Seconds
	}
	var pairs []float64
	b.ResetTimer()
	for round := range b.N {
		first := round%2 == 1
		measure(first)
		measure(!first)
		pairs = append(pairs, last[1]/last[0])
	}
	b.StopTimer()
	slices.Sort(pairs)
	u, t := bytes[0]/secs[0]/1e9, bytes[1]/secs[1]/1e9
	b.ReportMetric(u, "untraced_GB/s")
	b.ReportMetric(t, "traced_GB/s")
	b.ReportMetric(t/u, "traced/untraced")
	b.ReportMetric(pairs[len(pairs)/2], "median_pair")
	// CPU of the whole process (both engines, user and system) per GB
	// moved: less sensitive than the rate to what else runs.
	b.ReportMetric(cpu[0]/bytes[0]*1e9*1e3, "untraced_cpu_ms/GB")
	b.ReportMetric(cpu[1]/bytes[1]*1e9*1e3, "traced_cpu_ms/GB")
	b.ReportMetric(float64(bpfTime)/secs[1]/1e3, "bpf_us/s")
	b.ReportMetric(float64(bpfRuns)/secs[1], "bpf_runs/s")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the user and system CPU seconds this process has used.
func processCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
