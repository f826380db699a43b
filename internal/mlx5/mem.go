package mlx5

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// MapAnon returns size bytes (rounded up to whole pages) of zeroed,
// page-aligned anonymous memory that is not Go heap: the device reads and
// writes queue buffers and doorbell records the kernel pins in it, so the Go
// runtime must never move or free it. The mapping is excluded from fork()
// (MADV_DONTFORK) so that a child cannot take a copy-on-write copy of pages
// the device is still writing.
func MapAnon(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mlx5: anonymous mapping of %d bytes: %w", size, unix.EINVAL)
	}
	n := (size + PageSize - 1) &^ (PageSize - 1)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mlx5: mmap %d anonymous bytes: %w", n, err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("mlx5: madvise(DONTFORK): %w", err)
	}
	return b, nil
}

// MapUAR maps one UAR page of the uverbs command fd at the given offset
// (from UAROffset or from the dynamic-UAR ioctl). The kernel requires
// exactly one page, MAP_SHARED and PROT_WRITE.
func MapUAR(fd int, offset int64, length int) ([]byte, error) {
	b, err := unix.Mmap(fd, offset, length, unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mlx5: mmap UAR at offset %#x: %w", offset, err)
	}
	return b, nil
}

// Unmap releases a mapping made by MapAnon or MapUAR. A nil slice is a no-op.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("mlx5: munmap: %w", err)
	}
	return nil
}

// Errno values the provider maps kernel results to, re-exported so that
// the provider does not import x/sys/unix.
var (
	EINVAL     error = unix.EINVAL
	ENOMEM     error = unix.ENOMEM
	EOPNOTSUPP error = unix.EOPNOTSUPP
)
