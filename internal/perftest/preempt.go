package perftest

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// threadPreempts counts how often the kernel took a CPU away from one of
// this process's threads (involuntary context switches, summed over
// /proc/self/task/*/status) over a measured window. The latency loop
// busy-polls and never blocks, so a switch of its thread is another
// thread that got the CPU in the middle of a round trip: a tail sample.
// On a 2-vCPU Soft-RoCE guest whose two CPUs both run a polling end, the
// Go runtime's monitor thread (sysmon, which wakes every 10 ms while a
// goroutine runs) causes most of them; perftest has no such thread.
type threadPreempts struct {
	start int64
	t0    time.Time
}

func startThreadPreempts() *threadPreempts {
	return &threadPreempts{start: involuntarySwitches(), t0: time.Now()}
}

// stop returns involuntary context switches per second since start, or -1
// where /proc does not say.
func (p *threadPreempts) stop() float64 {
	n := involuntarySwitches()
	d := time.Since(p.t0).Seconds()
	if n < 0 || p.start < 0 || d <= 0 {
		return -1
	}
	return float64(n-p.start) / d
}

// involuntarySwitches is nonvoluntary_ctxt_switches summed over the
// process's threads, or -1. A thread that exits in the window takes its
// count along; the latency loop's threads do not exit.
func involuntarySwitches() int64 {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	var sum int64
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		if n := parseInvoluntary(b); n > 0 {
			sum += n
		}
	}
	return sum
}

// parseInvoluntary finds nonvoluntary_ctxt_switches in a /proc status
// file, or returns -1.
func parseInvoluntary(b []byte) int64 {
	const key = "nonvoluntary_ctxt_switches:"
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return -1
	}
	line := b[i+len(key):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}
