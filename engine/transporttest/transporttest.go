// Package transporttest is the conformance suite every engine.Transport
// must pass: two engines in one process, each with a fresh transport from
// the factory, moving data through the public engine API. Write a new
// transport's tests by calling Run first; the tcp transport passes it.
package transporttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// Factory returns a fresh, not yet installed transport.
type Factory func(t testing.TB) engine.Transport

type node struct {
	e   *engine.Engine
	mem *engine.Memory
}

func (n *node) base() uint64 { return engine.AddrOf(n.mem.Bytes()) }

func start(t testing.TB, st *enginetest.MemStore, name string, size int, f Factory) *node {
	t.Helper()
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, size, f(t))
	return &node{e: n.Engine, mem: n.Mem}
}

type pair struct {
	st       *enginetest.MemStore
	ini, tgt *node
	seg      engine.SegmentID
}

func newPair(t testing.TB, size int, f Factory) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &pair{st: st, tgt: start(t, st, "target", size, f), ini: start(t, st, "initiator", size, f)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if p.seg, err = p.ini.e.OpenSegment(ctx, "target", nil); err != nil {
		t.Fatal(err)
	}
	return p
}

// transfer submits reqs in a fresh batch and waits.
func (p *pair) transfer(ctx context.Context, reqs []engine.Request) error {
	b, err := p.ini.e.AllocateBatch(len(reqs))
	if err != nil {
		return err
	}
	defer p.ini.e.FreeBatch(b)
	if err := p.ini.e.Submit(b, reqs); err != nil {
		return err
	}
	return p.ini.e.Wait(ctx, b)
}

func random(t testing.TB, b []byte) {
	t.Helper()
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
}

// Run runs every conformance test against transports from f.
func Run(t *testing.T, f Factory) {
	t.Run("Integrity", func(t *testing.T) { testIntegrity(t, f) })
	t.Run("LargeBatch", func(t *testing.T) { testLargeBatch(t, f) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, f) })
	t.Run("TargetUnregistered", func(t *testing.T) { testTargetUnregistered(t, f) })
	t.Run("TargetClosed", func(t *testing.T) { testTargetClosed(t, f) })
	t.Run("TransportClose", func(t *testing.T) { testTransportClose(t, f) })
}

