package mctcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/sock"
)

// TestTargetAdmission: at MaxConns the connection that has waited
// longest for its initiator is closed to make room; the others serve.
func TestTargetAdmission(t *testing.T) {
	n := newNode(t, nil, "target", 1<<20, Config{MaxConns: 2, IOTimeout: 120 * time.Millisecond}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	oldest := dialRaw(t, addr)
	time.Sleep(40 * time.Millisecond) // a few ticks of the watchdog's clock
	second := dialRaw(t, addr)
	time.Sleep(40 * time.Millisecond)
	third := dialRaw(t, addr)
	oldest.closed()
	for _, r := range []*rawConn{second, third} {
		r.send(hdr(8, base, 0x80))
		if got := r.read(8); !bytes.Equal(got, okStatus) {
			t.Fatalf("status % x", got)
		}
		r.read(8)
	}
}

// TestTargetAdmissionPerSource: MaxConnsPerSource evicts within the
// source too.
func TestTargetAdmissionPerSource(t *testing.T) {
	n := newNode(t, nil, "target", 1<<20, Config{MaxConnsPerSource: 1, IOTimeout: 120 * time.Millisecond}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	first := dialRaw(t, addr)
	time.Sleep(40 * time.Millisecond)
	second := dialRaw(t, addr)
	first.closed()
	second.send(hdr(8, base, 0x80))
	if got := second.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("status % x", got)
	}
}

// rawClient is an initiator in Mooncake's default mode (a connection per
// request) that allocates nothing: plain system calls on blocking
// sockets, so an AllocsPerRun of it counts the target's allocations.
type rawClient struct {
	sa  syscall.SockaddrInet4
	req []byte // header and payload
	st  [statusLen]byte
}

func (r *rawClient) request() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Connect(fd, &r.sa); err != nil {
		return err
	}
	for b := r.req; len(b) > 0; {
		n, err := syscall.Write(fd, b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	for got := 0; got < statusLen; {
		n, err := syscall.Read(fd, r.st[got:])
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		got += n
	}
	if !bytes.Equal(r.st[:], okStatus) {
		return errors.New("status not OK")
	}
	return nil
}

// TestConnPerRequestAllocs: the target allocates nothing per connection
// in Mooncake's default mode (accept, a 64 KiB WRITE, its status, the
// close).
func TestConnPerRequestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	n := newNode(t, nil, "target", 1<<20, Config{}, nil)
	ap, err := net.ResolveTCPAddr("tcp", n.tr.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	r := &rawClient{sa: syscall.SockaddrInet4{Port: ap.Port}, req: make([]byte, headerLen+64<<10)}
	copy(r.sa.Addr[:], ap.IP.To4())
	copy(r.req, hdr(64<<10, n.base(), 0x81))
	var failed error
	run := func() {
		if err := r.request(); err != nil && failed == nil {
			failed = err
		}
	}
	for range 50 {
		run()
	}
	allocs := testing.AllocsPerRun(200, run)
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per connection", allocs)
	}
}

// TestTargetCloseLeaks: Close with connections idle, mid-request and
// served closes them all and leaves no descriptor behind: the listener,
// the poller's two and every connection's (goroutines: TestMain's leak
// check); a second Close (the engine's) is a no-op.
func TestTargetCloseLeaks(t *testing.T) {
	n := newNode(t, nil, "target", 1<<20, Config{}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	before := openFDs(t)
	idle := dialRaw(t, addr)
	mid := dialRaw(t, addr)
	mid.send(hdr(4096, base, 0x81)[:10])
	served := dialRaw(t, addr)
	served.send(hdr(8, base, 0x80))
	served.read(16)
	n.tr.Close()
	for _, r := range []*rawConn{idle, mid, served} {
		r.closed()
		r.c.Close()
	}
	if after := openFDs(t); after != before-3 {
		t.Fatalf("%d descriptors open before the connections, %d after Close (want %d: listener, epoll and eventfd closed)", before, after, before-3)
	}
	n.tr.Close()
}

func openFDs(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestLargeWriteThenRead: two 1 MiB WRITEs pipelined on one connection
// (the wake-up marks of large payloads set and lowered between them),
// then a READ of the first on the same connection: the bytes land and
// come back, each answer in order.
func TestLargeWriteThenRead(t *testing.T) {
	const size = 1 << 20
	n := newNode(t, nil, "target", 4*size, Config{}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	mem := n.mem.Bytes()
	r := dialRaw(t, addr)
	var payloads [2][]byte
	for i := range payloads {
		payloads[i] = bytes.Repeat([]byte{byte(0x31 + i), 0x7e, byte(i)}, size/3+1)[:size]
	}
	sent := make(chan error, 1)
	go func() { // the target may answer the first before it reads the second
		for i, p := range payloads {
			if _, err := r.c.Write(hdr(size, base+uint64(i)*size, 0x81)); err != nil {
				sent <- err
				return
			}
			if _, err := r.c.Write(p); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	for i := range payloads {
		if got := r.read(8); !bytes.Equal(got, okStatus) {
			t.Fatalf("WRITE %d status % x", i, got)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		if !bytes.Equal(mem[i*size:(i+1)*size], p) {
			t.Fatalf("WRITE %d did not land", i)
		}
	}
	r.send(hdr(size, base, 0x80))
	if got := r.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("READ status % x", got)
	}
	if got := r.read(size); !bytes.Equal(got, payloads[0]) {
		t.Fatal("READ returned other bytes than the WRITE left")
	}
}

// TestGoroutinePath runs the wire tests on the goroutine per connection
// (server.go) that builds without epoll use, the loop's poller made to
// fail.
func TestGoroutinePath(t *testing.T) {
	orig := newPoller
	newPoller = func() (*sock.Poller, error) { return nil, errors.ErrUnsupported }
	defer func() { newPoller = orig }()
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"Wire", TestTargetWire},
		{"Stall", TestTargetStall},
		{"LargeWriteThenRead", TestLargeWriteThenRead},
		{"Version1", TestVersion1},
		{"Conformance", TestConformance},
		{"SteadyStateAllocs", TestSteadyStateAllocs},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.f(t)
			tr := newNode(t, nil, "probe", 4096, Config{}, nil).tr
			if tr.lp != nil || tr.ln == nil {
				t.Fatal("the target runs the event loop, not the goroutine path")
			}
		})
	}
}

// TestLaneWait: on a lane (a connection that has answered a request), a
// large WRITE's payload sent in pieces lands (read by waits in the
// kernel); one that stops midway holds the loop no longer than a wait's
// bound: another connection is served meanwhile, and the stalled lane is
// closed after IOTimeout.
func TestLaneWait(t *testing.T) {
	const size, piece = 1 << 20, 64 << 10
	const timeout = 300 * time.Millisecond
	n := newNode(t, nil, "target", 2*size, Config{IOTimeout: timeout}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	mem := n.mem.Bytes()
	lane := dialRaw(t, addr)
	lane.send(hdr(8, base, 0x80))
	lane.read(16)
	p := bytes.Repeat([]byte{0x5a, 0x17, 0xc3}, size/3+1)[:size]
	lane.send(hdr(size, base, 0x81))
	for off := 0; off < size; off += piece {
		lane.send(p[off : off+piece])
		time.Sleep(time.Millisecond)
	}
	if got := lane.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("WRITE in pieces: status % x", got)
	}
	if !bytes.Equal(mem[:size], p) {
		t.Fatal("WRITE in pieces did not land")
	}

	lane.send(hdr(size, base+size, 0x81), p[:size/2])
	start := time.Now()
	other := servedBeside(t, addr, base)
	lane.closed()
	if took := time.Since(start); took < timeout || took > 10*timeout {
		t.Errorf("lane stalled mid-payload closed after %v; IOTimeout %v", took, timeout)
	}
	other.send(hdr(8, base, 0x80))
	other.read(16)
}

// TestLaneWaitOut: on a lane, a READ larger than the sockets' buffers
// reaches an initiator that reads it in pieces whole; one whose initiator
// stops reading midway holds up no other connection, which is served
// meanwhile, and the stalled lane is closed after IOTimeout.
func TestLaneWaitOut(t *testing.T) {
	const size, piece = 8 << 20, 256 << 10
	const timeout = 300 * time.Millisecond
	n := newNode(t, nil, "target", size, Config{IOTimeout: timeout}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	mem := n.mem.Bytes()
	for i := range mem {
		mem[i] = byte(i*7 + i>>12)
	}
	lane := dialRaw(t, addr)
	lane.send(hdr(8, base, 0x80))
	lane.read(16)
	lane.send(hdr(size, base, 0x80))
	if got := lane.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("READ of %d: status % x", size, got)
	}
	got := make([]byte, 0, size)
	for len(got) < size {
		got = append(got, lane.read(piece)...)
		time.Sleep(time.Millisecond)
	}
	if !bytes.Equal(got, mem) {
		t.Fatal("READ read in pieces: other bytes than the target's")
	}

	lane.send(hdr(size, base, 0x80)) // and never read
	start := time.Now()
	other := servedBeside(t, addr, base)
	// The target closes the lane after IOTimeout: what it had queued by
	// then arrives, then the end, short of the answer.
	time.Sleep(time.Until(start.Add(3 * timeout)))
	lane.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	k, err := io.Copy(io.Discard, lane.c)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the lane stalled mid-answer was not closed after IOTimeout (%v): %d bytes came", timeout, k)
	}
	if k >= 8+size {
		t.Fatalf("the lane stalled mid-answer got all of it (%d bytes) after IOTimeout", k)
	}
	other.send(hdr(8, base, 0x80))
	other.read(16)
}

// servedBeside dials the target at addr while a lane of it is stalled, and
// checks that 20 small READs of base are each served promptly.
func servedBeside(t *testing.T, addr string, base uint64) *rawConn {
	t.Helper()
	other := dialRaw(t, addr)
	for i := range 20 {
		begin := time.Now()
		other.send(hdr(8, base, 0x80))
		other.read(16)
		if took := time.Since(begin); took > 100*time.Millisecond {
			t.Errorf("request %d beside a stalled lane took %v", i, took)
		}
	}
	return other
}

// A lane the poller reports while it waits on the run list (its socket
// took more of a large READ's answer) is on that list once: it gets one
// pass a round like every other lane.
func TestRunListOnce(t *testing.T) {
	var rounds, dups atomic.Int64
	runRoundHook = func(run []uint64) {
		rounds.Add(1)
		for i, tok := range run {
			if slices.Contains(run[:i], tok) {
				dups.Add(1)
				return
			}
		}
	}
	t.Cleanup(func() { runRoundHook = nil })
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		p := newBenchPair(t, engine.Read, size, func() engine.Transport { return New(Config{}) })
		for start := time.Now(); time.Since(start) < time.Second; {
			p.batch(t)
		}
	}
	t.Logf("%d run-list rounds, %d with a connection twice", rounds.Load(), dups.Load())
	if rounds.Load() == 0 {
		t.Fatal("no run-list round: the lanes' passes were not exercised")
	}
	if dups.Load() != 0 {
		t.Fatalf("%d of %d run-list rounds had a connection on them twice", dups.Load(), rounds.Load())
	}
}

