package sock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// ErrWouldBlock: a raw call on a non-blocking descriptor found nothing to
// do now (EAGAIN); wait for the Poller to report the descriptor ready.
var ErrWouldBlock = errors.New("sock: would block")

// Poller is an epoll instance of its own, for a server that waits on its
// sockets in one goroutine instead of a goroutine per socket on the
// runtime's poller: a ready socket is served by the goroutine that waited,
// with no hand-off to wake. Its descriptors are kept off the runtime's
// poller (RawListener, the accepted sockets), and every call but a Wait
// that may sleep is made without entering the scheduler (see RawIO).
// One goroutine uses it at a time; Wake may be called from any.
type Poller struct {
	ep, ev int // the epoll and the eventfd Wake writes
	events []unix.EpollEvent
	n      int
	one    [8]byte
}

// Readiness a Poller reports.
const (
	In  = unix.EPOLLIN
	Out = unix.EPOLLOUT
	// Hup: the peer shut its side down (a read will return what is
	// left, then io.EOF), or the socket failed. It is a state, not an
	// arrival: once reported, a short read no longer means that the
	// poller will report what comes next.
	Hup = unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
)

// wakeToken is the eventfd's token: users' tokens must differ.
const wakeToken = ^uint64(0)

// NewPoller returns a Poller that reports at most n descriptors per Wait.
func NewPoller(n int) (*Poller, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("sock: epoll_create1: %w", err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("sock: eventfd: %w", err)
	}
	p := &Poller{ep: ep, ev: ev, events: make([]unix.EpollEvent, max(n, 1))}
	if err := p.add(ev, unix.EPOLLIN, wakeToken); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Poller) add(fd int, events uint32, token uint64) error {
	ev := epollEvent(events, token)
	if err := unix.EpollCtlNonblock(p.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("sock: epoll_ctl add: %w", err)
	}
	return nil
}

// epollEvent carries token in the event's data (tokenOf reads it back).
func epollEvent(events uint32, token uint64) unix.EpollEvent {
	return unix.EpollEvent{Events: events, Fd: int32(uint32(token)), Pad: int32(uint32(token >> 32))}
}

// Add watches fd, edge-triggered, for input readiness (and Hup): the
// Poller reports it when more arrives, so a user reads until
// ErrWouldBlock before it waits (WatchOut adds output readiness). Output
// is not watched from the start: a fresh socket is writable, and the
// report would cost a pass over it for nothing. token (not ^0) comes back
// with its events.
func (p *Poller) Add(fd int, token uint64) error {
	return p.add(fd, unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLET, token)
}

// AddListener watches a listening socket, level-triggered, for
// connections to accept.
func (p *Poller) AddListener(l *RawListener, token uint64) error {
	return p.add(l.fd, unix.EPOLLIN, token)
}

// Wait waits up to timeout (0: not at all; negative: until something is
// ready) and returns how many descriptors are ready, for Event. A Wake
// ends a wait and is reported as woken (and no events).
func (p *Poller) Wait(timeout time.Duration) (n int, woken bool, err error) {
	if timeout == 0 {
		n, err = unix.EpollWaitNonblock(p.ep, p.events)
	} else {
		// One call that may sleep, told to the scheduler: trying a
		// call that does not first saves the scheduler's bookkeeping
		// (some 0.1 µs) when something is ready, and costs a system
		// call when nothing is, which is how a loop that has drained
		// its sockets mostly finds it.
		ms := -1
		if timeout > 0 {
			ms = int(max((timeout+time.Millisecond-1)/time.Millisecond, 1))
		}
		n, err = unix.EpollWait(p.ep, p.events, ms)
	}
	if err == unix.EINTR {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("sock: epoll_wait: %w", err)
	}
	for i := 0; i < n; i++ {
		if tokenOf(&p.events[i]) == wakeToken {
			unix.ReadNonblock(p.ev, p.one[:]) // reset the counter
			p.events[i] = p.events[n-1]
			n--
			woken = true
			break
		}
	}
	p.n = n
	return n, woken, nil
}

