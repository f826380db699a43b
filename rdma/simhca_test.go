//go:build amd64 || arm64

package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs"
)

// The rail on a simulated ConnectX (internal/mlx5sim): the real verbs
// (devVerbs, uverbs, the mlx5 provider's rings, doorbells, CQ guard and
// CQCleaner) over a simulated kernel and HCA, where the fake fabric of
// fakeverbs_test.go replaces all of them.

// newSimNode starts an engine named name with an rdma transport on one
// simulated ConnectX of f (device name+"_mlx5", found and opened the way
// a rail finds and opens a real one, through Config.Options) with
// provider p, and size bytes of registered memory.
func newSimNode(t testing.TB, st *enginetest.MemStore, name string, f *mlx5sim.Fabric, p uverbs.Provider, log *slog.Logger, size int) *fnode {
	t.Helper()
	dev := f.AddDevice(name + "_mlx5")
	tr := New(Config{Devices: []string{dev.Name}, Options: f.Options(p)})
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st, Retries: 3, Logger: log}, size, tr)
	return &fnode{Node: n, tr: tr}
}

// guardHook is mlx5's provider with two observation points on its CQs:
// arms that reach the driver are counted, and onClean runs inside
// uverbs' QP.Close with the CQ's single-owner guard held, before mlx5's
// own Clean.
type guardHook struct {
	uverbs.Provider
	arms    atomic.Int64
	mu      sync.Mutex
	onClean func()
}

func (h *guardHook) setClean(fn func()) {
	h.mu.Lock()
	h.onClean = fn
	h.mu.Unlock()
}

func (h *guardHook) NewContext(k uverbs.Kernel, out []byte) (uverbs.DriverContext, error) {
	c, err := h.Provider.NewContext(k, out)
	if err != nil {
		return nil, err
	}
	return hookContext{c, h}, nil
}

type hookContext struct {
	uverbs.DriverContext
	h *guardHook
}

func (c hookContext) NewCQ(cfg uverbs.DriverCQConfig) (uverbs.DriverCQ, error) {
	d, err := c.DriverContext.NewCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &hookCQ{d, c.h}, nil
}

func (c hookContext) NewQP(cfg uverbs.DriverQPConfig) (uverbs.DriverQP, error) {
	cfg.SendCQ = cfg.SendCQ.(*hookCQ).DriverCQ
	cfg.RecvCQ = cfg.RecvCQ.(*hookCQ).DriverCQ
	return c.DriverContext.NewQP(cfg)
}

type hookCQ struct {
	uverbs.DriverCQ
	h *guardHook
}

func (q *hookCQ) Arm(solicitedOnly bool) error {
	q.h.arms.Add(1)
	return q.DriverCQ.Arm(solicitedOnly)
}

func (q *hookCQ) Clean(qp uverbs.DriverQP) {
	q.h.mu.Lock()
	fn := q.h.onClean
	q.h.mu.Unlock()
	if fn != nil {
		fn()
	}
	q.DriverCQ.(uverbs.CQCleaner).Clean(qp)
}

// conflictLog counts logged errors that are uverbs.ErrConcurrent: the
// rail's Poll or Arm finding the CQ guard taken.
type conflictLog struct{ n atomic.Int64 }

func (h *conflictLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *conflictLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *conflictLog) WithGroup(string) slog.Handler            { return h }
func (h *conflictLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, uverbs.ErrConcurrent) {
			h.n.Add(1)
		}
		return true
	})
	return nil
}

// TestSimTransfer: WRITE and READ batches between two nodes, each a rail
// on a simulated ConnectX, move every byte through the real verbs path.
func TestSimTransfer(t *testing.T) {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	const blk, tasks = 64 << 10, 16
	tgt := newSimNode(t, st, "target", f, mlx5.Provider(), nil, blk*tasks)
	ini := newSimNode(t, st, "initiator", f, mlx5.Provider(), nil, blk*tasks)
	seg := openSeg(t, ini, "target")
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("WRITE: target memory differs")
	}
	rand.Read(tgt.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Read, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("READ: initiator memory differs")
	}
	if c := f.Counters("initiator_mlx5"); c.WQEs < 2*tasks || c.CQEs == 0 {
		t.Errorf("initiator's HCA: %+v", c)
	}
}

