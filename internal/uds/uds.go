// Package uds holds the unix-domain socket operations the shm transport
// needs and the net package does not offer: the connected peer's
// credentials (SO_PEERCRED) and passing file descriptors (SCM_RIGHTS).
// Listening and dialling use net with abstract names ("@..."), which leave
// no file behind.
package uds

import (
	"errors"
	"fmt"
	"net"

	"github.com/rdmago/te/internal/unix"
)

// Cred is a connected peer's identity as the kernel recorded it when the
// connection was made.
type Cred struct {
	PID int32
	UID uint32
	GID uint32
}

// PeerCred returns the credentials of the process at the other end of c.
func PeerCred(c *net.UnixConn) (Cred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("uds: peer credentials: %w", err)
	}
	var uc *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		uc, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("uds: peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("uds: SO_PEERCRED: %w", gerr)
	}
	return Cred{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}, nil
}

// MaxFDs is the most descriptors one message carries (the kernel's
// SCM_MAX_FD is 253).
const MaxFDs = 250

// ErrFDs: a message carried descriptors that were not asked for, more than
// fit, or a malformed control message.
var ErrFDs = errors.New("uds: unexpected file descriptors")

// Send writes msg with the descriptors fds attached (none when fds is
// empty). The descriptors stay open in this process.
func Send(c *net.UnixConn, msg []byte, fds []int) error {
	if len(fds) > MaxFDs {
		return fmt.Errorf("uds: %d descriptors in one message (max %d): %w", len(fds), MaxFDs, unix.EINVAL)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return fmt.Errorf("uds: send: %w", err)
	}
	if n != len(msg) || oobn != len(oob) {
		return fmt.Errorf("uds: short send (%d of %d bytes, %d of %d control): %w", n, len(msg), oobn, len(oob), unix.EIO)
	}
	return nil
}

// Recv reads one message into buf and returns its length and the
// descriptors that came with it (close-on-exec; the caller owns them). A
// message with more than want descriptors, or with a truncated control
// part, is an error and its descriptors are closed.
func Recv(c *net.UnixConn, buf []byte, want int) (int, []int, error) {
	oob := make([]byte, unix.CmsgSpace(4*max(want, 1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return n, nil, fmt.Errorf("uds: receive: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return n, nil, fmt.Errorf("%w: %v", ErrFDs, perr)
		}
		for i := range msgs {
			got, perr := unix.ParseUnixRights(&msgs[i])
			if perr != nil {
				continue // not SCM_RIGHTS
			}
			fds = append(fds, got...)
		}
	}
	if flags&unix.MSG_CTRUNC != 0 || len(fds) > want {
		Close(fds)
		return n, nil, fmt.Errorf("%w: %d descriptors (want at most %d), truncated %v", ErrFDs, len(fds), want, flags&unix.MSG_CTRUNC != 0)
	}
	return n, fds, nil
}

// Close closes descriptors received with Recv.
func Close(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
