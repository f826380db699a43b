package dma

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// ErrClosed is returned when a Region is used after Unmap.
var ErrClosed = errors.New("dma: region unmapped")

// Region is a memory mapping the Go runtime does not manage. Its bytes stay
// at a fixed address until Unmap, so their address can be handed to the
// kernel (REG_MR, ring views). Unmap is idempotent.
type Region struct {
	mu  sync.Mutex
	b   []byte
	len int // requested length (the mapping is rounded up to pages)
}

// RoundPage rounds n up to a whole number of pages.
func RoundPage(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

// Alloc maps n bytes (rounded up to pages) of zeroed anonymous private
// memory, excluded from fork (MADV_DONTFORK) so a child never gets a
// copy-on-write copy of pages a device still writes.
func Alloc(n int) (*Region, error) {
	if n <= 0 {
		return nil, fmt.Errorf("dma: alloc %d bytes: %w", n, unix.EINVAL)
	}
	b, err := unix.Mmap(-1, 0, RoundPage(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("dma: mmap %d anonymous bytes: %w", RoundPage(n), err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("dma: madvise(MADV_DONTFORK): %w", err)
	}
	if len(b) >= hugePage {
		// Best effort: transparent huge pages mean fewer translation entries
		// for the NIC (mlx5) and fewer page walks for rxe. Not all kernels
		// or configurations allow it; ignore refusal.
		_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	}
	return &Region{b: b, len: n}, nil
}

const hugePage = 2 << 20

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
	return &Region{b: b, len: length}, nil
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

// Unmap releases the mapping. Further calls return nil.
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
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("dma: munmap: %w", err)
	}
	return nil
}
