//go:build linux

package unix

// A blocking read of a socket that is otherwise non-blocking: the
// descriptor's O_NONBLOCK is cleared for the call and set again after
// it, and SO_RCVTIMEO bounds its wait. The unsafe conversions are of the
// caller's buffer and timeval addresses in the calls' argument lists.

import (
	"time"
	"unsafe"

	sys "golang.org/x/sys/unix"
)

// SetBlockingNonblock sets (on) or clears a socket's O_NONBLOCK with one
// fcntl(F_SETFL) made with RawSyscall. The socket's other status flags
// are set to none: only for a socket that has no other (accept4's and
// socket's have none; close-on-exec is a descriptor flag, not one of these).
func SetBlockingNonblock(fd int, blocking bool) error {
	fl := uintptr(sys.O_NONBLOCK)
	if blocking {
		fl = 0
	}
	_, _, e := sys.RawSyscall(sys.SYS_FCNTL, uintptr(fd), sys.F_SETFL, fl)
	if e != 0 {
		return e
	}
	return nil
}

// SetRcvtimeoNonblock sets a socket's SO_RCVTIMEO (how long a blocking
// read waits before it returns what it has, or EAGAIN) with RawSyscall6;
// d is rounded up to a microsecond, and 0 would mean forever, so the
// least is a microsecond.
func SetRcvtimeoNonblock(fd int, d time.Duration) error {
	us := max((d+time.Microsecond-1)/time.Microsecond, 1)
	tv := sys.NsecToTimeval(int64(us * time.Microsecond))
	_, _, e := sys.RawSyscall6(sys.SYS_SETSOCKOPT, uintptr(fd), sys.SOL_SOCKET, sys.SO_RCVTIMEO, uintptr(unsafe.Pointer(&tv)), unsafe.Sizeof(tv), 0)
	if e != 0 {
		return e
	}
	return nil
}

// RecvWaitall is recvfrom(2) with MSG_WAITALL, made with Syscall6 (the
// scheduler is told: it may sleep): on a blocking socket it returns once
// p is full, or with what it has when SO_RCVTIMEO passes, a signal comes,
// the peer closes or the socket fails (EAGAIN when the timeout passed
// with nothing).
func RecvWaitall(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := sys.Syscall6(sys.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), sys.MSG_WAITALL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
