package perftest

import (
	"os"
	"testing"
)

func TestParseInvoluntary(t *testing.T) {
	for in, want := range map[string]int64{
		"Name:\tte\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t345\n": 345,
		"nonvoluntary_ctxt_switches:\t7":                                              7,
		"voluntary_ctxt_switches:\t12\n":                                              -1,
		"nonvoluntary_ctxt_switches:\tx\n":                                            -1,
		"":                                                                            -1,
	} {
		if got := parseInvoluntary([]byte(in)); got != want {
			t.Errorf("%q: %d, want %d", in, got, want)
		}
	}
}

// On Linux the count is summed over the process's threads, and a window gives a
// rate that is a number of switches per second (never negative).
func TestThreadPreempts(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skipf("no /proc/self/task: %v", err)
	}
	if n := involuntarySwitches(); n < 0 {
		t.Fatalf("involuntarySwitches = %d", n)
	}
	p := startThreadPreempts()
	x := 0
	for i := 0; i < 1e6; i++ {
		x += i
	}
	_ = x
	if r := p.stop(); r < 0 {
		t.Errorf("rate %v", r)
	}
}
