//go:build !linux

package sock

import (
	"errors"
	"net"
	"syscall"
)

// RawIO is net.Conn's own I/O where raw system calls are not written.
type RawIO struct{ c net.Conn }

// NewRawIO returns a RawIO for Reset to point at a connection.
func NewRawIO(int) *RawIO { return &RawIO{} }

// Reset points r at c, which must be a net.Conn; nil lets go of it.
func (r *RawIO) Reset(c syscall.Conn) error {
	r.c = nil
	if c == nil {
		return nil
	}
	nc, ok := c.(net.Conn)
	if !ok {
		return errors.New("sock: RawIO needs a net.Conn")
	}
	r.c = nc
	return nil
}

// Read reads from the connection.
func (r *RawIO) Read(p []byte) (int, error) { return r.c.Read(p) }

// ReadWait is Read: the wake-up mark is Linux's.
func (r *RawIO) ReadWait(p []byte, _ int) (int, error) { return r.c.Read(p) }

// WriteBuffers writes all of bufs.
func (r *RawIO) WriteBuffers(bufs [][]byte) (int64, error) {
	b := net.Buffers(bufs)
	return b.WriteTo(r.c)
}

// TryWriteBuffers writes all of bufs.
func (r *RawIO) TryWriteBuffers(bufs [][]byte) (bool, error) {
	_, err := r.WriteBuffers(bufs)
	return err == nil, err
}

// Finish has nothing left to write.
func (r *RawIO) Finish() (int64, error) { return 0, nil }
