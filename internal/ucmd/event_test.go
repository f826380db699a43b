package ucmd

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// An event file is exercised with a pipe, which polls like the kernel's
// event files: readable when a record is queued.
func pipeEvents(t *testing.T) (*EventFile, int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	e, err := NewEventFile(p[0], "test-events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); unix.Close(p[1]) })
	return e, p[1]
}

func TestEventFileRead(t *testing.T) {
	e, w := pipeEvents(t)
	buf := make([]byte, 8)
	if _, ok, err := e.TryRead(buf); ok || err != nil {
		t.Fatalf("TryRead on an empty file: %v %v", ok, err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		unix.Write(w, []byte("12345678"))
	}()
	n, err := e.Read(context.Background(), buf)
	if err != nil || n != 8 || string(buf) != "12345678" {
		t.Fatalf("Read: %d %q %v", n, buf, err)
	}
	unix.Write(w, []byte("abcdefgh"))
	if n, ok, err := e.TryRead(buf); !ok || err != nil || n != 8 {
		t.Fatalf("TryRead: %d %v %v", n, ok, err)
	}
	// Deadline and cancellation return the context's error, and the file
	// stays usable afterwards.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := e.Read(ctx, buf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read past deadline: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel2() }()
	if _, err := e.Read(ctx2, buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("Read after cancel: %v", err)
	}
	unix.Write(w, []byte("again..."))
	if n, err := e.Read(context.Background(), buf); err != nil || n != 8 {
		t.Fatalf("Read after a cancelled read: %d %v", n, err)
	}
	// Close wakes a blocked reader.
	done := make(chan error)
	go func() {
		_, err := e.Read(context.Background(), buf)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("blocked Read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the reader")
	}
	if err := e.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

// A record that is already queued is read without allocating, whatever the
// context: completion loops call Read once per event.
func TestEventFileReadQueuedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	e, w := pipeEvents(t)
	buf := make([]byte, 8)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := []byte("12345678")
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"background", context.Background()}, {"cancellable", ctx}} {
		allocs := testing.AllocsPerRun(200, func() {
			unix.Write(w, rec)
			if n, err := e.Read(c.ctx, buf); err != nil || n != 8 {
				t.Fatalf("Read: %d %v", n, err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Read of a queued record allocates %v times", c.name, allocs)
		}
	}
}
