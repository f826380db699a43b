package main

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"time"
)

// threadPreempts counts how often the kernel took the CPU away from the
// thread running a latency loop (involuntary context switches, from
// /proc/thread-self/status) over a measured window. A busy-polling loop
// never blocks, so every such switch is another thread that got the CPU
// in the middle of a round trip, and each one is a tail sample. On a
// 2-vCPU Soft-RoCE guest whose two CPUs both run a polling end, the Go
// runtime's own monitor thread (sysmon, which wakes every 10 ms while a
// goroutine runs) is most of them; perftest has no such thread.
type threadPreempts struct {
	start int64
	t0    time.Time
}

// startThreadPreempts locks the calling goroutine to its thread and starts
// counting; stop reports the rate and unlocks.
func startThreadPreempts() *threadPreempts {
	runtime.LockOSThread()
	return &threadPreempts{start: involuntarySwitches(), t0: time.Now()}
}

// stop returns involuntary context switches per second since start, or -1
// where /proc does not say.
func (p *threadPreempts) stop() float64 {
	defer runtime.UnlockOSThread()
	n := involuntarySwitches()
	d := time.Since(p.t0).Seconds()
	if n < 0 || p.start < 0 || d <= 0 {
		return -1
	}
	return float64(n-p.start) / d
}

// involuntarySwitches is nonvoluntary_ctxt_switches of the calling thread,
// or -1.
func involuntarySwitches() int64 {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		return -1
	}
	return parseInvoluntary(b)
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
