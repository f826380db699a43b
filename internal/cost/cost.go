// Package cost attributes the data path's CPU time to its stages, for the
// per-request cost benchmarks (BenchmarkCost in engine, shm, tcp and rdma;
// docs/cost.md). The engine and the transports read the clock at stage
// boundaries that lie between loops over a whole submission, a chunk of
// slices or one owner-loop pass, never inside a per-request loop (tcp's
// reader, which handles one reply at a time, is the exception): a stage's
// total divided by the requests moved is its cost per request.
//
// Off, which is the default and the only state outside benchmarks, a
// boundary costs one atomic load and a branch. The counters are
// process-wide: a benchmark enables them around its measured loop, with
// nothing else moving bytes in the process.
package cost

import (
	"sync/atomic"
	"syscall"
	"time"
)

// Stage is one step of a request's way through the engine and a transport.
type Stage uint8

// Stages, in the order a request meets them.
const (
	// Resolve: Submit's batch lookup and, per request, validation, the
	// local region's lookup and pin, the target segment's state and
	// buffer.
	Resolve Stage = iota
	// Admit: per target segment and transport, counting the tasks in
	// flight on the segment and the transport and finding the peer.
	Admit
	// Slice: accounting for the tasks and cutting them into the
	// transport's slices.
	Slice
	// Enqueue: the transport's Submit up to the move: routing, queueing
	// for a rail's owner or a lane's writer.
	Enqueue
	// Move: the copy (shm, the local segment), the post (rdma: building
	// work requests and ringing the doorbell; on the fake fabric, the
	// fake device's copy too) or the frames' write (tcp).
	Move
	// Complete: the transport's completion handling (rdma's poll, tcp's
	// reply reader) and the engine's task and batch accounting.
	Complete
	// Wait: the time the submitter spends in Wait, wall clock: what it
	// waits for runs on other goroutines.
	Wait
	// Status: Status and BatchStatus.
	Status
	// Serve: a target's handling of requests it serves (tcp's server,
	// in an in-process pair).
	Serve
	// NumStages counts the stages.
	NumStages
)

var names = [NumStages]string{"resolve", "admit", "slice", "enqueue", "move", "complete", "wait", "status", "serve"}

// String is the stage's metric name.
func (s Stage) String() string {
	if s < NumStages {
		return names[s]
	}
	return "stage?"
}

var (
	on    atomic.Bool
	base  = time.Now()
	total [NumStages]atomic.Int64
)

// Enable turns the clock on or off.
func Enable(b bool) { on.Store(b) }

// Now returns the clock when it is on, else 0: the start of a stage.
func Now() int64 {
	if !on.Load() {
		return 0
	}
	return int64(time.Since(base)) | 1
}

// Since adds the time since t (a Now, or 0 when the clock was off then)
// to s and returns the clock again, the start of the next stage.
func (s Stage) Since(t int64) int64 {
	if t == 0 {
		return 0
	}
	now := int64(time.Since(base)) | 1
	total[s].Add(now - t)
	return now
}

// Add adds ns to s (a part of another stage's time that belongs to s:
// add it here and its negative there).
func (s Stage) Add(ns int64) {
	if ns != 0 {
		total[s].Add(ns)
	}
}

// Reset zeroes every stage's total.
func Reset() {
	for i := range total {
		total[i].Store(0)
	}
}

// Totals returns each stage's accumulated nanoseconds.
func Totals() (out [NumStages]int64) {
	for i := range total {
		out[i] = total[i].Load()
	}
	return out
}

// Reporter is what a benchmark reports metrics to (testing.B).
type Reporter interface {
	ReportMetric(n float64, unit string)
}

// Report reports each stage's nanoseconds per request over reqs requests
// as "<stage>-ns/req", and their sum without Wait (CPU time, while Wait is
// a wall time) as "cpu-ns/req".
func Report(b Reporter, reqs int) {
	if reqs <= 0 {
		return
	}
	t := Totals()
	var cpu float64
	for s := range NumStages {
		v := float64(t[s]) / float64(reqs)
		b.ReportMetric(v, s.String()+"-ns/req")
		if s != Wait {
			cpu += v
		}
	}
	b.ReportMetric(cpu, "cpu-ns/req")
}

// ProcessCPU is the CPU time this process has used, user and system, in
// nanoseconds (0 if the kernel does not say). Divided by the requests of
// a measured loop it is their cost where the stage clock, a wall clock,
// also counts the time a loaded machine's scheduler took the CPU away.
func ProcessCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
