package dma

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/unix"
)

// vmFlags returns the VmFlags line of the mapping that starts at addr, as
// the kernel reports it in /proc/self/smaps.
func vmFlags(t *testing.T, addr uint64) string {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	prefix := fmt.Sprintf("%x-", addr)
	in := false
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, prefix) {
			in = true
			continue
		}
		if in && strings.HasPrefix(l, "VmFlags:") {
			return l
		}
	}
	t.Fatalf("no mapping at %#x in smaps", addr)
	return ""
}

// TestAllocAdvice: every mapping is excluded from fork ("dc"); large ones
// start on a huge page boundary and are advised for huge pages ("hg").
func TestAllocAdvice(t *testing.T) {
	if os.Getenv("TE_QEMU_USER") != "" {
		t.Skip("qemu-user does not apply madvise to the guest mappings (no DONTFORK or HUGEPAGE flag in smaps); the native run of make test checks them")
	}
	for _, shared := range []bool{false, true} {
		for _, n := range []int{100, HugePage, 3*HugePage + 5} {
			alloc := Alloc
			if shared {
				alloc = AllocShared
			}
			r, err := alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			b := r.Bytes()
			fl := vmFlags(t, Addr(b))
			if !strings.Contains(fl, " dc") {
				t.Errorf("shared=%v n=%d: not MADV_DONTFORK: %s", shared, n, fl)
			}
			if n >= HugePage {
				if Addr(b)%HugePage != 0 {
					t.Errorf("shared=%v n=%d: address %#x not huge-page aligned", shared, n, Addr(b))
				}
				if !strings.Contains(fl, " hg") {
					t.Errorf("shared=%v n=%d: not MADV_HUGEPAGE: %s", shared, n, fl)
				}
			}
			if (r.FD() >= 0) != shared {
				t.Errorf("shared=%v: FD %d", shared, r.FD())
			}
			b[0], b[n-1] = 1, 2
			if err := r.Unmap(); err != nil {
				t.Fatal(err)
			}
			if r.FD() != -1 {
				t.Error("FD open after Unmap")
			}
		}
	}
}

// TestMapFD: a second mapping of a shared region's memory file sees the
// same bytes both ways, and outlives the first one.
func TestMapFD(t *testing.T) {
	r, err := AllocShared(3 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(r.FD())
	if err != nil {
		t.Fatal(err)
	}
	m, err := MapFD(fd, int64(PageSize), 2*PageSize)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unmap()
	a, b := r.Bytes(), m.Bytes()
	a[PageSize+7] = 0x5a
	if b[7] != 0x5a {
		t.Fatal("peer mapping does not see the owner's write")
	}
	b[PageSize] = 0xa5
	if a[2*PageSize] != 0xa5 {
		t.Fatal("owner does not see the peer mapping's write")
	}
	if err := r.Unmap(); err != nil {
		t.Fatal(err)
	}
	b[1] = 3 // the pages live on with the second mapping
	if b[7] != 0x5a || b[1] != 3 {
		t.Fatal("pages lost with the owner's mapping")
	}
}

// TestMapFDRefuses: files too short, unsealed or not regular are not
// mapped.
func TestMapFDRefuses(t *testing.T) {
	r, err := AllocShared(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unmap()
	if _, err := MapFD(r.FD(), 0, 2*PageSize); err == nil {
		t.Error("mapped past the end of the file")
	}
	if _, err := MapFD(r.FD(), 1, 10); err == nil {
		t.Error("mapped an unaligned offset")
	}
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, int64(PageSize))
	if _, err := MapFD(fd, 0, PageSize); err == nil {
		t.Error("mapped a file its owner can shrink")
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := MapFD(p[0], 0, PageSize); err == nil {
		t.Error("mapped a pipe")
	}
	if err := unix.Ftruncate(r.FD(), 0); err == nil {
		t.Error("a holder of the fd shrank a sealed region")
	}
}
