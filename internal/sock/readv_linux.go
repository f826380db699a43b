package sock

import (
	"io"
	"syscall"

	"github.com/rdmago/te/internal/unix"
)

// MaxIov is the kernel's IOV_MAX: the most buffers one readv takes.
const MaxIov = 1024

// VecReader reads from a socket into several buffers with one readv(2),
// waiting on the runtime's poller like net.Conn.Read (deadlines and Close
// included); the readv does not enter the scheduler (see RawIO: the
// runtime's poller keeps its sockets non-blocking). It allocates nothing per call; one goroutine uses it at a
// time.
type VecReader struct {
	rc   syscall.RawConn
	iov  []unix.Iovec
	n    int
	err  error
	read func(fd uintptr) bool // v.fill, bound once
}

// NewVecReader returns a VecReader over c's socket that reads into at
// most bufs buffers at once (at most MaxIov).
func NewVecReader(c syscall.Conn, bufs int) (*VecReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	v := &VecReader{rc: rc, iov: make([]unix.Iovec, 0, min(max(bufs, 1), MaxIov))}
	v.read = v.fill
	return v, nil
}

func (v *VecReader) fill(fd uintptr) bool {
	for {
		v.n, v.err = unix.ReadvNonblock(int(fd), v.iov)
		if v.err != unix.EINTR {
			break
		}
	}
	return v.err != unix.EAGAIN
}

// Read reads into bufs (as many non-empty ones as it was made for; empty ones are skipped)
// with one readv once the socket is readable, and returns the bytes read:
// at least one, or an error (io.EOF when the peer closed).
func (v *VecReader) Read(bufs [][]byte) (int, error) {
	v.iov, _ = iovecs(v.iov, bufs)
	if len(v.iov) == 0 {
		return 0, nil
	}
	v.n, v.err = 0, nil
	err := v.rc.Read(v.read)
	clear(v.iov) // drop the pointers into the caller's buffers
	switch {
	case err != nil:
		return 0, err
	case v.err != nil:
		return 0, v.err
	case v.n == 0:
		return 0, io.EOF
	}
	return v.n, nil
}

// iovecs points iov (emptied first) at the non-empty bufs, as many as its
// capacity holds, and returns it with the bytes it spans.
func iovecs(iov []unix.Iovec, bufs [][]byte) ([]unix.Iovec, int) {
	iov = iov[:0]
	n := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if len(iov) == cap(iov) {
			break
		}
		var iv unix.Iovec
		iv.Base = &b[0]
		iv.SetLen(len(b))
		iov = append(iov, iv)
		n += len(b)
	}
	return iov, n
}
