package sock

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// TestListener: Accept returns a connection with TCP_NODELAY set and its
// peer's address, which RawIO reads and writes; a Close under a waiting
// RawIO read ends it with net.ErrClosed, and the listener's Close ends a
// waiting Accept with net.ErrClosed.
func TestListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(ln.(*net.TCPListener), true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cl, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if want := cl.LocalAddr().(*net.TCPAddr).AddrPort(); peer != want {
		t.Errorf("peer %v, want %v", peer, want)
	}
	var nodelay int
	if err := control(c, func(fd int) (err error) {
		nodelay, err = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
		return err
	}); err != nil || nodelay == 0 {
		t.Errorf("TCP_NODELAY %d, %v", nodelay, err)
	}
	rw := NewRawIO(2)
	if err := rw.Reset(c); err != nil {
		t.Fatal(err)
	}
	cl.Write([]byte("hello"))
	b := make([]byte, 16)
	if n, err := rw.Read(b); err != nil || string(b[:n]) != "hello" {
		t.Fatalf("Read: %q, %v", b[:n], err)
	}
	if _, err := rw.WriteBuffers([][]byte{[]byte("back")}); err != nil {
		t.Fatal(err)
	}
	cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cl.Read(b); err != nil || string(b[:n]) != "back" {
		t.Fatalf("peer read %q, %v", b[:n], err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Close()
	}()
	if _, err := rw.Read(b); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read under Close: %v, want net.ErrClosed", err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		l.Close()
	}()
	if _, _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept under Close: %v, want net.ErrClosed", err)
	}
}
