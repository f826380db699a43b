package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

// TestStaleBatchIDWhileReused: a freed batch's ID is refused by every
// call even while other goroutines allocate and free batches (reusing the
// freed batch's memory and slot). Run with -race: looking an ID up must
// not read batch state that a concurrent AllocateBatch writes.
func TestStaleBatchIDWhileReused(t *testing.T) {
	n := newNode(t, nil, "stale", 1<<16, tcp.Config{})
	stale, err := n.e.AllocateBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.e.FreeBatch(stale); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b, err := n.e.AllocateBatch(4)
			if err != nil {
				t.Error(err)
				return
			}
			if err := n.e.FreeBatch(b); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	ctx := context.Background()
	for range 2000 {
		if _, err := n.e.Status(stale, 0); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("Status of a stale ID: %v", err)
		}
		if _, err := n.e.BatchStatus(stale); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("BatchStatus of a stale ID: %v", err)
		}
		if err := n.e.Wait(ctx, stale); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("Wait on a stale ID: %v", err)
		}
		if err := n.e.FreeBatch(stale); !errors.Is(err, engine.ErrInvalidBatch) {
			t.Fatalf("FreeBatch of a stale ID: %v", err)
		}
	}
	close(stop)
	wg.Wait()
}

// counted is a tcp transport that counts the peers it has open.
type counted struct {
	driver.Transport
	live *atomic.Int64
}

type countedPeer struct {
	driver.Peer
	live *atomic.Int64
	once sync.Once
}

func (p *countedPeer) Close() error {
	p.once.Do(func() { p.live.Add(-1) })
	return p.Peer.Close()
}

func (c counted) Connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	p, err := c.Transport.Connect(ctx, remote)
	if err != nil {
		return nil, err
	}
	c.live.Add(1)
	return &countedPeer{Peer: p, live: c.live}, nil
}

func (c counted) Driver() driver.Transport { return c }

func (c counted) Submit(ss []*driver.Slice) {
	for _, s := range ss {
		s.Peer = s.Peer.(*countedPeer).Peer
	}
	c.Transport.Submit(ss)
}

// TestCloseSegmentRacesSubmit: CloseSegment while another goroutine
// submits to the segment either refuses (busy) or wins; once it has won,
// the segment holds no connection — a racing Submit must not connect
// again behind its back — and later submissions fail with
// ErrSegmentNotFound.
func TestCloseSegmentRacesSubmit(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := newNode(t, st, "tgt", 1<<16, tcp.Config{})
	_ = tgt
	e, err := engine.New(engine.Config{Name: "ini", Store: st, MetadataTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	live := new(atomic.Int64)
	mem, err := engine.Alloc(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(); mem.Close() })
	if err := e.Install(counted{Transport: tcp.New(tcp.Config{Lanes: 1}).Driver(), live: live}); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	for round := range 30 {
		seg, err := e.OpenSegment(ctx, "tgt", nil)
		if err != nil {
			t.Fatal(err)
		}
		// Drop the eager connection, so the submitter connects lazily.
		if err := e.Uninstall("tcp"); err != nil {
			t.Fatal(err)
		}
		if err := e.Install(counted{Transport: tcp.New(tcp.Config{Lanes: 1}).Driver(), live: live}); err != nil {
			t.Fatal(err)
		}
		req := []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:4096], Target: seg, TargetAddr: tgt.base()}}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := e.Transfer(ctx, req)
				if errors.Is(err, engine.ErrSegmentNotFound) {
					return
				}
				if err != nil && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrPeerReset) {
					t.Errorf("round %d: transfer: %v", round, err)
					return
				}
			}
		}()
		for {
			err := e.CloseSegment(seg)
			if err == nil {
				break
			}
			if !errors.Is(err, engine.ErrSegmentBusy) {
				t.Fatal(err)
			}
		}
		wg.Wait()
		if n := live.Load(); n != 0 {
			t.Fatalf("round %d: %d peers still open after CloseSegment", round, n)
		}
	}
}

