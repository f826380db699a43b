//go:build linux

package unix

// The one unsafe conversion of this package: the address of an iovec array
// handed to readv(2).

import (
	"unsafe"

	sys "golang.org/x/sys/unix"
)

// Readv is readv(2) over iovecs the caller built (x/sys/unix's Readv
// takes [][]byte and allocates its iovec array once there are more than
// eight). The array is the caller's and stays reachable for the call: the
// pointer is converted in the call's argument list, which keeps it alive.
// The buffers the iovecs point to must outlive the call too.
func Readv(fd int, iov []Iovec) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	r, _, e := sys.Syscall(sys.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return int(r), e
	}
	return int(r), nil
}
