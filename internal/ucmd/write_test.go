package ucmd

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmago/te/internal/unix"
)

// Both command writers deliver the whole command, report the kernel's
// errno, and allocate nothing; a pipe stands in for the uverbs fd.
func TestRawAndQuickWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(int, []byte) error
	}{{"RawWrite", RawWrite}, {"QuickWrite", QuickWrite}} {
		t.Run(tc.name, func(t *testing.T) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			cmd := []byte("0123456789abcdef0123456789abcdef")
			if err := tc.write(p[1], cmd); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 64)
			n, err := unix.Read(p[0], got)
			if err != nil || !bytes.Equal(got[:n], cmd) {
				t.Fatalf("read %q, %v; want %q", got[:n], err, cmd)
			}
			if err := tc.write(p[0], cmd); !errors.Is(err, unix.EBADF) {
				t.Fatalf("write to the read end: %v, want EBADF", err)
			}
			if a := testing.AllocsPerRun(100, func() {
				tc.write(p[1], cmd)
				unix.Read(p[0], got)
			}); a != 0 && !raceEnabled {
				t.Fatalf("%v allocs per write", a)
			}
		})
	}
}
