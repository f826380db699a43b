package sock

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// notEmulated skips where the tests run under qemu-user (make test-arm64
// sets TE_QEMU_USER): it answers SO_COOKIE with EINVAL and copies only
// the first word of TCP_INFO, so only a native run can check them, and
// make test has one.
func notEmulated(t *testing.T) {
	t.Helper()
	if os.Getenv("TE_QEMU_USER") != "" {
		t.Skip("qemu-user does not pass SO_COOKIE and TCP_INFO through; the native run of make test checks them")
	}
}

func pair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	notEmulated(t)
	return tcpPair(t)
}

// tcpPair is a connected loopback TCP pair, closed when t ends.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func TestCookie(t *testing.T) {
	c, s := pair(t)
	cc, err := Cookie(c)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := Cookie(s)
	if err != nil {
		t.Fatal(err)
	}
	if cc == 0 || sc == 0 || cc == sc {
		t.Fatalf("cookies %d and %d: want two distinct non-zero values", cc, sc)
	}
	again, _ := Cookie(c)
	if again != cc {
		t.Fatalf("cookie changed: %d then %d", cc, again)
	}
	c.Close()
	if _, err := Cookie(c); err == nil {
		t.Fatal("Cookie of a closed connection: no error")
	}
}

// TCPInfo's byte counters equal what moved: the receiver counts exactly
// the payload; the sender's acked bytes add one for its SYN.
func TestTCPInfoCounts(t *testing.T) {
	c, s := pair(t)
	const n = 3<<20 + 4321
	go func() {
		buf := make([]byte, 64<<10)
		for left := n; left > 0; {
			k, err := c.Write(buf[:min(left, len(buf))])
			if err != nil {
				return
			}
			left -= k
		}
	}()
	if _, err := io.CopyN(io.Discard, s, n); err != nil {
		t.Fatal(err)
	}
	si, err := TCPInfo(s)
	if err != nil {
		t.Fatal(err)
	}
	if si.BytesReceived != n || si.State != 1 {
		t.Fatalf("receiver: %+v, want BytesReceived %d, state ESTABLISHED (1)", si, n)
	}
	var ci Info
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if ci, err = TCPInfo(c); err != nil {
			t.Fatal(err)
		}
		if ci.BytesAcked == n+1 {
			break
		}
	}
	if ci.BytesAcked != n+1 || ci.BytesSent < n || ci.RTT <= 0 || ci.RTT > time.Second {
		t.Fatalf("sender: %+v, want BytesAcked %d (payload + SYN), BytesSent >= %d, RTT in (0, 1s]", ci, n+1, n)
	}
}

// A closed connection's error is net.ErrClosed, so callers can tell it
// from a refused option.
func TestClosed(t *testing.T) {
	c, _ := pair(t)
	c.Close()
	if _, err := Cookie(c); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Cookie after Close: %v, want net.ErrClosed", err)
	}
	if _, err := TCPInfo(c); !errors.Is(err, net.ErrClosed) {
		t.Errorf("TCPInfo after Close: %v, want net.ErrClosed", err)
	}
}
