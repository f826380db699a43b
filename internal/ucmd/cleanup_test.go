package ucmd

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// fdTarget is what descriptor fd of this process refers to ("" when closed).
func fdTarget(fd int) string {
	s, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	return s
}

// TestLeakedFileClosed: a File dropped without Close has its descriptor
// closed by the collector; a closed File's number, reused meanwhile by
// another file, is left alone.
func TestLeakedFileClosed(t *testing.T) {
	f, err := Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	fd := f.FD()
	if fdTarget(fd) != "/dev/null" {
		t.Fatalf("fd %d is %q", fd, fdTarget(fd))
	}
	f = nil
	for i := 0; fdTarget(fd) == "/dev/null"; i++ {
		if i == 100 {
			t.Fatalf("fd %d of a dropped File still open", fd)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}

	g, err := Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	gfd := g.FD()
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	other, err := os.Open("/dev/zero") // likely takes gfd's number
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	g = nil
	for range 5 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if int(other.Fd()) == gfd && fdTarget(gfd) != "/dev/zero" {
		t.Errorf("the cleanup of a closed File closed fd %d, reused by another file", gfd)
	}
}
