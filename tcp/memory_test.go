package tcp

import (
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
)

// rss is this process's resident set size in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// TestStalledConnsMemoryReturned: 1024 connections that stall in the
// middle of a refused WRITE's payload (the target reads it into its
// buffer to discard it) make the target hold memory; once they are
// closed the target gives it back to the system, without waiting for a
// garbage collection that an idle server would not run for minutes.
func TestStalledConnsMemoryReturned(t *testing.T) {
	if raceEnabled {
		// The race detector's shadow memory follows the heap up and is
		// not given back: RSS says nothing about the buffers here.
		t.Skip("RSS under the race detector includes shadow memory that is never returned")
	}
	const conns = 1024
	n := newNode(t, nil, "victim", 1<<20, Config{IOTimeout: time.Minute, MaxConnsPerSource: 2 * conns})
	runtime.GC()
	debug.FreeOSMemory()
	before := rss(t)
	var mu sync.Mutex
	var cs []net.Conn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	work := make(chan struct{}, conns)
	for range conns {
		work <- struct{}{}
	}
	close(work)
	payload := make([]byte, 60<<10)
	var hb [headerLen]byte
	(&header{op: opWrite, id: 1, addr: 1 << 40, length: 1 << 20}).encode(hb[:]) // out of range: discarded
	msg := append(hb[:], payload...)
	for range 16 {
		wg.Go(func() {
			for range work {
				c, err := net.Dial("tcp", n.tr.Endpoint())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				cs = append(cs, c)
				mu.Unlock()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if err := dialHandshake(c, nil, auth.Party{Name: "staller", Epoch: 1}, auth.Party{Name: n.e.Name(), Epoch: n.e.Epoch()}); err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for n.tr.served() < conns {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections served, want %d", n.tr.served(), conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the payloads reach the target's buffers
	held := rss(t)
	for _, c := range cs {
		c.Close()
	}
	cs = nil
	for n.tr.served() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still served", n.tr.served())
		}
		time.Sleep(10 * time.Millisecond)
	}
	grown := held - before
	t.Logf("RSS: %d MB before, %d MB with %d stalled connections", before>>20, held>>20, conns)
	if grown < 16<<20 {
		t.Fatalf("the stalled connections cost only %d MB: the test does not hold what it means to", grown>>20)
	}
	// Without a collection of its own: the target must return it.
	deadline = time.Now().Add(5 * time.Second)
	for {
		after := rss(t)
		if after-before < grown/4 {
			t.Logf("RSS: %d MB after they closed", after>>20)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RSS %d MB 5 s after the connections closed (%d MB before, %d MB held)", after>>20, before>>20, held>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// served counts the accepted connections.
func (t *Transport) served() int { return t.gate.Len() }
