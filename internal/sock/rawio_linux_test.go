package sock

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/internal/unix"
)

// TestRawIO: WriteBuffers delivers every byte in order, empty buffers
// skipped, across more bytes than the socket buffers hold (so it waits
// for the reader) and more buffers than one writev takes; Read returns
// what arrived, io.EOF once the peer closed its side, and net.ErrClosed
// when the connection is closed under a waiting Read.
func TestRawIO(t *testing.T) {
	c, s := tcpPair(t)
	rw := NewRawIO(4)
	if err := rw.Reset(s); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var bufs [][]byte
	var want []byte
	for i := range 11 {
		b := make([]byte, []int{0, 1, 7, 1 << 20, 3 << 20}[i%5])
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the writer fills the buffers first
		b, _ := io.ReadAll(c)
		got <- b
	}()
	n, err := rw.WriteBuffers(bufs)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("WriteBuffers: %d, %v; want %d", n, err, len(want))
	}
	s.CloseWrite()
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, not the %d written", len(b), len(want))
	}

	// Read: a byte written later, then EOF.
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Write([]byte("mooncake"))
		c.CloseWrite()
	}()
	b, err := io.ReadAll(rw)
	if err != nil || string(b) != "mooncake" {
		t.Fatalf("read %q, %v", b, err)
	}

	// Close under a waiting Read.
	c2, s2 := tcpPair(t)
	_ = c2
	if err := rw.Reset(s2); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(20*time.Millisecond, func() { s2.Close() })
	if _, err := rw.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read on a closed connection: %v, want net.ErrClosed", err)
	}
	if _, err := rw.WriteBuffers([][]byte{[]byte("x")}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WriteBuffers on a closed connection: %v, want net.ErrClosed", err)
	}
}

// TestRawIOAllocs: a request's read and reply allocate nothing.
func TestRawIOAllocs(t *testing.T) {
	c, s := tcpPair(t)
	rw := NewRawIO(2)
	if err := rw.Reset(s); err != nil {
		t.Fatal(err)
	}
	req, st, payload := make([]byte, 24), make([]byte, 8), make([]byte, 4096)
	reply := [][]byte{st, payload}
	back := make([]byte, len(st)+len(payload))
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rw, req); err != nil {
			t.Fatal(err)
		}
		if _, err := rw.WriteBuffers(reply); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per request", allocs)
	}
}

// TestRawIOTryWrite: TryWriteBuffers writes a small reply whole without
// waiting; of more bytes than the socket buffers hold it writes what they
// take and leaves the rest, which Finish writes once the peer reads: every
// byte in order.
func TestRawIOTryWrite(t *testing.T) {
	c, s := tcpPair(t)
	rw := NewRawIO(4)
	if err := rw.Reset(s); err != nil {
		t.Fatal(err)
	}
	small := []byte("mooncake")
	if done, err := rw.TryWriteBuffers([][]byte{small[:4], nil, small[4:]}); !done || err != nil {
		t.Fatalf("small TryWriteBuffers: %v, %v; want true, nil", done, err)
	}
	got := make([]byte, len(small))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("peer read %q, %v", got, err)
	}

	rng := rand.New(rand.NewPCG(3, 4))
	var bufs [][]byte
	var want []byte
	for range 6 {
		b := make([]byte, 4<<20)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	done, err := rw.TryWriteBuffers(bufs)
	if done || err != nil {
		t.Fatalf("TryWriteBuffers of %d bytes nobody reads: %v, %v; want false, nil", len(want), done, err)
	}
	all := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		all <- b
	}()
	n, err := rw.Finish()
	if err != nil || n != int64(len(want)) {
		t.Fatalf("Finish: %d, %v; want %d", n, err, len(want))
	}
	s.CloseWrite()
	if b := <-all; !bytes.Equal(b, want) {
		t.Fatalf("peer read %d bytes, not the %d written", len(b), len(want))
	}
}

// TestRawIOReadWait: a read that waits with a mark is not woken by fewer
// bytes (24 queued under a mark of 1 MiB wait for the peer's close, which
// wakes it) once the receive window is wide enough for a mark (half of
// it at least 64 KiB; a kernel before 6.2, which does not report the
// window, sets none and is woken by the 24 bytes), a later Read with no
// mark is woken by one short message (the mark is lowered before it
// waits, so a reader cannot hang on a stale one), and every byte arrives
// in order.
func TestRawIOReadWait(t *testing.T) {
	c, s := tcpPair(t)
	rw := NewRawIO(1)
	if err := rw.Reset(s); err != nil {
		t.Fatal(err)
	}
	// 16 MiB read with marks (the window grows as the reader keeps up):
	// whole and in order.
	want := make([]byte, 16<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // the reader waits with its mark first
		c.Write(want)
	}()
	got := make([]byte, len(want))
	for n := 0; n < len(got); {
		k, err := rw.ReadWait(got[n:], min(len(got)-n, 1<<20))
		if err != nil {
			t.Fatalf("ReadWait after %d bytes: %v", n, err)
		}
		n += k
	}
	if !bytes.Equal(got, want) {
		t.Fatal("ReadWait returned other bytes than were written")
	}

	// The mark lowered: one short message wakes a plain Read. Should it
	// not, the timer's close ends the wait with an error, not a hang.
	stop := time.AfterFunc(10*time.Second, func() { s.Close() })
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Write([]byte("twenty-four bytes header"))
	}()
	if b, err := io.ReadAll(io.LimitReader(rw, 24)); err != nil || string(b) != "twenty-four bytes header" {
		t.Fatalf("Read after a marked wait: %q, %v (the mark was not lowered)", b, err)
	}
	stop.Stop()

	// 24 bytes under a mark of 1 MiB: they wake the reader only where no
	// mark could be set.
	var ti unix.TCPInfo
	if err := control(s, func(fd int) error { return unix.GetsockoptTCPInfoNonblock(fd, &ti) }); err != nil {
		t.Fatal(err)
	}
	marked := int(ti.Rcv_wnd/2) >= minMark
	t.Logf("receive window %d bytes: marked %v", ti.Rcv_wnd, marked)
	var sent, closed atomic.Int64
	go func() {
		time.Sleep(20 * time.Millisecond)
		sent.Store(time.Now().UnixNano())
		c.Write([]byte("twenty-four bytes header"))
		time.Sleep(300 * time.Millisecond)
		closed.Store(time.Now().UnixNano())
		c.CloseWrite()
	}()
	buf := make([]byte, 1<<20)
	n, err := rw.ReadWait(buf, len(buf))
	woke := time.Now().UnixNano()
	if err != nil || string(buf[:n]) != "twenty-four bytes header" {
		t.Fatalf("ReadWait: %q, %v", buf[:n], err)
	}
	if at := closed.Load(); marked && (at == 0 || woke < at) {
		t.Fatal("24 bytes woke a ReadWait that asked for 1 MiB before the peer closed")
	}
	if at := closed.Load(); !marked && at != 0 && sent.Load() != 0 && woke >= at {
		t.Fatal("with no mark, 24 bytes did not wake ReadWait before the peer closed")
	}
	if n, err := rw.ReadWait(buf, len(buf)); n != 0 || err != io.EOF {
		t.Fatalf("ReadWait at EOF: %d, %v; want io.EOF", n, err)
	}
}