// Large READs a connection each (Mooncake's default mode), several at
// once: their answers go out in passes between the connections, as a
// lane's do, and each arrives whole and byte-equal.
func TestConnPerRequestLargeReads(t *testing.T) {
	const size, conns, each = 1 << 20, 8, 4
	var rounds atomic.Int64
	runRoundHook = func([]uint64) { rounds.Add(1) }
	t.Cleanup(func() { runRoundHook = nil })
	n := newNode(t, nil, "target", conns*size, Config{}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	mem := n.mem.Bytes()
	for i := range mem {
		mem[i] = byte(i*7 + i>>20)
	}
	errs := make(chan error, conns)
	for k := range conns {
		go func() {
			errs <- func() error {
				buf := make([]byte, statusLen+size)
				for range each {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						return err
					}
					_, err = c.Write(hdr(size, base+uint64(k*size), 0x80))
					if err == nil {
						_, err = io.ReadFull(c, buf)
					}
					c.Close()
					if err != nil {
						return err
					}
					if !bytes.Equal(buf[:statusLen], okStatus) {
						return fmt.Errorf("connection %d: status % x", k, buf[:statusLen])
					}
					if !bytes.Equal(buf[statusLen:], mem[k*size:(k+1)*size]) {
						return fmt.Errorf("connection %d: READ returned other bytes", k)
					}
				}
				return nil
			}()
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if rounds.Load() == 0 {
		t.Fatal("no run-list round: the answers were not written in passes")
	}
}
