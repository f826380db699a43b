// Package transporttest is the conformance suite every engine.Transport
// must pass: an initiator engine and a target engine, each with a fresh
// transport from the factory, moving data through the public engine API.
// The target runs in the same process (Run) or in a child process
// (RunWith and Options.Remote). Write a new transport's tests by calling
// Run first; the tcp and shm transports pass it.
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

type pair struct {
	ini *enginetest.Node
	tgt Target
	seg engine.SegmentID
}

func (p *pair) local() []byte { return p.ini.Mem.Bytes() }

// newPair starts a target with a buffer of size bytes and an initiator
// with one of the same size, and opens the target.
func newPair(t testing.TB, o Options, size int, f Factory) *pair {
	t.Helper()
	p := &pair{}
	if o.Remote {
		p.tgt = StartRemoteTarget(t, o, size, "127.0.0.1:0")
		p.ini = Initiator(t, o, nil, size, f)
	} else {
		st := enginetest.NewMemStore()
		t.Cleanup(func() { st.Close() })
		p.tgt = newLocalTarget(t, o, engine.Config{Name: "target", Store: st}, size, f(t))
		p.ini = Initiator(t, o, st, size, f)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if p.seg, err = p.ini.Engine.OpenSegment(ctx, p.tgt.Name(), nil); err != nil {
		t.Fatal(err)
	}
	return p
}

// transfer submits reqs in a fresh batch and waits.
func (p *pair) transfer(ctx context.Context, reqs []engine.Request) error {
	e := p.ini.Engine
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		return err
	}
	defer e.FreeBatch(b)
	if err := e.Submit(b, reqs); err != nil {
		return err
	}
	return e.Wait(ctx, b)
}

func random(t testing.TB, b []byte) {
	t.Helper()
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
}

// check fails the test on err and returns b (a read of target memory).
func check(t testing.TB) func([]byte, error) []byte {
	return func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// Run runs every conformance test against transports from f, with the
// target in this process.
func Run(t *testing.T, f Factory) { RunWith(t, f, Options{}) }

// RunWith runs every conformance test with options.
func RunWith(t *testing.T, f Factory, o Options) {
	t.Run("Integrity", func(t *testing.T) { testIntegrity(t, f, o) })
	t.Run("LargeBatch", func(t *testing.T) { testLargeBatch(t, f, o) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, f, o) })
	t.Run("TargetUnregistered", func(t *testing.T) { testTargetUnregistered(t, f, o) })
	t.Run("TargetClosed", func(t *testing.T) { testTargetClosed(t, f, o) })
	t.Run("TransportClose", func(t *testing.T) { testTransportClose(t, f, o) })
}

