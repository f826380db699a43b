//go:build !linux

package sock

import (
	"io"
	"net"
	"net/netip"
	"syscall"
)

// Conn is an accepted connection: a socket for RawIO, closed once.
type Conn interface {
	syscall.Conn
	io.Closer
}

// Listener is net's accept where raw system calls are not written.
type Listener struct {
	ln      *net.TCPListener
	nodelay bool
}

// NewListener returns a Listener of ln, which it closes; nodelay sets
// TCP_NODELAY on every connection.
func NewListener(ln *net.TCPListener, nodelay bool) (*Listener, error) {
	return &Listener{ln: ln, nodelay: nodelay}, nil
}

// Accept waits for the next connection and returns it with its peer's
// address.
func (l *Listener) Accept() (Conn, netip.AddrPort, error) {
	c, err := l.ln.AcceptTCP()
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	c.SetNoDelay(l.nodelay)
	ap := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	return c, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// Addr is the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening: an Accept waiting returns net.ErrClosed.
func (l *Listener) Close() error { return l.ln.Close() }
