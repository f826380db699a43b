package bench

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

// pair is an initiator and a target over real TCP on loopback, sharing an
// in-memory store: the smallest real thing a bench runs against.
func pair(t *testing.T, mem int) *Env {
	t.Helper()
	st := enginetest.NewMemStore()
	target := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, mem, tcp.New(tcp.Config{}))
	init := enginetest.NewNode(t, engine.Config{Name: "init", Store: st}, mem, tcp.New(tcp.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seg, err := init.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Engine: init.Engine, Local: init.Mem.Bytes(), Segment: seg,
		Remote: engine.AddrOf(target.Mem.Bytes()), TargetMem: target.Mem.Bytes()}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestRunTakingTurns(t *testing.T) {
	env := pair(t, 1<<20)
	var mu sync.Mutex
	var reports []Progress
	c := Config{Op: engine.Write, Block: 4096, Batch: 16, Threads: 2, Duration: 900 * time.Millisecond,
		Protocols: []string{"tcp"}, Memcpy: true, Baseline: true, Turn: 100 * time.Millisecond,
		Progress: func(p Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() }}
	rounds, turn := c.Rounds()
	if rounds != 3 || turn != 100*time.Millisecond {
		t.Fatalf("Rounds = %d, %v; want 3 of 100ms (900ms shared by 3 contenders)", rounds, turn)
	}
	start := time.Now()
	rs, err := Run(ctxT(t), env, c)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if len(rs) != 1 {
		t.Fatalf("%d results", len(rs))
	}
	r := rs[0]
	t.Logf("%+v in %v", *r, took)
	if r.Protocol != "tcp" || r.Operation != "write" || r.BlockSize != 4096 || r.BatchSize != 16 || r.Threads != 2 {
		t.Errorf("configuration echoed wrongly: %+v", r)
	}
	if r.Bytes == 0 || r.Requests != r.Batches*16 || r.Bytes != r.Requests*4096 {
		t.Errorf("counts disagree: %d bytes, %d batches, %d requests", r.Bytes, r.Batches, r.Requests)
	}
	if r.GBps <= 0 || r.P50Micros <= 0 || r.P99Micros < r.P50Micros || r.MaxMicros < r.P99Micros {
		t.Errorf("implausible numbers: %+v", r)
	}
	// tcp measured its share of the turns, not the whole duration.
	if r.Seconds < 0.25 || r.Seconds > 1.5 {
		t.Errorf("tcp measured %.2fs of a 0.9s run shared by three", r.Seconds)
	}
	if r.Baseline == nil || r.Baseline.Bytes == 0 || r.VsBaseline <= 0 {
		t.Errorf("baseline: %+v %v", r.Baseline, r.VsBaseline)
	}
	if r.Memcpy != nil {
		t.Errorf("memcpy attached to tcp: only shm is compared with it")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 3 {
		t.Fatalf("%d progress reports, want one per round: %+v", len(reports), reports)
	}
	for i, p := range reports {
		names := []string{}
		for _, r := range p.Rates {
			names = append(names, r.Name)
		}
		if p.Round != i+1 || p.Rounds != 3 || !slices.Equal(names, []string{"tcp", "memcpy", "baseline"}) {
			t.Errorf("report %d: %+v", i, p)
		}
	}
}

func TestRunProgressEachSecond(t *testing.T) {
	env := pair(t, 1<<20)
	var mu sync.Mutex
	var reports []Progress
	var stages []string
	c := Config{Op: engine.Read, Block: 4096, Batch: 8, Threads: 1, Duration: 2200 * time.Millisecond, Protocols: []string{"tcp"},
		Progress: func(p Progress) { mu.Lock(); reports = append(reports, p); mu.Unlock() },
		Stage:    func(s string) { stages = append(stages, s) }}
	rs, err := Run(ctxT(t), env, c)
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Operation != "read" || rs[0].Bytes == 0 {
		t.Fatalf("%+v", rs[0])
	}
	mu.Lock()
	defer mu.Unlock()
	// One a second; a third may come while the last batches finish.
	if len(reports) < 2 || reports[0].Rounds != 1 || reports[1].Elapsed < 2*time.Second || reports[0].Rates[0].Name != "tcp" {
		t.Errorf("reports %+v, want one a second", reports)
	}
	if len(stages) != 2 || stages[1] != "measuring" {
		t.Errorf("stages %q", stages)
	}
}

func TestVerify(t *testing.T) {
	env := pair(t, 1<<20)
	c := Config{Op: engine.Write, Block: 4096, Batch: 8, Threads: 2, Duration: time.Second, Protocols: []string{"tcp"}}
	ok, err := Verify(ctxT(t), env, c, "tcp")
	if err != nil || !ok {
		t.Fatalf("Verify = %v, %v", ok, err)
	}
	// Too little local memory for the read-back is an error, not a panic.
	env.Local = env.Local[:c.Footprint()]
	if _, err := Verify(ctxT(t), env, c, "tcp"); err == nil {
		t.Fatal("Verify with half the memory succeeded")
	}
}

func TestRunBadConfig(t *testing.T) {
	env := pair(t, 1<<16)
	for _, c := range []Config{
		{Block: 0, Batch: 1, Threads: 1, Duration: time.Second, Protocols: []string{"tcp"}},
		{Block: 4096, Batch: 1, Threads: 1, Duration: time.Second},
		{Block: 4096, Batch: 64, Threads: 1, Duration: time.Second, Protocols: []string{"tcp"}}, // 256KiB > 64KiB
		{Block: 4096, Batch: 2, Threads: 1, Duration: time.Second, Protocols: []string{"tcp"}, Latency: true},
	} {
		if _, err := Run(ctxT(t), env, c); err == nil {
			t.Errorf("Run(%+v) succeeded", c)
		}
	}
}

// TestLatency: batches of one request; the result's latency quantiles
// are ordered, within the batch latencies' range, and the mean lies
// between the smallest possible and the largest sample.
func TestLatency(t *testing.T) {
	env := pair(t, 1<<16)
	c := Config{Op: engine.Read, Block: 4096, Batch: 1, Threads: 1, Duration: 300 * time.Millisecond,
		Protocols: []string{"tcp"}, Latency: true}
	rs, err := Run(ctxT(t), env, c)
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	l := r.Latency
	if l == nil || r.Requests == 0 || r.Requests != r.Batches {
		t.Fatalf("latency %+v over %d requests in %d batches", l, r.Requests, r.Batches)
	}
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) || l.Mean <= 0 || l.Mean > l.Max {
		t.Fatalf("latency %+v", *l)
	}
	if l.P50 != r.P50Micros || l.Max != r.MaxMicros {
		t.Fatalf("latency %+v, batch latency p50 %v max %v: with batches of one they are the same", *l, r.P50Micros, r.MaxMicros)
	}
	// A request's latency bounds the rate one thread reaches.
	if ops := 1e6 / l.Mean; r.OpsPerSec > 1.05*ops {
		t.Fatalf("%.0f requests/s with a mean latency of %.1f µs", r.OpsPerSec, l.Mean)
	}
}

// The per-batch loop adds no allocations of its own.
func TestLoopAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	env := pair(t, 1<<20)
	c := Config{Op: engine.Write, Block: 4096, Batch: 32, Threads: 1}
	l := NewLoop(env, &c, 0, "tcp")
	ctx := ctxT(t)
	for range 10 {
		if err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	allocs := enginetest.AllocsPerRun(200, func() {
		if err := l.Step(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("one batch allocates %.2f times", allocs)
	}
}

func TestCeilings(t *testing.T) {
	ctx := ctxT(t)
	src, dst := make([]byte, 1<<16), make([]byte, 1<<16)
	Fill(src, 7)
	m, err := Memcpy(ctx, dst, src, 4096, 50*time.Millisecond)
	if err != nil || m.Bytes == 0 || m.GBps <= 0 || string(src) != string(dst) {
		t.Fatalf("Memcpy = %+v, %v", m, err)
	}
	if _, err := Memcpy(ctx, dst[:100], src, 4096, time.Millisecond); err == nil {
		t.Error("Memcpy of a block larger than the buffer succeeded")
	}
	b, err := Baseline(ctx, 4096, 1<<16, 50*time.Millisecond)
	if err != nil || b.Bytes == 0 || b.GBps <= 0 {
		t.Fatalf("Baseline = %+v, %v", b, err)
	}
}

func TestRailDelta(t *testing.T) {
	before := []Rail{{Device: "a", Bytes: 10, Slices: 1}, {Device: "b", Bytes: 5}}
	after := []Rail{{Device: "a", Bytes: 30, Slices: 3, Up: true}, {Device: "b", Bytes: 5, Errors: 2}}
	got := railDelta(before, after)
	want := []Rail{{Device: "a", Bytes: 20, Slices: 2, Up: true}, {Device: "b", Errors: 2}}
	if !slices.Equal(got, want) {
		t.Errorf("railDelta = %+v, want %+v", got, want)
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	var xs []time.Duration
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		d := time.Duration(r.ExpFloat64() * float64(time.Millisecond))
		xs = append(xs, d)
		h.record(d)
	}
	slices.Sort(xs)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		exact := xs[int(q*float64(len(xs)))-1]
		got := h.quantile(q)
		if diff := float64(got-exact) / float64(exact); diff > 0.04 || diff < -0.04 {
			t.Errorf("q%.2f = %v, exact %v (%.1f%% off)", q, got, exact, diff*100)
		}
	}
	if h.max != xs[len(xs)-1] || h.quantile(1) > h.max {
		t.Errorf("max %v, want %v", h.max, xs[len(xs)-1])
	}
	for i := range 64 * histSub / 2 {
		if lo := histLow(i); histIndex(lo) != i {
			t.Fatalf("bucket %d: low %d maps back to %d", i, lo, histIndex(lo))
		}
	}
}

// TestRunThreadsFail: when every thread's batches fail, Run's error is
// the first thread's, once, with how many others failed (the errors of
// 1000 threads joined made a line of 1000 chains).
func TestRunThreadsFail(t *testing.T) {
	env := pair(t, 1<<20)
	env.Remote += 1 << 30 // outside the target's buffer: every request fails
	_, err := Run(ctxT(t), env, Config{Op: engine.Write, Block: 4096, Batch: 4, Threads: 8, Duration: time.Second, Protocols: []string{"tcp"}})
	if err == nil {
		t.Fatal("Run succeeded outside the target's buffer")
	}
	msg := err.Error()
	if !errors.Is(err, engine.ErrOutOfRange) || !strings.HasSuffix(msg, "(and 7 more of the 8 threads)") || strings.Count(msg, "request 0:") != 1 || strings.Contains(msg, "\n") {
		t.Errorf("Run: %q; want the first thread's error once and that 7 more failed", msg)
	}
}
