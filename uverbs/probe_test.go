package uverbs

import (
	"errors"
	"testing"

	"github.com/rdmago/te/internal/ucmd"
)

// TestIoctlProbe: a method the kernel lacks is tried once; later calls go
// straight to the write() fallback. ENOTTY (no ioctl channel) retires
// every method, EPROTONOSUPPORT only the one; other errors retire nothing.
func TestIoctlProbe(t *testing.T) {
	var p ioctlProbe
	calls := map[uint16]int{}
	answer := map[uint16]error{1: ucmd.EPROTONOSUPPORT, 2: nil, 3: ucmd.EINVAL}
	call := func(m uint16) error {
		return p.run(7, m, func() error { calls[m]++; return answer[m] })
	}
	for range 3 {
		if err := call(1); !noIoctl(err) {
			t.Fatalf("missing method: %v", err)
		}
		if err := call(2); err != nil {
			t.Fatalf("present method: %v", err)
		}
		if err := call(3); !errors.Is(err, ucmd.EINVAL) {
			t.Fatalf("failing method: %v", err)
		}
	}
	if calls[1] != 1 || calls[2] != 3 || calls[3] != 3 {
		t.Errorf("ioctls issued %v, want the missing method once and the others every time", calls)
	}
	// A kernel without the channel: after one ENOTTY nothing is tried.
	answer[4] = ucmd.ENOTTY
	if err := call(4); !noIoctl(err) {
		t.Fatal(err)
	}
	if err := call(2); !noIoctl(err) || calls[2] != 3 {
		t.Errorf("after ENOTTY: %v, %d calls", err, calls[2])
	}
	// The same method of another object is its own question.
	var q ioctlProbe
	q.run(7, 1, func() error { return ucmd.EPROTONOSUPPORT })
	n := 0
	q.run(8, 1, func() error { n++; return nil })
	if n != 1 {
		t.Error("a missing method of one object retired another object's")
	}
}
