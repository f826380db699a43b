package acceptor

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
)

func openFDs(t *testing.T) uint64 {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return uint64(len(ents))
}

// TestSurvivesEMFILE: clients wait in the backlog of a real listener
// while the process may open only a few more descriptors. Run accepts
// until accept fails with EMFILE, backs off (logging about once a second,
// not per failure), and accepts the rest once descriptors are allowed
// again; closing the listener ends it.
func TestSurvivesEMFILE(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const clients = 16
	var dialed []net.Conn
	defer func() {
		for _, c := range dialed {
			c.Close()
		}
	}()
	for range clients {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		dialed = append(dialed, c)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = openFDs(t) + 4 // room for 4 accepted connections
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
				t.Error(err)
			}
		}
	}
	defer restore()

	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	accepted := make(chan net.Conn, clients)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(log, "test", ln.Addr(), nil, ln.Accept, func(c net.Conn) { accepted <- c })
	}()
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	deadline := time.After(30 * time.Second)
	// Out of descriptors: some accepted, then the warning.
	for !strings.Contains(logs.String(), "accept failed; backing off") {
		select {
		case c := <-accepted:
			held = append(held, c)
		case <-deadline:
			t.Fatalf("no accept failure after %d connections; log:\n%s", len(held), logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if len(held) >= clients {
		t.Fatalf("all %d clients accepted under a limit of %d descriptors", clients, lim.Cur)
	}
	time.Sleep(1500 * time.Millisecond) // keep failing for a while
	restore()
	for len(held) < clients {
		select {
		case c := <-accepted:
			held = append(held, c)
		case <-deadline:
			t.Fatalf("%d of %d clients accepted after descriptors were allowed again; log:\n%s", len(held), clients, logs.String())
		}
	}
	// Failures kept happening for 1.5 s, every BackoffMax at the latest;
	// the warning came at most once a second.
	if n := strings.Count(logs.String(), "accept failed"); n < 1 || n > 3 {
		t.Errorf("%d warnings in ~1.5 s of failures; log:\n%s", n, logs.String())
	}
	ln.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the listener closed")
	}
}

// TestStop: an accept that keeps failing does not hold Run past stop.
func TestStop(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	calls := 0
	go func() {
		defer close(done)
		Run(slog.New(slog.DiscardHandler), "test", nil, stop, func() (net.Conn, error) {
			calls++
			return nil, errors.New("too many open files")
		}, func(net.Conn) { t.Error("handle called") })
	}()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after stop")
	}
	// 5, 10, 20, 40, 80, 160 ms ... : a handful, not a spin.
	if calls < 2 || calls > 10 {
		t.Errorf("%d accepts in 300 ms of failures", calls)
	}
}