// testIntegrity writes random data of many sizes and reads it back.
func testIntegrity(t *testing.T, f Factory) {
	const max = 16 << 20
	p := newPair(t, 2*max+8192, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range []int{1, 3, 64, 4095, 4096, 4097, 65536, 1<<20 + 5, max} {
		off := uint64(n % 4093)
		src := p.ini.mem.Bytes()[:n]
		dst := p.ini.mem.Bytes()[max : max+n]
		random(t, src)
		clear(dst)
		if err := p.transfer(ctx, []engine.Request{{Op: engine.Write, Local: src, Target: p.seg, TargetAddr: p.tgt.base() + off}}); err != nil {
			t.Fatalf("WRITE %d: %v", n, err)
		}
		if !bytes.Equal(p.tgt.mem.Bytes()[off:off+uint64(n)], src) {
			t.Fatalf("WRITE %d: target differs", n)
		}
		if err := p.transfer(ctx, []engine.Request{{Op: engine.Read, Local: dst, Target: p.seg, TargetAddr: p.tgt.base() + off}}); err != nil {
			t.Fatalf("READ %d: %v", n, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("READ %d: data differs", n)
		}
	}
}

// testLargeBatch moves 1024 tasks of one batch, mixed READ and WRITE.
func testLargeBatch(t *testing.T, f Factory) {
	const tasks, blk = 1024, 2048
	p := newPair(t, 2*tasks*blk, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	random(t, p.ini.mem.Bytes())
	random(t, p.tgt.mem.Bytes())
	want := bytes.Clone(p.tgt.mem.Bytes()[:tasks*blk])
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		off := i * blk
		if i%2 == 0 {
			reqs[i] = engine.Request{Op: engine.Write, Local: p.ini.mem.Bytes()[off : off+blk], Target: p.seg, TargetAddr: p.tgt.base() + uint64(off)}
			copy(want[off:], p.ini.mem.Bytes()[off:off+blk])
		} else {
			reqs[i] = engine.Request{Op: engine.Read, Local: p.ini.mem.Bytes()[off : off+blk], Target: p.seg, TargetAddr: p.tgt.base() + uint64(off)}
		}
	}
	if err := p.transfer(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.tgt.mem.Bytes()[:tasks*blk], want) || !bytes.Equal(p.ini.mem.Bytes()[:tasks*blk], want) {
		t.Fatal("data differs")
	}
}

// testConcurrent runs submitters in parallel goroutines.
func testConcurrent(t *testing.T, f Factory) {
	const workers, rounds, blk = 8, 10, 64 << 10
	p := newPair(t, workers*blk, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			local := p.ini.mem.Bytes()[w*blk : (w+1)*blk]
			remote := p.tgt.base() + uint64(w*blk)
			for r := range rounds {
				random(t, local)
				want := bytes.Clone(local)
				if err := p.transfer(ctx, []engine.Request{{Op: engine.Write, Local: local, Target: p.seg, TargetAddr: remote}}); err != nil {
					errs <- err
					return
				}
				clear(local)
				if err := p.transfer(ctx, []engine.Request{{Op: engine.Read, Local: local, Target: p.seg, TargetAddr: remote}}); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(local, want) {
					errs <- fmt.Errorf("worker %d round %d: data differs", w, r)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testTargetUnregistered: the target unregisters its memory while the
// initiator still holds the old descriptor; the target side must refuse,
// and the task fails without writing anything.
func testTargetUnregistered(t *testing.T, f Factory) {
	const size = 1 << 20
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := start(t, st, "target", size, f)
	ini := start(t, st, "initiator", size, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg, err := ini.e.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	// A second region, then its removal: the initiator may not have seen
	// the removal yet when it submits.
	extra, err := engine.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := tgt.e.RegisterLocalMemory(extra.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	for {
		d, _ := ini.e.SegmentDescriptor(seg)
		if len(d.Buffers) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("initiator never saw the second region")
		}
		time.Sleep(time.Millisecond)
	}
	if err := tgt.e.UnregisterLocalMemory(extra.Bytes()); err != nil {
		t.Fatal(err)
	}
	random(t, extra.Bytes())
	want := bytes.Clone(extra.Bytes())
	random(t, ini.mem.Bytes())
	b, _ := ini.e.AllocateBatch(1)
	defer ini.e.FreeBatch(b)
	err = ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(extra.Bytes())}})
	if err == nil {
		err = ini.e.Wait(ctx, b)
		if err == nil {
			t.Fatal("WRITE into unregistered target memory succeeded")
		}
	}
	if !errors.Is(err, engine.ErrOutOfRange) && !errors.Is(err, engine.ErrPeerReset) {
		t.Logf("refused with %v", err)
	}
	if !bytes.Equal(extra.Bytes(), want) {
		t.Fatal("unregistered target memory was written")
	}
}

// testTargetClosed closes the target engine while a large batch is in
// flight: Wait returns in bounded time and every task has finished.
func testTargetClosed(t *testing.T, f Factory) {
	const tasks, blk = 512, 256 << 10
	p := newPair(t, tasks*blk, f)
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: p.ini.mem.Bytes()[i*blk : (i+1)*blk], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*blk)}
	}
	b, _ := p.ini.e.AllocateBatch(tasks)
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	p.tgt.e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := p.ini.e.Wait(ctx, b)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("Wait hung after the target closed")
	}
	for i := range tasks {
		st, _ := p.ini.e.Status(b, i)
		if st.State != engine.StateCompleted && st.State != engine.StateFailed {
			t.Fatalf("task %d: %v", i, st.State)
		}
		if st.State == engine.StateFailed && st.Err == nil {
			t.Fatalf("task %d failed without an error", i)
		}
	}
	if err := p.ini.e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}

// testTransportClose: closing the initiator engine (and so its transport)
// fails what is in flight; Close is idempotent.
func testTransportClose(t *testing.T, f Factory) {
	p := newPair(t, 16<<20, f)
	reqs := make([]engine.Request, 16)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: p.ini.mem.Bytes()[i<<20 : (i+1)<<20], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i<<20)}
	}
	b, _ := p.ini.e.AllocateBatch(len(reqs))
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.ini.e.Wait(ctx, b)
	if bs, _ := p.ini.e.BatchStatus(b); bs.State == engine.StatePending {
		t.Fatal("tasks still pending after Close")
	}
	if err := p.ini.e.Submit(b, reqs[:1]); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
}
