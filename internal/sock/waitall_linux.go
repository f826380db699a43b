package sock

import (
	"fmt"
	"io"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// SetWaitBound bounds how long ReadWaitFD waits on fd (SO_RCVTIMEO,
// which calls on a non-blocking socket ignore): set once per socket.
func SetWaitBound(fd int, d time.Duration) error {
	if err := unix.SetRcvtimeoNonblock(fd, d); err != nil {
		return fmt.Errorf("sock: SO_RCVTIMEO: %w", err)
	}
	return nil
}

// ReadWaitFD reads a socket accepted by RawListener into p, waiting in
// the kernel rather than on a Poller: a thread sleeping in a read is
// woken by the kernel as segments arrive and copies them out at once, so
// the socket's receive queue stays short, with one system call and no
// wake-up of a poller. It returns once p is full or when the bound set
// by SetWaitBound passed (what came by then, or ErrWouldBlock when
// nothing did; so also when a signal interrupted it), with io.EOF when
// the peer closed before any byte. The socket is blocking for the call
// only: non-blocking again on return, or the error says it could not be
// made so (the socket is then unfit for a Poller's user: close it).
func ReadWaitFD(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := unix.SetBlockingNonblock(fd, true); err != nil {
		return 0, fmt.Errorf("sock: clear O_NONBLOCK: %w", err)
	}
	n, err := unix.RecvWaitall(fd, p)
	if err := unix.SetBlockingNonblock(fd, false); err != nil {
		return 0, fmt.Errorf("sock: set O_NONBLOCK: %w", err)
	}
	switch {
	case n > 0:
		return n, nil
	case err == unix.EAGAIN || err == unix.EINTR:
		return 0, ErrWouldBlock
	case err != nil:
		return 0, err
	}
	return 0, io.EOF
}
