package sock

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// acceptedFD is the server side of a fresh loopback connection, accepted
// by a RawListener (non-blocking, off the runtime's poller), and its
// client.
func acceptedFD(t *testing.T) (int, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewRawListener(ln.(*net.TCPListener), true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cl, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	for deadline := time.Now().Add(5 * time.Second); ; {
		fd, _, err := l.Accept()
		if err == nil {
			t.Cleanup(func() { CloseFD(fd) })
			return fd, cl
		}
		if err != ErrWouldBlock || time.Now().After(deadline) {
			t.Fatalf("accept: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReadWaitFD: one ReadWaitFD takes a megabyte sent in 64 KiB pieces
// with pauses between them, and leaves the socket non-blocking; a wait
// ends at its bound with what came (ErrWouldBlock for nothing); the
// peer's close is io.EOF once its bytes are read.
func TestReadWaitFD(t *testing.T) {
	fd, cl := acceptedFD(t)
	if err := SetWaitBound(fd, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const size, piece = 1 << 20, 64 << 10
	src := bytes.Repeat([]byte("ReadWaitFD."), size/11+1)[:size]
	sent := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += piece {
			if _, err := cl.Write(src[off : off+piece]); err != nil {
				sent <- err
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		sent <- nil
	}()
	dst := make([]byte, size)
	n, err := ReadWaitFD(fd, dst)
	if err != nil || n != size {
		t.Fatalf("ReadWaitFD of %d bytes sent in pieces: %d, %v", size, n, err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("ReadWaitFD read other bytes than sent")
	}
	if n, err := ReadFD(fd, dst); err != ErrWouldBlock {
		t.Fatalf("ReadFD after ReadWaitFD, nothing sent: %d, %v (the socket must be non-blocking again)", n, err)
	}

	const bound = 50 * time.Millisecond
	if err := SetWaitBound(fd, bound); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if n, err := ReadWaitFD(fd, dst); err != ErrWouldBlock {
		t.Fatalf("ReadWaitFD, nothing sent: %d, %v", n, err)
	}
	if took := time.Since(start); took < bound*8/10 || took > 40*bound {
		t.Errorf("ReadWaitFD, nothing sent, returned after %v; bound %v", took, bound)
	}
	if _, err := cl.Write(src[:100]); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if n, err := ReadWaitFD(fd, dst); err != nil || n != 100 || !bytes.Equal(dst[:n], src[:100]) {
		t.Fatalf("ReadWaitFD, 100 bytes sent: %d, %v", n, err)
	}
	if took := time.Since(start); took > 40*bound {
		t.Errorf("ReadWaitFD, 100 bytes sent, returned after %v; bound %v", took, bound)
	}

	if _, err := cl.Write(src[:10]); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if n, err := ReadWaitFD(fd, dst); err != nil || n != 10 {
		t.Fatalf("ReadWaitFD, 10 bytes sent and closed: %d, %v", n, err)
	}
	if n, err := ReadWaitFD(fd, dst); err != io.EOF {
		t.Fatalf("ReadWaitFD after the peer's close: %d, %v", n, err)
	}
	if n, err := ReadWaitFD(fd, nil); err != nil || n != 0 {
		t.Fatalf("ReadWaitFD into nothing: %d, %v", n, err)
	}
}
