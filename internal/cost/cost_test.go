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

// TestProcessCPU: a busy loop of 20ms adds CPU time, a sleep of 20ms
// (almost) none.
func TestProcessCPU(t *testing.T) {
	c0 := ProcessCPU()
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
	}
	c1 := ProcessCPU()
	time.Sleep(20 * time.Millisecond)
	c2 := ProcessCPU()
	if c0 <= 0 || c1-c0 < int64(5*time.Millisecond) || c2-c1 > int64(15*time.Millisecond) {
		t.Fatalf("CPU %v, +%v busy, +%v asleep", time.Duration(c0), time.Duration(c1-c0), time.Duration(c2-c1))
	}
}
