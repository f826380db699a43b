//go:build linux

package unix

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	sys "golang.org/x/sys/unix"
)

// sharedWord maps a MAP_SHARED page (the futex's word must not be Go
// heap) and returns its first word.
func sharedWord(t *testing.T) *atomic.Uint32 {
	t.Helper()
	b, err := sys.Mmap(-1, 0, 4096, sys.PROT_READ|sys.PROT_WRITE, sys.MAP_SHARED|sys.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Munmap(b) })
	return (*atomic.Uint32)(unsafe.Pointer(&b[0]))
}

func TestFutexWaitValueChanged(t *testing.T) {
	w := sharedWord(t)
	w.Store(1)
	// The word does not hold 0: the call returns at once.
	if err := FutexWait(w, 0, time.Hour); err != nil {
		t.Fatalf("FutexWait on a changed word: %v, want nil", err)
	}
}

func TestFutexWaitTimeout(t *testing.T) {
	w := sharedWord(t)
	w.Store(2)
	t0 := time.Now()
	err := FutexWait(w, 2, 20*time.Millisecond)
	if !errors.Is(err, ETIMEDOUT) {
		t.Fatalf("FutexWait: %v, want ETIMEDOUT", err)
	}
	if d := time.Since(t0); d < 20*time.Millisecond {
		t.Fatalf("FutexWait returned after %v, before its 20ms", d)
	}
}

func TestFutexWake(t *testing.T) {
	w := sharedWord(t)
	if n, err := FutexWake(w, 1); err != nil || n != 0 {
		t.Fatalf("FutexWake with no waiter: %d, %v; want 0, nil", n, err)
	}
	w.Store(2)
	done := make(chan error, 1)
	go func() {
		for w.Load() == 2 {
			if err := FutexWait(w, 2, 0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	// Wake until the waiter is seen asleep and woken (it may not have
	// reached the kernel yet); the store alone would leave it waiting
	// only if it slept first.
	deadline := time.Now().Add(10 * time.Second)
	woke := 0
	for woke == 0 && time.Now().Before(deadline) {
		n, err := FutexWake(w, 1)
		if err != nil {
			t.Fatal(err)
		}
		woke = n
		time.Sleep(time.Millisecond)
	}
	if woke != 1 {
		t.Fatalf("no waiter was woken within 10s")
	}
	// Woken with the word unchanged, the waiter sleeps again; the store
	// and a wake end it.
	w.Store(0)
	FutexWake(w, 1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter still asleep 10s after the word changed and a wake")
	}
}
