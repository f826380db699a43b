package tcp

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// laneReader returns the reader of the initiator's only lane to its only
// peer, and its mode.
func laneReader(t *testing.T, tr *Transport) (*reader, rmode) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for p := range tr.peers {
		l := p.lanes[0]
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.rd == nil {
			t.Fatal("lane has no reader")
		}
		return l.rd, l.rd.mode
	}
	t.Fatal("no peer")
	return nil, 0
}

// waitMode waits a little until the lane's reader is in mode want (the
// lane's goroutine reaches it after the reply that completed a batch).
func waitMode(t *testing.T, tr *Transport, want rmode) bool {
	t.Helper()
	deadline := time.Now().Add(100 * time.Millisecond)
	for {
		if _, mode := laneReader(t, tr); mode == want {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWaiterReads: a caller of Wait reads its lane's replies itself (the
// lane's goroutine parked idle between batches), READ data arrives intact
// that way; a caller that polls BatchStatus instead still completes (the
// goroutine takes the reply once no waiter claims it) and the lanes stop
// going idle until a waiter helps again.
func TestWaiterReads(t *testing.T) {
	const n, size = 64, 4096
	p := newPair(t, n*size, n*size, Config{Lanes: 1})
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Read, Local: p.ini.buf()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*size)}
	}
	// Until a waiter has read a batch: the lane's goroutine goes idle
	// after the first, unless a waiter came too late for its claim.
	for round := 0; round < 20 || !waitMode(t, p.ini.tr, rIdle); round++ {
		if round == 200 {
			t.Fatal("the lane's reader never went idle")
		}
		fill(t, p.tgt.buf())
		clear(p.ini.buf())
		if err := p.ini.e.Transfer(ctxT(t, 10*time.Second), reqs); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !bytes.Equal(p.ini.buf(), p.tgt.buf()) {
			t.Fatalf("round %d: READ data differs", round)
		}
	}
	if !p.ini.tr.wanted.Load() {
		t.Fatal("after waited batches: not wanted")
	}

	// Polling: nobody helps; the claim expires to the goroutine.
	for round := range 3 {
		fill(t, p.tgt.buf())
		b, err := p.ini.e.AllocateBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.ini.e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := p.ini.e.BatchStatus(b)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != engine.StatePending {
				if st.State != engine.StateCompleted {
					t.Fatalf("round %d: %+v", round, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: polled batch still pending", round)
			}
			time.Sleep(50 * time.Microsecond)
		}
		p.ini.e.FreeBatch(b)
		if !bytes.Equal(p.ini.buf(), p.tgt.buf()) {
			t.Fatalf("polled round %d: READ data differs", round)
		}
	}
	if _, mode := laneReader(t, p.ini.tr); mode != rGoroutine || p.ini.tr.wanted.Load() {
		t.Fatalf("after polled batches: reader mode %d, wanted %v; want the goroutine's (%d), false", mode, p.ini.tr.wanted.Load(), rGoroutine)
	}
	// A waiter again: the lane goes idle once more.
	transferUntilIdle(t, p.ini.e, p.ini.tr, reqs)
}

// transferUntilIdle transfers reqs until the lane's reader is idle after
// one (a claim expires when its waiter comes late on a busy machine).
func transferUntilIdle(t *testing.T, e *engine.Engine, tr *Transport, reqs []engine.Request) {
	t.Helper()
	for round := 0; ; round++ {
		if round == 200 {
			t.Fatal("the lane's reader never went idle")
		}
		if err := e.Transfer(ctxT(t, 10*time.Second), reqs); err != nil {
			t.Fatal(err)
		}
		if round >= 2 && waitMode(t, tr, rIdle) {
			return
		}
	}
}

// submitHeld makes the stall target hold its replies and submits reqs in
// a batch of their own, whose ID it returns.
func submitHeld(t *testing.T, e *engine.Engine, reqs []engine.Request, hold *atomic.Bool) engine.BatchID {
	t.Helper()
	hold.Store(true)
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	return b
}

// stallTarget is a fake target that answers a WRITE at once while
// hold is false, else only once release is closed.
func stallTarget(t *testing.T, st *enginetest.MemStore, name string, hold *atomic.Bool, release chan struct{}) uint64 {
	buf := fakeTarget(t, st, name, func(h header) []byte {
		if hold.Load() {
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
		}
		return frame(header{op: opWrite | opReply, id: h.id}, nil)
	})
	return buf.Addr
}

// TestWaiterContext: a waiter reading its lane while the target holds
// the reply sees its ctx end (Wait returns the ctx's error promptly);
// the reply that comes later completes the batch through the lane's
// goroutine, and a later waiter reads again.
func TestWaiterContext(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	// Ticks long enough that the waiter below finds its lane however
	// late it comes, short enough to see its ctx end soon.
	defer func(d time.Duration) { readerTick = d }(readerTick)
	readerTick = 200 * time.Millisecond
	var hold atomic.Bool
	release := make(chan struct{})
	addr := stallTarget(t, st, "stall", &hold, release)
	tr := New(Config{Lanes: 1, IOTimeout: time.Minute})
	n := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 4096, tr)
	e := n.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "stall", nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []engine.Request{{Op: engine.Write, Local: n.Mem.Bytes(), Target: seg, TargetAddr: addr}}
	transferUntilIdle(t, e, tr, reqs)

	b := submitHeld(t, e, reqs, &hold)
	ctx, cancel := context.WithCancel(context.Background())
	// Cancelled once the waiter reads the lane (or after 5 s, when the
	// test fails below): the ctx must end a waiter's read, not only the
	// engine's wait for the lane's goroutine.
	var read atomic.Bool
	cancelled := make(chan time.Time, 1)
	go func() {
		defer cancel()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			tr.mu.Lock()
			for p := range tr.peers {
				l := p.lanes[0]
				l.mu.Lock()
				if l.rd != nil && l.rd.mode == rWaiter {
					read.Store(true)
				}
				l.mu.Unlock()
			}
			tr.mu.Unlock()
			if read.Load() {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancelled <- time.Now()
	}()
	err = e.Wait(ctx, b)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("wait: %v, want context.Canceled", err)
	}
	if !read.Load() {
		t.Fatal("the waiter never read its lane")
	}
	// Two ticks after the cancel at most, and the scheduler's slack.
	if d := time.Since(<-cancelled); d > 2*time.Second {
		t.Fatalf("wait returned %v after its ctx was cancelled", d)
	}
	hold.Store(false)
	close(release)
	if err := e.Wait(ctxT(t, 10*time.Second), b); err != nil {
		t.Fatal(err)
	}
	e.FreeBatch(b)
	transferUntilIdle(t, e, tr, reqs)
}