func tokenOf(e *unix.EpollEvent) uint64 { return uint64(uint32(e.Fd)) | uint64(uint32(e.Pad))<<32 }

// Event is the i'th ready descriptor of the last Wait: its token and
// readiness (In, Out, Hup).
func (p *Poller) Event(i int) (token uint64, events uint32) {
	return tokenOf(&p.events[i]), p.events[i].Events
}

// Wake ends the current or next Wait; from any goroutine.
func (p *Poller) Wake() error {
	var one = [8]byte{1}
	_, err := unix.Write(p.ev, one[:])
	if err == unix.EAGAIN {
		return nil // the counter is full: a wake is pending
	}
	return err
}

// Close closes the epoll instance (not the descriptors it watched).
func (p *Poller) Close() error {
	err := unix.Close(p.ep)
	unix.Close(p.ev)
	return err
}

// RawListener is a listening TCP socket off the runtime's poller, for a
// Poller: Accept never waits.
type RawListener struct {
	fd   int
	addr net.Addr
	sa   unix.RawSockaddrAny
}

// NewRawListener returns a RawListener of ln's socket and closes ln, also
// on error; nodelay sets TCP_NODELAY on every connection (see
// setNoDelay).
func NewRawListener(ln *net.TCPListener, nodelay bool) (*RawListener, error) {
	addr := ln.Addr()
	f, err := ln.File() // a duplicate, non-blocking like ln's (the flag is the open file's)
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("sock: listener: %w", err)
	}
	defer f.Close()
	fd := -1
	rc, err := f.SyscallConn()
	if err == nil {
		err = rc.Control(func(s uintptr) { fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) })
	}
	if err != nil {
		return nil, fmt.Errorf("sock: listener: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sock: listener: %w", err)
	}
	if nodelay {
		if err := setNoDelay(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	return &RawListener{fd: fd, addr: addr}, nil
}

// Addr is the listening address.
func (l *RawListener) Addr() net.Addr { return l.addr }

// Accept returns the next connection waiting, non-blocking and off the
// runtime's poller (for Poller.Add, ReadFD, WriteFD, CloseFD), and its
// peer's address; ErrWouldBlock when none waits. Other errors are
// accept4's (EMFILE, ENFILE, ENOMEM: the listener stays usable).
func (l *RawListener) Accept() (int, netip.AddrPort, error) {
	for {
		fd, err := unix.Accept4Nonblock(l.fd, &l.sa)
		switch err {
		case nil:
		case unix.EINTR, syscall.ECONNABORTED:
			continue // as net does: the next one may be fine
		case unix.EAGAIN:
			return -1, netip.AddrPort{}, ErrWouldBlock
		default:
			return -1, netip.AddrPort{}, os.NewSyscallError("accept4", err)
		}
		ap := unix.SockaddrAddrPort(&l.sa)
		return fd, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
}

// Close closes the listening socket; once only (it is a bare descriptor).
func (l *RawListener) Close() error {
	if l.fd < 0 {
		return nil
	}
	err := unix.Close(l.fd)
	l.fd = -1
	return err
}

// ReadFD reads a non-blocking socket accepted by RawListener into p:
// ErrWouldBlock when nothing is there, io.EOF when the peer closed.
func ReadFD(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := unix.ReadNonblock(fd, p)
		if err != unix.EINTR {
			return readResult(n, err)
		}
	}
}

// readResult is a non-blocking read's outcome, the read having asked for
// at least one byte and not been interrupted.
func readResult(n int, err error) (int, error) {
	switch {
	case err == unix.EAGAIN:
		return 0, ErrWouldBlock
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Vec writes several buffers to a non-blocking socket with one writev;
// its iovec array is reused, so one goroutine uses a Vec at a time.
type Vec struct{ iov []unix.Iovec }

// NewVec returns a Vec that writes at most n buffers per call (at most
// MaxIov).
func NewVec(n int) *Vec { return &Vec{iov: make([]unix.Iovec, 0, min(max(n, 1), MaxIov))} }

// Write writes what the socket takes of bufs now (empty ones skipped):
// the bytes written, or ErrWouldBlock when it took none.
func (v *Vec) Write(fd int, bufs [][]byte) (int, error) { return v.write(fd, bufs, 0) }

// WriteMore is Write telling the kernel that more of the same message
// follows (MSG_MORE): a last segment that is not full waits for the next
// write instead of going out short (with TCP_NODELAY set, a 64 KiB write
// would otherwise end in a segment of its own). The kernel holds it only
// until that write, or until an ACK lets the socket send again.
func (v *Vec) WriteMore(fd int, bufs [][]byte) (int, error) {
	return v.write(fd, bufs, unix.MSG_MORE)
}

func (v *Vec) write(fd int, bufs [][]byte, flags int) (int, error) {
	v.iov, _ = iovecs(v.iov, bufs)
	if len(v.iov) == 0 {
		return 0, nil
	}
	for {
		var n int
		var err error
		if flags == 0 {
			n, err = unix.WritevNonblock(fd, v.iov)
		} else {
			n, err = unix.SendmsgNonblock(fd, v.iov, flags)
		}
		switch err {
		case nil:
			clear(v.iov)
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			clear(v.iov)
			return 0, ErrWouldBlock
		}
		clear(v.iov)
		return 0, err
	}
}

// CloseFD closes a socket accepted by RawListener (which also ends its
// watch by a Poller).
func CloseFD(fd int) error { return unix.CloseNonblock(fd) }

// WatchOut adds output readiness to fd's watch (after a write found the
// socket's buffer full), keeping input's; token as Add's.
func (p *Poller) WatchOut(fd int, token uint64) error {
	ev := epollEvent(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLOUT|unix.EPOLLET, token)
	if err := unix.EpollCtlNonblock(p.ep, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return fmt.Errorf("sock: epoll_ctl mod: %w", err)
	}
	return nil
}

// RemoveListener stops watching l (a listener out of descriptors waits
// before it accepts again).
func (p *Poller) RemoveListener(l *RawListener) error {
	if err := unix.EpollCtlNonblock(p.ep, unix.EPOLL_CTL_DEL, l.fd, nil); err != nil {
		return fmt.Errorf("sock: epoll_ctl del: %w", err)
	}
	return nil
}

// Read reads a non-blocking socket into bufs (empty ones skipped) with
// one readv: ErrWouldBlock when nothing is there, io.EOF when the peer
// closed.
func (v *Vec) Read(fd int, bufs [][]byte) (int, error) {
	var want int
	v.iov, want = iovecs(v.iov, bufs)
	if want == 0 {
		return 0, nil
	}
	defer clear(v.iov)
	for {
		n, err := unix.ReadvNonblock(fd, v.iov)
		if err != unix.EINTR {
			return readResult(n, err)
		}
	}
}

// Marks sets wake-up marks (SO_RCVLOWAT) on sockets a Poller watches, as
// RawIO.ReadWait does on its own: a large payload read as it arrives
// wakes the reader once per burst, with a mark about twice. Its scratch
// is reused: one goroutine uses a Marks at a time.
type Marks struct{ info unix.TCPInfo }

// Set asks the kernel to report fd readable only once want bytes are
// queued: at most half the receive window the socket last advertised,
// none (the kernel's default, one byte) under 64 KiB or without the
// window (a kernel before 6.2). *set is the mark fd has (0 for none);
// nothing is called when it stays.
func (m *Marks) Set(fd, want int, set *int) error {
	mark := 0
	if want >= minMark && unix.GetsockoptTCPInfoNonblock(fd, &m.info) == nil {
		if mark = min(want, int(m.info.Rcv_wnd/2)); mark < minMark {
			mark = 0
		}
	}
	if mark == *set {
		return nil
	}
	if err := unix.SetRcvlowatNonblock(fd, max(mark, 1)); err != nil {
		return fmt.Errorf("sock: SO_RCVLOWAT: %w", err)
	}
	*set = mark
	return nil
}
