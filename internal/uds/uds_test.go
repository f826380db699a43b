package uds

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"

	"github.com/rdmago/te/internal/unix"
)

func pair(t *testing.T) (a, b *net.UnixConn) {
	t.Helper()
	name := fmt.Sprintf("@te-uds-test-%x", rand.Uint64())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	b, err = ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestPeerCredAndRights(t *testing.T) {
	a, b := pair(t)
	c, err := PeerCred(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.PID != int32(os.Getpid()) || c.UID != uint32(os.Getuid()) || c.GID != uint32(os.Getgid()) {
		t.Fatalf("cred %+v, want pid %d uid %d gid %d", c, os.Getpid(), os.Getuid(), os.Getgid())
	}
	fd, err := unix.MemfdCreate("uds-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 12345); err != nil {
		t.Fatal(err)
	}
	if err := Send(a, []byte("hello"), []int{fd, fd}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, fds, err := Recv(b, buf, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(fds)
	if string(buf[:n]) != "hello" || len(fds) != 2 {
		t.Fatalf("got %q with %d fds", buf[:n], len(fds))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fds[1], &st); err != nil || st.Size != 12345 {
		t.Fatalf("received fd: size %d, %v", st.Size, err)
	}
	if fl, _ := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); fl&unix.FD_CLOEXEC == 0 {
		t.Error("received fd is not close-on-exec")
	}
}

// TestRecvRefusesExtraFDs: descriptors beyond what the reader expects are
// an error and none of them stays open.
func TestRecvRefusesExtraFDs(t *testing.T) {
	if os.Getenv("TE_QEMU_USER") != "" {
		t.Skip("qemu-user translates SCM_RIGHTS with a descriptor of its own, so the fd count cannot be checked; the native run of make test checks it")
	}
	a, b := pair(t)
	fd, err := unix.MemfdCreate("uds-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := Send(a, []byte("x"), []int{fd, fd, fd}); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	_, fds, err := Recv(b, make([]byte, 4), 1)
	if !errors.Is(err, ErrFDs) || fds != nil {
		t.Fatalf("Recv: %v, fds %v", err, fds)
	}
	if after := openFDs(t); after != before {
		t.Fatalf("%d descriptors open before, %d after", before, after)
	}
	if err := Send(a, nil, make([]int, MaxFDs+1)); err == nil {
		t.Fatal("sent more than MaxFDs")
	}
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestReceiver: a Receiver gets messages with and without descriptors,
// refuses more descriptors than wanted, reports the peer's close as 0
// bytes, and allocates nothing for a message without descriptors.
func TestReceiver(t *testing.T) {
	a, b := pair(t)
	r, err := NewReceiver(b, 1)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.MemfdCreate("uds-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 64)
	if err := Send(a, []byte("with fd"), []int{fd}); err != nil {
		t.Fatal(err)
	}
	n, fds, err := r.Recv(buf)
	if err != nil || string(buf[:n]) != "with fd" || len(fds) != 1 {
		t.Fatalf("got %q, %v, %v", buf[:n], fds, err)
	}
	Close(fds)
	if err := Send(a, []byte("two"), []int{fd, fd}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Recv(buf); !errors.Is(err, ErrFDs) {
		t.Fatalf("two descriptors for one wanted: %v", err)
	}
	msg := []byte("plain")
	var failed error
	recv := func() {
		if err := Send(a, msg, nil); err != nil {
			failed = err
			return
		}
		n, fds, err := r.Recv(buf)
		if err != nil || n != len(msg) || fds != nil {
			failed = fmt.Errorf("got %d bytes, %v, %v", n, fds, err)
		}
	}
	recv()
	if allocs := testing.AllocsPerRun(100, recv); allocs != 0 || failed != nil {
		t.Fatalf("%v allocations per message (%v)", allocs, failed)
	}
	a.Close()
	if n, _, err := r.Recv(buf); n != 0 || err != nil {
		t.Fatalf("after the peer closed: %d, %v", n, err)
	}
}