// TestSimNoLostWakeup is TestNoLostWakeup's script on simulated ConnectX
// devices, where the guard is the real one: uverbs' QP.Close takes the
// CQ's single-owner guard to let mlx5's CQCleaner drop the QP's
// completions, and a rail owner whose Poll and Arm find it taken went to
// sleep on an unarmed CQ.
//
// Node B has a WRITE to A in flight (held by the simulated HCA) and its
// owner asleep on the armed CQ. A closes its segment of B, so B's target
// session ends and B destroys the QPs it held for A. While the destroy
// holds the guard, the HCA completes B's WRITE and raises the event. B
// must still see the completion, and its rail must never find the guard
// taken.
func TestSimNoLostWakeup(t *testing.T) {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	const blk = 4096
	var conflicts conflictLog
	hook := &guardHook{Provider: mlx5.Provider()}
	a := newSimNode(t, st, "a", f, mlx5.Provider(), nil, blk)
	b := newSimNode(t, st, "b", f, hook, slog.New(&conflicts), blk)
	segB, segA := openSeg(t, a, "b"), openSeg(t, b, "a")

	// A's endpoint to B: B holds target QPs for it on its rail.
	if err := transfer(t, a.Engine, fakeRequests(engine.Write, a, b, segB, 1, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := b.tr.TargetQPs(); n == 0 {
		t.Fatal("B holds no QPs for A")
	}

	// B's WRITE to A, held in flight; B's owner arms and sleeps.
	f.SetPolicy(func(w mlx5sim.WQE) mlx5sim.Verdict {
		if w.Device == "b_mlx5" {
			return mlx5sim.Hold
		}
		return mlx5sim.Execute
	})
	rand.Read(b.Mem.Bytes())
	arms := hook.arms.Load()
	errc := make(chan error, 1)
	go func() { errc <- transfer(t, b.Engine, fakeRequests(engine.Write, b, a, segA, 1, blk), 3*time.Second) }()
	waitFor(t, "B's write held and B's CQ armed", func() bool { return f.Held() == 1 && hook.arms.Load() > arms })
	time.Sleep(5 * time.Millisecond) // the owner's poll after the arm, then its sleep

	// While a destroy on B's rail holds the guard, the HCA completes B's
	// write (an event: the CQ is armed), and the destroy waits until the
	// event was raised and a little longer: long enough for an owner that
	// is not the one destroying to be woken, be refused, and sleep again.
	var ran atomic.Bool
	var once sync.Once
	hook.setClean(func() {
		once.Do(func() {
			ran.Store(true)
			ev := f.Counters("b_mlx5").Events
			if n := f.Release(); n != 1 {
				t.Errorf("released %d work requests, want 1", n)
			}
			for deadline := time.Now().Add(300 * time.Millisecond); f.Counters("b_mlx5").Events == ev && time.Now().Before(deadline); {
				time.Sleep(100 * time.Microsecond)
			}
			time.Sleep(20 * time.Millisecond)
		})
	})
	if err := a.Engine.CloseSegment(segB); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to destroy the QPs it held for A", func() bool { return b.tr.TargetQPs() == 0 })
	if err := <-errc; err != nil {
		t.Fatalf("B's write (completed while a QP on B's rail was being destroyed): %v; CQ guard conflicts logged: %d", err, conflicts.n.Load())
	}
	if !ran.Load() {
		t.Fatal("no QP of B's rail was cleaned from its CQ under the guard")
	}
	if !bytes.Equal(a.Mem.Bytes(), b.Mem.Bytes()) {
		t.Fatal("A's memory differs from what B wrote")
	}
	if n := conflicts.n.Load(); n != 0 {
		t.Errorf("%d Poll or Arm calls of B's rail found the CQ guard taken: a QP was destroyed off the rail's owner", n)
	}
}
