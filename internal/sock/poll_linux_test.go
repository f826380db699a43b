package sock

import (
	"bytes"
	"io"
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

// TestVecWriteMore: bytes written with WriteMore wait in the kernel (a
// short segment, TCP_NODELAY set) until the next Write sends them with
// its own; in order, empty buffers skipped.
func TestVecWriteMore(t *testing.T) {
	fd, cl := acceptedFD(t)
	status := []byte("statuswd")
	chunk := make([]byte, 64<<10+3)
	for i := range chunk {
		chunk[i] = byte(i*7 + i>>9)
	}
	tail := []byte("the last pass")
	v := NewVec(2)
	if n, err := v.WriteMore(fd, [][]byte{status, nil}); err != nil || n != len(status) {
		t.Fatalf("WriteMore(status): %d, %v", n, err)
	}
	// Held: nothing has left yet.
	cl.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var one [1]byte
	if n, err := cl.Read(one[:]); n != 0 || err == nil {
		t.Fatalf("a short segment written with MSG_MORE arrived before the next write: %d, %v", n, err)
	}
	want := append(append([]byte(nil), status...), chunk...)
	want = append(want, tail...)
	go func() {
		// The chunk may take several writes if the socket fills.
		for b := chunk; len(b) > 0; {
			n, err := v.WriteMore(fd, [][]byte{nil, b})
			if err == ErrWouldBlock {
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				t.Errorf("WriteMore(chunk): %v", err)
				return
			}
			b = b[n:]
		}
		if n, err := v.Write(fd, [][]byte{tail}); err != nil || n != len(tail) {
			t.Errorf("Write(tail): %d, %v", n, err)
		}
	}()
	cl.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(cl, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ from what was written")
	}
}
