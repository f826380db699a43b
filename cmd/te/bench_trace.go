package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/ebpf"
)

// laneLabels lists the TCP lanes of both bench engines.
func (env *benchEnv) laneLabels() []laneLabel {
	return append(env.init.laneLabels(), env.target.laneLabels()...)
}

// benchTrace is te bench --trace: the bench's own connections traced with
// eBPF while it measures, summarised per lane at the end. Where eBPF is
// not available the bench runs untraced and the summary comes from the
// kernel's TCP_INFO of each lane.
type benchTrace struct {
	env     *benchEnv
	tr      *ebpf.Tracer
	err     error
	start   time.Time
	first   []ebpf.Conn
	wg      sync.WaitGroup
	states  atomic.Uint64
	retrans atomic.Uint64
}

func startBenchTrace(env *benchEnv, w io.Writer) *benchTrace {
	bt := &benchTrace{env: env, start: time.Now()}
	bt.tr, bt.err = ebpf.Open(ebpf.Filter{PID: os.Getpid()})
	if bt.err != nil {
		fmt.Fprintf(w, "te bench: --trace: %v; measuring untraced (lanes from TCP_INFO)\n", bt.err)
		return bt
	}
	bt.first, _ = bt.tr.Snapshot()
	bt.wg.Go(func() {
		for e := range bt.tr.Events() {
			if e.Kind == ebpf.Retransmit {
				bt.retrans.Add(1)
			} else {
				bt.states.Add(1)
			}
		}
	})
	return bt
}

// print writes the per-lane table: throughput is the average since the
// bench started.
func (bt *benchTrace) print(w io.Writer) error {
	labels := bt.env.laneLabels()
	elapsed := time.Since(bt.start)
	if bt.err != nil {
		conns := bt.env.laneInfos()
		fmt.Fprintf(w, "te bench: lanes (TCP_INFO; eBPF tracing unavailable):\n")
		printTraceTable(w, traceRows(conns, nil, elapsed, labels))
		return nil
	}
	cur, err := bt.tr.Snapshot()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "te bench: lanes (eBPF): %d state changes, %d retransmit events\n", bt.states.Load(), bt.retrans.Load())
	printTraceTable(w, traceRows(cur, bt.first, elapsed, labels))
	return nil
}

func (bt *benchTrace) Close() error {
	if bt == nil || bt.tr == nil {
		return nil
	}
	err := bt.tr.Close()
	bt.wg.Wait()
	return err
}
