//go:build linux

package unix

// Reads and writes of non-blocking sockets that do not enter the
// scheduler. The unsafe conversions are of the caller's buffer and iovec
// array addresses in the calls' argument lists, which keeps them alive
// for the calls (and a goroutine in a raw system call cannot move).

import (
	"net/netip"
	"unsafe"

	sys "golang.org/x/sys/unix"
)

// ReadNonblock is read(2) made with RawSyscall: the scheduler is not told,
// so no monitor thread is woken and no P handed off for it. Only for a
// descriptor in non-blocking mode (the runtime's poller puts sockets in
// it), where the call returns at once: EAGAIN when nothing is there.
func ReadNonblock(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r, _, e := sys.RawSyscall(sys.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// WritevNonblock is writev(2) over iovecs the caller built, made with
// RawSyscall, for a non-blocking descriptor only (see ReadNonblock).
func WritevNonblock(fd int, iov []Iovec) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	r, _, e := sys.RawSyscall(sys.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// SendmsgNonblock is sendmsg(2) of iovecs the caller built, with flags
// (MSG_MORE), no address and no control data, made with RawSyscall, for
// a non-blocking descriptor only (see ReadNonblock). The message header
// lives on the stack for the call.
func SendmsgNonblock(fd int, iov []Iovec, flags int) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	var m sys.Msghdr
	m.Iov = &iov[0]
	m.SetIovlen(len(iov))
	r, _, e := sys.RawSyscall(sys.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&m)), uintptr(flags))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// ReadvNonblock is readv(2) over iovecs the caller built, made with
// RawSyscall, for a non-blocking descriptor only (see ReadNonblock).
func ReadvNonblock(fd int, iov []Iovec) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	r, _, e := sys.RawSyscall(sys.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// SetRcvlowatNonblock sets a socket's SO_RCVLOWAT with RawSyscall6 (a
// short call the scheduler is not told about): how many bytes must be
// queued before the kernel reports the socket readable (poll, epoll).
func SetRcvlowatNonblock(fd, n int) error {
	v := int32(n)
	_, _, e := sys.RawSyscall6(sys.SYS_SETSOCKOPT, uintptr(fd), sys.SOL_SOCKET, sys.SO_RCVLOWAT, uintptr(unsafe.Pointer(&v)), 4, 0)
	if e != 0 {
		return e
	}
	return nil
}

// GetsockoptTCPInfoNonblock reads a TCP socket's TCP_INFO into info with
// RawSyscall6 (see SetRcvlowatNonblock), allocating nothing. A kernel
// older than the struct leaves the fields it does not know zero.
func GetsockoptTCPInfoNonblock(fd int, info *TCPInfo) error {
	*info = TCPInfo{}
	l := uint32(unsafe.Sizeof(*info))
	_, _, e := sys.RawSyscall6(sys.SYS_GETSOCKOPT, uintptr(fd), sys.IPPROTO_TCP, sys.TCP_INFO, uintptr(unsafe.Pointer(info)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// Accept4Nonblock is accept4(2) of a non-blocking listening socket made
// with RawSyscall (see ReadNonblock); the accepted descriptor is
// non-blocking and close-on-exec, and its peer's address is written to
// sa. EAGAIN when no connection waits.
func Accept4Nonblock(fd int, sa *RawSockaddrAny) (int, error) {
	l := uint32(unsafe.Sizeof(*sa))
	r, _, e := sys.RawSyscall6(sys.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(sa)), uintptr(unsafe.Pointer(&l)), sys.SOCK_NONBLOCK|sys.SOCK_CLOEXEC, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// SetsockoptIntNonblock is setsockopt(2) of an int option made with
// RawSyscall6 (see SetRcvlowatNonblock).
func SetsockoptIntNonblock(fd, level, opt, v int) error {
	x := int32(v)
	_, _, e := sys.RawSyscall6(sys.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&x)), 4, 0)
	if e != 0 {
		return e
	}
	return nil
}

// SockaddrAddrPort is the IPv4 or IPv6 address and port in sa (the zero
// AddrPort for other families), allocating nothing. The casts read the
// family's struct where the kernel wrote it, inside sa.
func SockaddrAddrPort(sa *RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case sys.AF_INET:
		in := (*sys.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), ntohs(in.Port))
	case sys.AF_INET6:
		in := (*sys.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(in.Addr), ntohs(in.Port))
	}
	return netip.AddrPort{}
}

// ntohs: the kernel's port is in network order in memory.
func ntohs(p uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&p))
	return uint16(b[0])<<8 | uint16(b[1])
}

// EpollCtlNonblock is epoll_ctl(2) made with RawSyscall6 (a short call the
// scheduler is not told about); ev is read by the kernel during the call.
func EpollCtlNonblock(epfd, op, fd int, ev *EpollEvent) error {
	_, _, e := sys.RawSyscall6(sys.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// EpollWaitNonblock is epoll_pwait(2) with a zero timeout made with
// RawSyscall6: the events ready now, without waiting (0 when none). A
// wait that may sleep goes through EpollWait, which tells the scheduler.
func EpollWaitNonblock(epfd int, events []EpollEvent) (int, error) {
	if len(events) == 0 {
		return 0, nil
	}
	r, _, e := sys.RawSyscall6(sys.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// CloseNonblock is close(2) made with RawSyscall, for a socket without
// SO_LINGER (its close does not wait) that no runtime poller holds.
func CloseNonblock(fd int) error {
	_, _, e := sys.RawSyscall(sys.SYS_CLOSE, uintptr(fd), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