// TestUninstallRacesSubmit: Uninstall while another goroutine submits
// over that transport either refuses (busy) or wins; a submission racing
// it fails cleanly or completes, and never reads the per-region keys
// Uninstall clears (run with -race).
func TestUninstallRacesSubmit(t *testing.T) {
	p := newPair(t, 1<<16, 1<<16, tcp.Config{Lanes: 1})
	ctx := ctxT(t, 2*time.Minute)
	req := []engine.Request{{Op: engine.Write, Local: p.ini.buf()[:4096], Target: p.seg, TargetAddr: p.tgt.base()}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			err := p.ini.e.Transfer(ctx, req)
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, engine.ErrNoTransport), errors.Is(err, engine.ErrClosed), errors.Is(err, engine.ErrPeerReset):
			default:
				t.Errorf("transfer: %v", err)
				return
			}
		}
	}()
	for range 200 {
		for {
			err := p.ini.e.Uninstall("tcp")
			if err == nil {
				break
			}
			if !errors.Is(err, engine.ErrTransportBusy) {
				t.Fatal(err)
			}
		}
		if err := p.ini.e.Install(tcp.New(tcp.Config{Lanes: 1})); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := p.ini.e.Transfer(ctx, req); err != nil {
		t.Fatalf("after the churn: %v", err)
	}
	t.Logf("%d transfers completed during the churn", ok.Load())
}

// keyed is a tcp transport whose memory registrations return a key, and
// which refuses slices that arrive without one (as an RDMA transport
// could not send them).
type keyed struct{ driver.Transport }

func (k keyed) Driver() driver.Transport { return k }

func (k keyed) RegisterMemory(r driver.Region) (any, error) { return r.Addr(), nil }

func (k keyed) Submit(ss []*driver.Slice) {
	for _, s := range ss {
		if s.LocalKey != r2key(s.LocalRegion) {
			s.Done(0, fmt.Errorf("slice without its registration key: %v", s.LocalKey))
			continue
		}
		k.Transport.Submit([]*driver.Slice{s})
	}
}

func r2key(r driver.Region) any { return r.Addr() }

// TestRefusedUninstallDisturbsNothing: Uninstall refused for a task in
// flight, again and again, while other requests are submitted and memory
// is registered: no submission fails for it, and every registration gets
// the key of the transport that stays installed.
func TestRefusedUninstallDisturbsNothing(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	hole, stop := blackhole(t, st, "hole")
	defer stop()
	tgt := newNode(t, st, "tgt", 1<<16, tcp.Config{})
	n := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, keyed{tcp.New(tcp.Config{IOTimeout: time.Minute}).Driver()})
	ctx := ctxT(t, 2*time.Minute)
	holeSeg, err := n.Engine.OpenSegment(ctx, "hole", nil)
	if err != nil {
		t.Fatal(err)
	}
	tgtSeg, err := n.Engine.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A task that stays in flight keeps the transport busy.
	b, _ := n.Engine.AllocateBatch(1)
	if err := n.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: n.Mem.Bytes()[:64], Target: holeSeg, TargetAddr: hole.Addr}}); err != nil {
		t.Fatal(err)
	}
	mem, err := engine.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	stopUninstall := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stopUninstall:
				return
			default:
			}
			if err := n.Engine.Uninstall("tcp"); !errors.Is(err, engine.ErrTransportBusy) {
				t.Errorf("uninstall with a task in flight: %v", err)
				return
			}
			runtime.Gosched() // let the transfers' goroutines run on one CPU
		}
	})
	for i := range 300 {
		if err := n.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
			t.Fatal(err)
		}
		if err := n.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: mem.Bytes(), Target: tgtSeg, TargetAddr: tgt.base()}}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := n.Engine.UnregisterLocalMemory(mem.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	close(stopUninstall)
	wg.Wait()
	n.Engine.Close() // fails the task in flight
	if err := n.Engine.Wait(ctx, b); err == nil {
		t.Fatal("the blackholed task completed")
	}
}
