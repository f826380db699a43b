package cost

import (
	"testing"
	"time"
)

type metrics map[string]float64

func (m metrics) ReportMetric(n float64, unit string) { m[unit] = n }

// TestStages: off, the clock reads 0 and nothing accumulates; on, a
// stage's total grows by the time it took and Report divides by the
// requests.
func TestStages(t *testing.T) {
	Reset()
	if Now() != 0 || Move.Since(Now()) != 0 {
		t.Fatal("the clock reads while off")
	}
	Enable(true)
	defer Enable(false)
	t0 := Now()
	time.Sleep(2 * time.Millisecond)
	t1 := Move.Since(t0)
	Wait.Since(t1)
	if got := Totals()[Move]; got < int64(2*time.Millisecond) {
		t.Fatalf("move total %v, want at least 2ms", time.Duration(got))
	}
	m := metrics{}
	Report(m, 2)
	if m["move-ns/req"] < 1e6 || m["cpu-ns/req"] != m["move-ns/req"] {
		t.Fatalf("report %v", m)
	}
	Reset()
	if Totals()[Move] != 0 {
		t.Fatal("Reset left a total")
	}
	if NumStages.String() != "stage?" || Serve.String() != "serve" {
		t.Fatal("stage names")
	}
}

// TestProcessCPU: spinning adds CPU time, a sleep of 50 ms (almost)
// none.
func TestProcessCPU(t *testing.T) {
	// Spin until the process has used 10 ms of CPU: a loaded machine
	// may give a spinning goroutine a fraction of the wall time, so the
	// bound is on how long that takes, not on a wall-clock slice.
	c0 := ProcessCPU()
	if c0 <= 0 {
		t.Fatalf("process CPU %v", time.Duration(c0))
	}
	deadline := time.Now().Add(10 * time.Second)
	for ProcessCPU()-c0 < int64(10*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("process CPU +%v after 10 s of spinning", time.Duration(ProcessCPU()-c0))
		}
	}
	c1 := ProcessCPU()
	time.Sleep(50 * time.Millisecond)
	if d := ProcessCPU() - c1; d > int64(25*time.Millisecond) {
		t.Fatalf("process CPU +%v over a 50 ms sleep", time.Duration(d))
	}
}