// testIntegrity writes random data of sizes from 1 byte to 64 MiB and
// reads it back.
func testIntegrity(t *testing.T, f Factory, o Options) {
	const max = 64 << 20
	p := newPair(t, o, 2*max+8192, f)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, n := range []int{1, 3, 64, 4095, 4096, 4097, 65536, 1<<20 + 5, 16 << 20, max} {
		off := n % 4093
		src := p.local()[:n]
		dst := p.local()[max : max+n]
		random(t, src)
		clear(dst)
		if err := p.transfer(ctx, []engine.Request{{Op: engine.Write, Local: src, Target: p.seg, TargetAddr: p.tgt.Base() + uint64(off)}}); err != nil {
			t.Fatalf("WRITE %d: %v", n, err)
		}
		if got := check(t)(p.tgt.Read(off, n)); !bytes.Equal(got, src) {
			t.Fatalf("WRITE %d: target differs", n)
		}
		if err := p.transfer(ctx, []engine.Request{{Op: engine.Read, Local: dst, Target: p.seg, TargetAddr: p.tgt.Base() + uint64(off)}}); err != nil {
			t.Fatalf("READ %d: %v", n, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("READ %d: data differs", n)
		}
	}
}

// testLargeBatch moves 4096 tasks of one batch, mixed READ and WRITE.
func testLargeBatch(t *testing.T, f Factory, o Options) {
	const tasks, blk = 4096, 2048
	p := newPair(t, o, 2*tasks*blk, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	random(t, p.local())
	tmem := make([]byte, tasks*blk)
	random(t, tmem)
	if err := p.tgt.Write(0, tmem); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(tmem)
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		off := i * blk
		if i%2 == 0 {
			reqs[i] = engine.Request{Op: engine.Write, Local: p.local()[off : off+blk], Target: p.seg, TargetAddr: p.tgt.Base() + uint64(off)}
			copy(want[off:], p.local()[off:off+blk])
		} else {
			reqs[i] = engine.Request{Op: engine.Read, Local: p.local()[off : off+blk], Target: p.seg, TargetAddr: p.tgt.Base() + uint64(off)}
		}
	}
	if err := p.transfer(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if got := check(t)(p.tgt.Read(0, tasks*blk)); !bytes.Equal(got, want) || !bytes.Equal(p.local()[:tasks*blk], want) {
		t.Fatal("data differs")
	}
}

// testConcurrent runs submitters in parallel goroutines.
func testConcurrent(t *testing.T, f Factory, o Options) {
	const workers, rounds, blk = 8, 10, 64 << 10
	p := newPair(t, o, workers*blk, f)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			local := p.local()[w*blk : (w+1)*blk]
			remote := p.tgt.Base() + uint64(w*blk)
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

// testTargetUnregistered: the target unregisters a buffer the initiator
// has used (and may still hold in its descriptor); the initiator's next
// WRITE to it fails and writes nothing.
func testTargetUnregistered(t *testing.T, f Factory, o Options) {
	const size = 1 << 20
	p := newPair(t, o, size, f)
	e := p.ini.Engine
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	extra, err := p.tgt.RegisterExtra(size)
	if err != nil {
		t.Fatal(err)
	}
	for {
		d, _ := e.SegmentDescriptor(p.seg)
		if len(d.Buffers) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("initiator never saw the second region")
		}
		time.Sleep(time.Millisecond)
	}
	// Use it once, so that a transport that sets up per-buffer state
	// (a mapping, a key cache) has it when the buffer goes.
	random(t, p.local())
	if err := p.transfer(ctx, []engine.Request{{Op: engine.Write, Local: p.local()[:4096], Target: p.seg, TargetAddr: extra}}); err != nil {
		t.Fatal(err)
	}
	if got := check(t)(p.tgt.ReadExtra(4096)); !bytes.Equal(got, p.local()[:4096]) {
		t.Fatal("WRITE into the second region: target differs")
	}
	if err := p.tgt.UnregisterExtra(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	random(t, want)
	if err := p.tgt.WriteExtra(want); err != nil {
		t.Fatal(err)
	}
	random(t, p.local())
	err = p.transfer(ctx, []engine.Request{{Op: engine.Write, Local: p.local()[:4096], Target: p.seg, TargetAddr: extra}})
	if err == nil {
		t.Fatal("WRITE into unregistered target memory succeeded")
	}
	if !errors.Is(err, engine.ErrOutOfRange) && !errors.Is(err, engine.ErrPeerReset) && !errors.Is(err, engine.ErrNoTransport) {
		t.Logf("refused with %v", err)
	}
	if got := check(t)(p.tgt.ReadExtra(size)); !bytes.Equal(got, want) {
		t.Fatal("unregistered target memory was written")
	}
}

// testTargetClosed closes the target engine while a large batch is in
// flight: Wait returns in bounded time and every task has finished.
func testTargetClosed(t *testing.T, f Factory, o Options) {
	const tasks, blk = 512, 256 << 10
	p := newPair(t, o, tasks*blk, f)
	e := p.ini.Engine
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: p.local()[i*blk : (i+1)*blk], Target: p.seg, TargetAddr: p.tgt.Base() + uint64(i*blk)}
	}
	b, _ := e.AllocateBatch(tasks)
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.tgt.CloseEngine(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := e.Wait(ctx, b)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("Wait hung after the target closed")
	}
	for i := range tasks {
		st, _ := e.Status(b, i)
		if st.State != engine.StateCompleted && st.State != engine.StateFailed {
			t.Fatalf("task %d: %v", i, st.State)
		}
		if st.State == engine.StateFailed && st.Err == nil {
			t.Fatalf("task %d failed without an error", i)
		}
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}

// testTransportClose: closing the initiator engine (and so its transport)
// fails what is in flight; Close is idempotent.
func testTransportClose(t *testing.T, f Factory, o Options) {
	p := newPair(t, o, 16<<20, f)
	e := p.ini.Engine
	reqs := make([]engine.Request, 16)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: p.local()[i<<20 : (i+1)<<20], Target: p.seg, TargetAddr: p.tgt.Base() + uint64(i<<20)}
	}
	b, _ := e.AllocateBatch(len(reqs))
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.Wait(ctx, b)
	if bs, _ := e.BatchStatus(b); bs.State == engine.StatePending {
		t.Fatal("tasks still pending after Close")
	}
	if err := e.Submit(b, reqs[:1]); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("submit after close: %v", err)
	}
}
