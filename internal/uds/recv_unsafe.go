package uds

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"github.com/rdmago/te/internal/unix"
)

// Receiver receives one connection's messages into the caller's buffer
// without allocating (Recv allocates a control buffer per call, and net's
// ReadMsgUnix the sender's address): its control buffer is reused and the
// kernel is asked for no address. A message with descriptors still
// allocates their slice.
type Receiver struct {
	rc   syscall.RawConn
	want int
	oob  []byte
	read func(fd uintptr) bool // r.recvmsg, bound once

	// The call in progress.
	buf            []byte
	n, oobn, flags int
	errno          unix.Errno
}

// NewReceiver returns a Receiver for c that accepts at most want
// descriptors per message.
func NewReceiver(c *net.UnixConn, want int) (*Receiver, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("uds: receiver: %w", err)
	}
	r := &Receiver{rc: rc, want: want, oob: make([]byte, unix.CmsgSpace(4*max(want, 1)))}
	r.read = r.recvmsg
	return r, nil
}

// recvmsg is one recvmsg(2) into r.buf and r.oob, without a name. Safe:
// the header and its iovec point into r.buf and r.oob, which the caller
// keeps alive across the call (Recv holds them), and the kernel writes at
// most their lengths, which the header states.
func (r *Receiver) recvmsg(fd uintptr) bool {
	var iov unix.Iovec
	iov.Base = unsafe.SliceData(r.buf)
	iov.SetLen(len(r.buf))
	var msg unix.Msghdr
	msg.Iov = &iov
	msg.Iovlen = 1
	msg.Control = unsafe.SliceData(r.oob)
	msg.SetControllen(len(r.oob))
	n, _, errno := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&msg)), unix.MSG_CMSG_CLOEXEC)
	if errno == unix.EAGAIN {
		return false // the poller waits for the socket
	}
	r.n, r.oobn, r.flags, r.errno = int(n), int(msg.Controllen), int(msg.Flags), errno
	return true
}

// Recv reads one message into buf (not empty) and returns its length
// (0: the peer closed) and the descriptors that came with it, as Recv
// does. Calls must not overlap.
func (r *Receiver) Recv(buf []byte) (int, []int, error) {
	if len(buf) == 0 {
		return 0, nil, errors.New("uds: receive into an empty buffer")
	}
	r.buf = buf
	err := r.rc.Read(r.read)
	r.buf = nil
	if err != nil {
		return 0, nil, fmt.Errorf("uds: receive: %w", err)
	}
	if r.errno != 0 {
		return 0, nil, fmt.Errorf("uds: receive: %w", r.errno)
	}
	var fds []int
	if r.oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(r.oob[:r.oobn])
		if perr != nil {
			return r.n, nil, fmt.Errorf("%w: %v", ErrFDs, perr)
		}
		for i := range msgs {
			got, perr := unix.ParseUnixRights(&msgs[i])
			if perr != nil {
				continue // not SCM_RIGHTS
			}
			fds = append(fds, got...)
		}
	}
	if r.flags&unix.MSG_CTRUNC != 0 || len(fds) > r.want {
		Close(fds)
		return r.n, nil, fmt.Errorf("%w: %d descriptors (want at most %d), truncated %v", ErrFDs, len(fds), r.want, r.flags&unix.MSG_CTRUNC != 0)
	}
	return r.n, fds, nil
}
