package sock

import (
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// TestRawListener: Accept finds nothing (ErrWouldBlock) until a
// connection waits, which a Poller reports; the connection has
// TCP_NODELAY exactly when the listener was asked for it (set once on the
// listener, inherited) and its peer's address.
func TestRawListener(t *testing.T) {
	for _, nodelay := range []bool{true, false} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewRawListener(ln.(*net.TCPListener), nodelay)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPoller(4)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.AddListener(l, 7); err != nil {
			t.Fatal(err)
		}
		if fd, _, err := l.Accept(); err != ErrWouldBlock {
			t.Fatalf("Accept with none waiting: %d, %v", fd, err)
		}
		cl, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if n, _, err := p.Wait(5 * time.Second); err != nil || n != 1 {
			t.Fatalf("Wait: %d, %v", n, err)
		}
		if tok, _ := p.Event(0); tok != 7 {
			t.Fatalf("token %d, want 7", tok)
		}
		fd, peer, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if want := cl.LocalAddr().(*net.TCPAddr).AddrPort(); peer != want {
			t.Errorf("peer %v, want %v", peer, want)
		}
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
		if err != nil || (v != 0) != nodelay {
			t.Errorf("nodelay %v: accepted TCP_NODELAY %d, %v", nodelay, v, err)
		}
		CloseFD(fd)
		cl.Close()
		p.Close()
		l.Close()
	}
}
