package sock

import (
	"io"
	"net"
	"syscall"

	"github.com/rdmago/te/internal/unix"
)

// RawIO reads and writes a socket the runtime polls with system calls
// that do not enter the scheduler (unix.ReadNonblock), waiting on the
// runtime's poller like net.Conn does (Close included). A server that is
// idle between requests makes a few short calls per request; through
// net.Conn each call made while every P was idle wakes the runtime's
// monitor thread, which then polls at 20 µs until the process idles
// again, and on two cores that thread's wake-ups cost as much as the
// request. It allocates nothing per call; one reader and one writer at a
// time.
type RawIO struct {
	rc syscall.RawConn

	p     []byte
	n     int
	rerr  error
	fillf func(uintptr) bool
	// lowat is the SO_RCVLOWAT the next wait asks for, set the socket's
	// (0 and 1 are the kernel's default: woken by one byte).
	lowat, set int
	info       unix.TCPInfo

	bufs   [][]byte // what is left to write; bufs[0] from off
	off    int
	wn     int64
	werr   error
	iov    []unix.Iovec
	drainf func(uintptr) bool
	tryf   func(uintptr) bool
	tried  bool // the last try wrote everything
}

// NewRawIO returns a RawIO for Reset to point at a socket; a write takes
// at most iovs buffers per system call (at most MaxIov).
func NewRawIO(iovs int) *RawIO {
	r := &RawIO{iov: make([]unix.Iovec, 0, min(max(iovs, 1), MaxIov))}
	r.fillf, r.drainf, r.tryf = r.fill, r.drain, r.try
	return r
}

// Reset points r at c's socket; nil lets go of the last one.
func (r *RawIO) Reset(c syscall.Conn) error {
	r.rc = nil
	r.lowat, r.set = 0, 0
	if c == nil {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	r.rc = rc
	return nil
}

func (r *RawIO) fill(fd uintptr) bool {
	for {
		n, err := unix.ReadNonblock(int(fd), r.p)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if mark := r.mark(fd); mark != r.set {
				// Raised only before a wait, so a socket that
				// has the bytes is read without the call;
				// lowered lazily, before the next wait. The
				// kernel checks the new mark at once: bytes
				// that reached it meanwhile wake the poller.
				if err := unix.SetRcvlowatNonblock(int(fd), max(mark, 1)); err != nil {
					r.rerr = err
					return true
				}
				r.set = mark
			}
			return false
		}
		r.n, r.rerr = n, err
		return true
	}
}

// mark is the wake-up mark for a wait: what ReadWait asked for, at most
// half the receive window the socket last advertised, so the sender
// keeps sending while the reader copies what arrived (a mark the window
// cannot hold would wake the reader only once the window closed, and the
// sender would stop and go). Without the window (a kernel before 6.2, a
// failed call) or under minMark there is no mark.
func (r *RawIO) mark(fd uintptr) int {
	if r.lowat <= 1 {
		return 0
	}
	if unix.GetsockoptTCPInfoNonblock(int(fd), &r.info) != nil {
		return 0
	}
	m := min(r.lowat, int(r.info.Rcv_wnd/2))
	if m < minMark {
		return 0
	}
	return m
}

// minMark is the least mark set: a smaller one (a fresh connection's
// window, a short payload) saves no wake-up worth its system calls.
const minMark = 64 << 10

// Read reads into p once the socket is readable: at least one byte, or
// an error (io.EOF when the peer closed; net.ErrClosed after Close).
func (r *RawIO) Read(p []byte) (int, error) { return r.ReadWait(p, 1) }

// ReadWait is Read that, should it wait, asks the kernel not to report
// the socket readable before want bytes are queued (at most len(p) and
// half the receive window; the kernel reports it readable anyway at EOF,
// on an error, or when its receive buffer or window runs short, so a wait
// cannot outlast the peer's sending). A
// large payload read this way costs fewer wake-ups of the reader than one
// per segment burst that arrives while it sleeps. The mark stays set on
// the socket until a later read waits with another one.
func (r *RawIO) ReadWait(p []byte, want int) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.lowat = min(max(want, 1), len(p))
	if r.lowat == 1 {
		r.lowat = 0
	}
	r.p, r.n, r.rerr = p, 0, nil
	err := r.rc.Read(r.fillf)
	r.p = nil
	switch {
	case err != nil:
		return 0, closedErr(err)
	case r.rerr != nil:
		return 0, r.rerr
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

func (r *RawIO) drain(fd uintptr) bool {
	for len(r.bufs) > 0 {
		r.iov = r.iov[:0]
		for i, b := range r.bufs {
			if i == 0 {
				b = b[r.off:]
			}
			if len(b) == 0 {
				continue
			}
			if len(r.iov) == cap(r.iov) {
				break
			}
			var iv unix.Iovec
			iv.Base = &b[0]
			iv.SetLen(len(b))
			r.iov = append(r.iov, iv)
		}
		n, err := unix.WritevNonblock(int(fd), r.iov)
		clear(r.iov)
		switch err {
		case nil:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			r.werr = err
			return true
		}
		r.wn += int64(n)
		for n > 0 || (len(r.bufs) > 0 && len(r.bufs[0]) == r.off) {
			k := min(n, len(r.bufs[0])-r.off)
			r.off += k
			n -= k
			if r.off == len(r.bufs[0]) {
				r.bufs, r.off = r.bufs[1:], 0
			}
		}
	}
	return true
}

// WriteBuffers writes all of bufs (waiting while the socket's buffer is
// full) and returns the bytes written.
func (r *RawIO) WriteBuffers(bufs [][]byte) (int64, error) {
	r.bufs, r.off, r.wn, r.werr = bufs, 0, 0, nil
	err := r.rc.Write(r.drainf)
	r.bufs = nil
	if err == nil {
		err = r.werr
	}
	return r.wn, closedErr(err)
}

// closedErr is net.ErrClosed for the error a closed *os.File's RawConn
// returns (internal/poll's ErrFileClosing, which os does not export and
// wraps only in File's own methods), so a socket accepted by Listener
// reports its Close as a net.Conn's does; other errors as they are.
func closedErr(err error) error {
	if err != nil && err.Error() == "use of closed file" {
		return net.ErrClosed
	}
	return err
}

func (r *RawIO) try(fd uintptr) bool {
	r.tried = r.drain(fd)
	return true // never wait
}

// TryWriteBuffers writes what the socket takes of bufs now, without
// waiting, and reports whether that was all; when it was not, the rest
// (bufs, which must stay untouched until then) is left for Finish, which
// must be called before any other write. A write error is returned (and
// nothing left).
func (r *RawIO) TryWriteBuffers(bufs [][]byte) (bool, error) {
	r.bufs, r.off, r.wn, r.werr = bufs, 0, 0, nil
	err := closedErr(r.rc.Write(r.tryf))
	if err == nil {
		err = r.werr
	}
	if err != nil || r.tried {
		r.bufs = nil
		return err == nil, err
	}
	return false, nil
}

// Finish writes what TryWriteBuffers left (waiting while the socket's
// buffer is full) and returns the bytes written by both.
func (r *RawIO) Finish() (int64, error) {
	r.werr = nil
	err := r.rc.Write(r.drainf)
	r.bufs = nil
	if err == nil {
		err = r.werr
	}
	return r.wn, closedErr(err)
}
