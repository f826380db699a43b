package main

import (
	"fmt"
	"io"

	"github.com/rdmago/te/internal/perftest"
)

// perfPrinter prints results as they come, as perftest's table (its
// header once).
type perfPrinter struct {
	w      io.Writer
	gbits  bool
	header bool
}

func (p *perfPrinter) print(r perftest.Result) {
	if !p.header {
		p.header = true
		name := map[string]string{"write": "RDMA Write", "read": "RDMA Read", "send": "Send"}[r.Op]
		kind := map[string]string{"bw": "BW", "lat": "Latency"}[r.Test]
		fmt.Fprintf(p.w, "te perf: %s %s test, %s -> %s, path MTU %d\n", name, kind, r.Device, r.Peer, r.MTU)
		switch {
		case r.Test == "bw" && p.gbits:
			fmt.Fprintf(p.w, " %-10s %-12s %-20s %s\n", "#bytes", "#iterations", "BW average[Gb/sec]", "MsgRate[Mpps]")
		case r.Test == "bw":
			fmt.Fprintf(p.w, " %-10s %-12s %-20s %s\n", "#bytes", "#iterations", "BW average[MB/sec]", "MsgRate[Mpps]")
		default:
			fmt.Fprintf(p.w, " %-8s %-12s %-12s %-12s %-16s %-12s %-14s %-16s %s\n", "#bytes", "#iterations", "t_min[usec]",
				"t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile", "99.9% percentile")
		}
	}
	if r.Test == "bw" {
		bw := r.MBps
		if p.gbits {
			bw = r.Gbps()
		}
		fmt.Fprintf(p.w, " %-10d %-12d %-20.2f %.6f\n", r.Bytes, r.Iters, bw, r.Mpps)
		return
	}
	fmt.Fprintf(p.w, " %-8d %-12d %-12.2f %-12.2f %-16.2f %-12.2f %-14.2f %-16.2f %.2f\n", r.Bytes, r.Iters,
		r.MinUS, r.MaxUS, r.TypicalUS, r.AvgUS, r.StdevUS, r.P99US, r.P999US)
	if r.PreemptPerS > 0 {
		fmt.Fprintf(p.w, " threads preempted %.0f times/s (involuntary context switches)\n", r.PreemptPerS)
	}
}
