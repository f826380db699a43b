package enginetest

import "testing"

// SteadyAllocs measures f's allocations per call with
// testing.AllocsPerRun(runs, f), up to tries times, and returns the
// first zero or else the smallest measurement, with every measurement
// taken. AllocsPerRun counts the whole process's allocations: a
// goroutine the scheduler starved until then (a store watcher decoding a
// descriptor, a previous test's cleanup) can land a hundred of them in
// one window on a loaded machine. An allocation f itself makes shows in
// every try.
func SteadyAllocs(runs, tries int, f func()) (float64, []float64) {
	var all []float64
	best := -1.0
	for range max(tries, 1) {
		a := testing.AllocsPerRun(runs, f)
		all = append(all, a)
		if best < 0 || a < best {
			best = a
		}
		if a == 0 {
			break
		}
	}
	return best, all
}

// AllocsPerRun is SteadyAllocs(runs, 3, f)'s measurement, for tests of a
// whole engine, whose background goroutines share the process's count.
func AllocsPerRun(runs int, f func()) float64 {
	a, _ := SteadyAllocs(runs, 3, f)
	return a
}
