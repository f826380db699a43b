package sock

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"

	"github.com/rdmago/te/internal/unix"
)

// Conn is an accepted connection: a socket for RawIO, closed once.
type Conn interface {
	syscall.Conn
	io.Closer
}

// Listener accepts a TCP listener's connections with system calls that
// do not enter the scheduler (unix.Accept4Nonblock), waiting on the
// runtime's poller like net.Listener (Close of the listener included).
// net's Accept makes three calls the scheduler is told about per
// connection (accept4, getsockname, setsockopt): each made while every P
// was idle wakes the runtime's monitor thread, which then polls at 20 µs
// (see RawIO). A connection is an *os.File on the runtime's poller: the
// calls left that the scheduler is told about are its fcntl (os.NewFile
// asks whether it is non-blocking) and its close. One Accept at a time.
type Listener struct {
	f    *os.File // the listening socket (net's listener lets no one wait on it)
	addr net.Addr
	rc   syscall.RawConn

	sa      unix.RawSockaddrAny
	nfd     int
	err     error
	acceptf func(uintptr) bool
}

// NewListener returns a Listener of ln's socket and closes ln, also on
// error; nodelay sets TCP_NODELAY on every connection (see setNoDelay).
func NewListener(ln *net.TCPListener, nodelay bool) (*Listener, error) {
	// A net listener's RawConn cannot wait (its Read is EINVAL): the
	// socket is kept as a file, a duplicate of ln's descriptor, still
	// non-blocking (the flag is the open file's, which both share).
	f, err := ln.File()
	addr := ln.Addr()
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("sock: listener: %w", err)
	}
	rc, err := f.SyscallConn()
	if err == nil && nodelay {
		cerr := rc.Control(func(fd uintptr) { err = setNoDelay(int(fd)) })
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("sock: listener: %w", err)
	}
	l := &Listener{f: f, addr: addr, rc: rc}
	l.acceptf = l.accept
	return l, nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening: an Accept waiting returns net.ErrClosed.
func (l *Listener) Close() error { return l.f.Close() }

func (l *Listener) accept(fd uintptr) bool {
	for {
		nfd, err := unix.Accept4Nonblock(int(fd), &l.sa)
		switch err {
		case unix.EINTR, syscall.ECONNABORTED:
			continue // as net does: the next one may be fine
		case unix.EAGAIN:
			return false
		}
		l.nfd, l.err = nfd, err
		return true
	}
}

// Accept waits for the next connection and returns it with its peer's
// address. Errors are the listener's (net.ErrClosed after its Close) or
// accept4's (EMFILE, ENFILE, ENOMEM: the listener stays usable).
func (l *Listener) Accept() (Conn, netip.AddrPort, error) {
	l.nfd, l.err = -1, nil
	if err := l.rc.Read(l.acceptf); err != nil {
		return nil, netip.AddrPort{}, closedErr(err)
	}
	if l.err != nil {
		return nil, netip.AddrPort{}, os.NewSyscallError("accept4", l.err)
	}
	ap := unix.SockaddrAddrPort(&l.sa)
	return os.NewFile(uintptr(l.nfd), "tcp"), netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// setNoDelay sets TCP_NODELAY on a listening socket: Linux copies a
// listener's TCP options into each connection it accepts (the child is a
// clone of the listener), so the connections have it without a
// setsockopt each (TestListener and TestRawListener check that they do).
func setNoDelay(fd int) error {
	if err := unix.SetsockoptIntNonblock(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("sock: TCP_NODELAY: %w", err)
	}
	return nil
}