// TestWaiterClose: the engine's Close, while a waiter whose ctx cannot
// end reads a lane the target does not answer, fails the waiter's batch
// and returns (the lane's goroutine outlives the waiter's reading; the
// leak check of TestMain finds nothing left).
func TestWaiterClose(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	defer func(d time.Duration) { readerTick = d }(readerTick)
	readerTick = time.Minute // the waiter below finds its lane however late
	var hold atomic.Bool
	release := make(chan struct{})
	defer close(release)
	addr := stallTarget(t, st, "stall", &hold, release)
	tr := New(Config{Lanes: 1, IOTimeout: time.Minute})
	e, err := engine.New(engine.Config{Name: "ini", Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Install(tr); err != nil {
		t.Fatal(err)
	}
	mem, err := engine.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if err := e.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "stall", nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []engine.Request{{Op: engine.Write, Local: mem.Bytes(), Target: seg, TargetAddr: addr}}
	transferUntilIdle(t, e, tr, reqs)
	b := submitHeld(t, e, reqs, &hold)
	waited := make(chan error, 1)
	go func() { waited <- e.Wait(context.Background(), b) }()
	// Until the waiter has taken the lane.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, mode := laneReader(t, tr); mode == rWaiter {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no waiter took the lane")
		}
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	select {
	case err := <-waited:
		if !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrPeerReset) {
			t.Fatalf("wait: %v, want the engine's close", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait still blocked after Close")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close blocked")
	}
}
