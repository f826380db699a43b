package dma

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/rdmago/te/internal/unix"
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// ErrClosed is returned when a Region is used after Unmap.
var ErrClosed = errors.New("dma: region unmapped")

// Region is a memory mapping the Go runtime does not manage. Its bytes stay
// at a fixed address until Unmap, so their address can be handed to the
// kernel (REG_MR, ring views) or to a peer process. Unmap is idempotent.
type Region struct {
	mu  sync.Mutex
	b   []byte // the whole mapping
	len int    // requested length (the mapping is rounded up to pages)
	raw bool   // mapped with mapRaw (Alloc, AllocShared, MapFD): unmap with unmapRaw
	fd  int    // the memfd backing an AllocShared region, else -1
	// cleanup closes fd if the Region becomes unreachable without Unmap.
	// The mapping stays: slices of it may outlive the Region (the
	// collector does not see them), so only Unmap may unmap.
	cleanup runtime.Cleanup
}

// RoundPage rounds n up to a whole number of pages.
func RoundPage(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

// HugePage is the transparent huge page size Alloc aligns large regions to.
const HugePage = 2 << 20

// Alloc maps n bytes (rounded up to pages) of zeroed anonymous private
// memory, excluded from fork (MADV_DONTFORK) so a child never gets a
// copy-on-write copy of pages a device still writes. Regions of at least
// HugePage bytes start on a HugePage boundary and ask for transparent huge
// pages (MADV_HUGEPAGE): fewer translation entries for a NIC, fewer TLB
// misses for copies. The kernel may refuse huge pages; that is not an
// error.
func Alloc(n int) (*Region, error) {
	if n <= 0 {
		return nil, fmt.Errorf("dma: alloc %d bytes: %w", n, unix.EINVAL)
	}
	size := RoundPage(n)
	align := PageSize
	if size >= HugePage {
		align = HugePage
	}
	b, err := mapRaw(-1, size, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, align)
	if err != nil {
		return nil, fmt.Errorf("dma: mmap %d anonymous bytes: %w", size, err)
	}
	if err := advise(b); err != nil {
		unmapRaw(b)
		return nil, err
	}
	return &Region{b: b, len: n, raw: true, fd: -1}, nil
}

// advise sets MADV_DONTFORK (required: registered pages must stay with
// this process across a fork) and, for large regions, MADV_HUGEPAGE (best
// effort).
func advise(b []byte) error {
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		return fmt.Errorf("dma: madvise(MADV_DONTFORK): %w", err)
	}
	if len(b) >= HugePage {
		// Not all kernels or configurations allow it (shmem huge pages
		// are off by default); refusal only costs TLB reach.
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	}
	return nil
}

// AllocShared maps n bytes (rounded up to pages) of zeroed memory backed by
// an anonymous memory file (memfd), mapped shared, so that the file
// descriptor (FD) can be handed to a process on the same host that maps
// the same pages. The file has no name in any file system: nothing is left
// behind when the processes holding it end. Its size is sealed (no peer can
// shrink it under this mapping and make it fault). The mapping is excluded
// from fork like Alloc's.
func AllocShared(n int) (*Region, error) {
	if n <= 0 {
		return nil, fmt.Errorf("dma: alloc shared %d bytes: %w", n, unix.EINVAL)
	}
	size := RoundPage(n)
	fd, err := unix.MemfdCreate("te-mem", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("dma: memfd_create: %w", err)
	}
	fail := func(err error) (*Region, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("dma: size memfd to %d bytes: %w", size, err))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(fmt.Errorf("dma: seal memfd: %w", err))
	}
	align := PageSize
	if size >= HugePage {
		align = HugePage
	}
	b, err := mapRaw(fd, size, unix.MAP_SHARED, align)
	if err != nil {
		return fail(fmt.Errorf("dma: mmap %d bytes of memfd: %w", size, err))
	}
	if err := advise(b); err != nil {
		unmapRaw(b)
		return fail(err)
	}
	r := &Region{b: b, len: n, raw: true, fd: fd}
	r.cleanup = runtime.AddCleanup(r, closeFD, fd)
	return r, nil
}

// HostMemory is the memory this host has for mappings: its RAM and swap,
// in bytes. A buffer larger than that cannot be touched in full (it is
// mapped lazily: the process would be killed once it is).
func HostMemory() (uint64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("dma: sysinfo: %w", err)
	}
	return (uint64(si.Totalram) + uint64(si.Totalswap)) * uint64(si.Unit), nil
}

// closeFD is a cleanup: it closes a memory file its Region leaked.
func closeFD(fd int) { unix.Close(fd) }

// MapFD maps length bytes at offset of a memory file received from another
// process (a memfd made by AllocShared), shared and excluded from fork.
// It checks first that the file is at least offset+length bytes long and
// sealed against shrinking, so the owner cannot make this mapping fault.
// The caller may close fd afterwards: the mapping keeps the file.
func MapFD(fd int, offset int64, length int) (*Region, error) {
	if length <= 0 || offset < 0 || offset%int64(PageSize) != 0 {
		return nil, fmt.Errorf("dma: map fd %d offset %#x length %d: %w", fd, offset, length, unix.EINVAL)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("dma: fstat fd %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < offset+int64(length) {
		return nil, fmt.Errorf("dma: fd %d (mode %#o, %d bytes) cannot hold [%#x, %#x): %w", fd, st.Mode, st.Size, offset, offset+int64(length), unix.EINVAL)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("dma: fd %d: get seals: %w", fd, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("dma: fd %d is not sealed against shrinking: %w", fd, unix.EPERM)
	}
	size := RoundPage(length)
	b, err := mapRawAt(fd, offset, size, unix.MAP_SHARED, PageSize)
	if err != nil {
		return nil, fmt.Errorf("dma: mmap fd %d offset %#x length %d: %w", fd, offset, size, err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		unmapRaw(b)
		return nil, fmt.Errorf("dma: madvise(MADV_DONTFORK): %w", err)
	}
	return &Region{b: b, len: length, raw: true, fd: -1}, nil
}

// MapShared maps length bytes of fd at offset, readable and writable and
// shared with the kernel (the rxe queues on the uverbs fd).
func MapShared(fd int, offset int64, length int) (*Region, error) {
	if length <= 0 {
		return nil, fmt.Errorf("dma: map %d bytes: %w", length, unix.EINVAL)
	}
	b, err := unix.Mmap(fd, offset, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("dma: mmap fd %d offset %#x length %d: %w", fd, offset, length, err)
	}
	return &Region{b: b, len: length, fd: -1}, nil
}

// Bytes returns the mapped bytes (the requested length), or nil after Unmap.
func (r *Region) Bytes() []byte {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return nil
	}
	return r.b[:r.len]
}

// FD is the memory file backing an AllocShared region, valid until Unmap;
// -1 for other regions.
func (r *Region) FD() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fd
}

// Unmap releases the mapping (and the memory file of an AllocShared
// region; pages a peer still maps live on with the peer's mapping). Further
// calls return nil.
func (r *Region) Unmap() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b == nil {
		return nil
	}
	b := r.b
	r.b = nil
	var err error
	if r.raw {
		err = unmapRaw(b)
	} else {
		err = unix.Munmap(b)
	}
	if r.fd >= 0 {
		r.cleanup.Stop() // before the number can be reused
		if cerr := unix.Close(r.fd); cerr != nil && err == nil {
			err = cerr
		}
		r.fd = -1
	}
	if err != nil {
		return fmt.Errorf("dma: munmap: %w", err)
	}
	return nil
}
