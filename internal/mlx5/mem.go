package mlx5

import (
	"fmt"
	"os"

	"github.com/rdmago/te/internal/unix"
)

// PageSize is the system page size.
var PageSize = os.Getpagesize()

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

// Unmap releases a mapping made by MapUAR. A nil slice is a no-op.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("mlx5: munmap: %w", err)
	}
	return nil
}

// ENOMEM is re-exported so that the provider needs no system call package.
var ENOMEM error = unix.ENOMEM
