//go:build linux

package unix

// Futexes on a 32-bit word shared between processes: the word lives in a
// MAP_SHARED mapping (never the Go heap, which may move), and the calls
// leave FUTEX_PRIVATE_FLAG clear, so the kernel keys a wait by the
// mapping's page, not by the address space, and a waker in another
// process finds it. The word's address is converted in the calls'
// argument lists, which keeps the mapping referenced for the call.

import (
	"sync/atomic"
	"time"
	"unsafe"

	sys "golang.org/x/sys/unix"
)

// linux/futex.h.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// ETIMEDOUT is FutexWait's error when its time passed.
const ETIMEDOUT = sys.ETIMEDOUT

// FutexWait blocks while *w holds val, at most for d (none if d <= 0).
// It returns nil when woken, at once when *w does not hold val (EAGAIN),
// and on a signal (EINTR): the caller looks at the word again. It
// returns ETIMEDOUT once d has passed. The scheduler is told: the
// calling goroutine's thread blocks in the kernel, and the runtime hands
// its P on.
func FutexWait(w *atomic.Uint32, val uint32, d time.Duration) error {
	var ts *Timespec
	if d > 0 {
		t := sys.NsecToTimespec(int64(d))
		ts = &t
	}
	_, _, e := sys.Syscall6(sys.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	switch e {
	case 0, sys.EAGAIN, sys.EINTR:
		return nil
	}
	return e
}

// FutexWake wakes at most n of the threads waiting on w and returns how
// many it woke. It does not block: it is made with RawSyscall, so the
// scheduler is not told and no P is handed off for it.
func FutexWake(w *atomic.Uint32, n int) (int, error) {
	r, _, e := sys.RawSyscall6(sys.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
