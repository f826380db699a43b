package dma

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLeakedSharedRegionFD: the memory file of an AllocShared region
// dropped without Unmap is closed by the collector (its mapping stays:
// only Unmap unmaps), and Unmap's close is not repeated by the cleanup.
func TestLeakedSharedRegionFD(t *testing.T) {
	target := func(fd int) string {
		s, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		return s
	}
	r, err := AllocShared(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	fd := r.FD()
	b := r.Bytes()
	if !strings.Contains(target(fd), "memfd:te-mem") {
		t.Fatalf("fd %d is %q", fd, target(fd))
	}
	r = nil
	for i := 0; strings.Contains(target(fd), "memfd:te-mem"); i++ {
		if i == 100 {
			t.Fatalf("memfd %d of a dropped region still open", fd)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	b[0] = 1 // still mapped

	u, err := AllocShared(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	ufd := u.FD()
	if err := u.Unmap(); err != nil {
		t.Fatal(err)
	}
	other, err := os.Open("/dev/zero") // likely takes ufd's number
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	u = nil
	for range 5 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if int(other.Fd()) == ufd && target(ufd) != "/dev/zero" {
		t.Errorf("the cleanup of an unmapped region closed fd %d, reused by another file", ufd)
	}
}
