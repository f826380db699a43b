package transporttest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmago/te/engine"
)

// testIntegrity writes and reads single transfers of 1 B to MaxSize at
// unaligned offsets on both sides; the target checks what each WRITE
// left, the initiator what each READ brought.
func testIntegrity(t *testing.T, s *suite) {
	max := s.o.MaxSize
	v := s.newEnv(t, max+8192, max+8192)
	ctx := ctxFor(t, s.o.Timeout)
	base := v.tgt.Info().Addr
	sizes := []int{1, 3, 64, 4095, 4096, 4097, 65536, 1<<20 + 5}
	for n := 4 << 20; n < max; n *= 4 {
		sizes = append(sizes, n+3)
	}
	for _, n := range append(sizes, max) {
		if n > max {
			continue
		}
		off, loff := uint64(n%4093), n%511
		addr := base + off
		seed := rand.Uint64()
		// A guard pattern around the range shows writes beyond it.
		guard := min(off+uint64(n)+4096, uint64(max+8192))
		if err := v.tgt.Fill(base, int(guard), seed+2, 0); err != nil {
			t.Fatal(err)
		}
		src := v.buf[loff : loff+n]
		Pattern(src, seed, 0)
		if err := v.transfer(ctx, []engine.Request{v.write(src, addr)}); err != nil {
			t.Fatalf("WRITE %d B: %v", n, err)
		}
		if err := v.tgt.Check(addr, n, seed, 0); err != nil {
			t.Fatalf("WRITE %d B: target: %v", n, err)
		}
		if err := v.tgt.Check(base, int(off), seed+2, 0); err != nil {
			t.Fatalf("WRITE %d B: before the range: %v", n, err)
		}
		if err := v.tgt.Check(addr+uint64(n), int(guard-off)-n, seed+2, off+uint64(n)); err != nil {
			t.Fatalf("WRITE %d B: after the range: %v", n, err)
		}
		if err := v.tgt.Fill(addr, n, seed+1, 0); err != nil {
			t.Fatal(err)
		}
		dst := v.buf[max+8192-n-loff : max+8192-loff]
		clear(dst)
		if err := v.transfer(ctx, []engine.Request{v.read(dst, addr)}); err != nil {
			t.Fatalf("READ %d B: %v", n, err)
		}
		if err := CheckPattern(dst, seed+1, 0); err != nil {
			t.Fatalf("READ %d B: %v", n, err)
		}
	}
}

// testLargeBatch moves one batch of 4096 tasks of 1 B to 4 KiB, WRITE and
// READ interleaved, and checks both buffers whole.
func testLargeBatch(t *testing.T, s *suite) {
	const tasks, slot = 4096, 4096
	const size = tasks * slot
	v := s.newEnv(t, size, size)
	ctx := ctxFor(t, s.o.Timeout)
	base := v.tgt.Info().Addr
	seedI, seedT := rand.Uint64(), rand.Uint64()
	Pattern(v.buf, seedI, 0)
	if err := v.tgt.Fill(base, size, seedT, 0); err != nil {
		t.Fatal(err)
	}
	// Expected images: each side's own pattern, with the other's bytes
	// where a task moved them.
	wantI, wantT := make([]byte, size), make([]byte, size)
	Pattern(wantI, seedI, 0)
	Pattern(wantT, seedT, 0)
	reqs := make([]engine.Request, tasks)
	sizes := make([]int, tasks)
	for i := range reqs {
		off := i * slot
		n := 1 + (i*2654435761)%slot
		sizes[i] = n
		if i%2 == 0 {
			reqs[i] = v.write(v.buf[off:off+n], base+uint64(off))
			copy(wantT[off:off+n], wantI[off:off+n])
		} else {
			reqs[i] = v.read(v.buf[off:off+n], base+uint64(off))
			copy(wantI[off:off+n], wantT[off:off+n])
		}
	}
	if err := v.transfer(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v.buf, wantI) {
		for i := range reqs {
			off := i * slot
			if !bytes.Equal(v.buf[off:off+slot], wantI[off:off+slot]) {
				t.Fatalf("initiator buffer differs at task %d (%v, %d B)", i, reqs[i].Op, sizes[i])
			}
		}
	}
	h, err := v.tgt.Hash(base, size)
	if err != nil {
		t.Fatal(err)
	}
	if h != sha256.Sum256(wantT) {
		for i := 0; i < tasks; i += 2 {
			off := i * slot
			if err := v.tgt.Check(base+uint64(off), sizes[i], seedI, uint64(off)); err != nil {
				t.Fatalf("task %d (WRITE %d B): target: %v", i, sizes[i], err)
			}
		}
		t.Fatal("target buffer differs outside the written ranges")
	}
}

// testConcurrent runs 16 submitters at once, each with batches that write
// one part of its own region and read another.
func testConcurrent(t *testing.T, s *suite) {
	const workers, rounds, half = 16, 6, 64 << 10
	const region = 2 * half
	v := s.newEnv(t, workers*region, workers*region)
	ctx := ctxFor(t, s.o.Timeout)
	base := v.tgt.Info().Addr
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			local := v.buf[w*region : (w+1)*region]
			remote := base + uint64(w*region)
			for r := range rounds {
				sw, sr := rand.Uint64(), rand.Uint64()
				Pattern(local[:half], sw, 0)
				clear(local[half:])
				if err := v.tgt.Fill(remote+half, half, sr, 0); err != nil {
					errs <- err
					return
				}
				q := half / 2
				err := v.transfer(ctx, []engine.Request{
					v.write(local[:q], remote), v.read(local[half:half+q], remote+half),
					v.write(local[q:half], remote+uint64(q)), v.read(local[half+q:], remote+half+uint64(q)),
				})
				if err == nil {
					err = v.tgt.Check(remote, half, sw, 0)
				}
				if err == nil {
					err = CheckPattern(local[half:], sr, 0)
				}
				if err != nil {
					errs <- fmt.Errorf("submitter %d round %d: %w", w, r, err)
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

// testBadRequests: ranges outside the target's buffer, local memory that
// is not registered, zero lengths and unknown segments are refused with
// their errors, and nothing is written.
func testBadRequests(t *testing.T, s *suite) {
	const size = 1 << 20
	v := s.newEnv(t, size, size)
	ctx := ctxFor(t, s.o.Timeout)
	info := v.tgt.Info()
	seed := rand.Uint64()
	if err := v.tgt.Fill(info.Addr, info.Size, seed, 0); err != nil {
		t.Fatal(err)
	}
	unreg, err := engine.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer unreg.Close()
	end := info.Addr + uint64(info.Size)
	for _, c := range []struct {
		name string
		req  engine.Request
		want error
	}{
		{"WRITE across the end", v.write(v.buf[:8192], end-4096), engine.ErrOutOfRange},
		{"READ across the end", v.read(v.buf[:8192], end-1), engine.ErrOutOfRange},
		{"WRITE past the end", v.write(v.buf[:1], end), engine.ErrOutOfRange},
		{"WRITE before the start", v.write(v.buf[:4096], info.Addr-4096), engine.ErrOutOfRange},
		{"WRITE wrapping the address space", v.write(v.buf[:4096], ^uint64(0)-100), engine.ErrInvalidRequest},
		{"WRITE from unregistered memory", v.write(unreg.Bytes(), info.Addr), engine.ErrNotRegistered},
		{"READ into unregistered memory", v.read(unreg.Bytes(), info.Addr), engine.ErrNotRegistered},
		{"READ into Go heap", v.read(make([]byte, 64), info.Addr), engine.ErrNotRegistered},
		{"zero length", v.write(v.buf[:0], info.Addr), engine.ErrInvalidRequest},
		{"unknown segment", engine.Request{Op: engine.Write, Local: v.buf[:64], Target: v.seg + 1000, TargetAddr: info.Addr}, engine.ErrSegmentNotFound},
	} {
		err := v.transfer(ctx, []engine.Request{c.req})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := v.tgt.Check(info.Addr, info.Size, seed, 0); err != nil {
		t.Fatalf("target written by refused requests: %v", err)
	}
	// A bad request fails its batch whole: the good request next to it
	// does not run either.
	Pattern(v.buf[:4096], seed+1, 0)
	err = v.transfer(ctx, []engine.Request{v.write(v.buf[:4096], info.Addr), v.write(v.buf[:8192], end-4096)})
	if !errors.Is(err, engine.ErrOutOfRange) {
		t.Fatalf("batch with one bad request: %v", err)
	}
	if err := v.tgt.Check(info.Addr, info.Size, seed, 0); err != nil {
		t.Fatalf("a batch refused at Submit wrote: %v", err)
	}
	// The connection still works.
	if err := v.roundTrip(ctx, info.Addr, 4096, seed+2); err != nil {
		t.Fatal(err)
	}
}

// testTargetUnregistered: the target unregisters a region while the
// initiator still holds a descriptor with it; the task fails and nothing
// is written.
func testTargetUnregistered(t *testing.T, s *suite) {
	const size = 1 << 20
	v := s.newEnv(t, size, size)
	ctx := ctxFor(t, s.o.Timeout)
	extra, err := v.tgt.Register(size)
	if err != nil {
		t.Fatal(err)
	}
	for {
		d, err := v.e.SegmentDescriptor(v.seg)
		if err == nil && len(d.Buffers) == 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the initiator never saw the second region")
		}
		time.Sleep(5 * time.Millisecond)
	}
	seed := rand.Uint64()
	if err := v.tgt.Fill(extra, size, seed, 0); err != nil {
		t.Fatal(err)
	}
	// A transfer to the region works before the removal.
	if err := v.transfer(ctx, []engine.Request{v.read(v.buf[:4096], extra)}); err != nil {
		t.Fatal(err)
	}
	// The target side may release the region a moment after the
	// initiator saw the READ complete.
	for {
		err := v.tgt.Unregister(extra)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), engine.ErrMemoryBusy.Error()) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	Pattern(v.buf, seed+1, 0)
	err = v.transfer(ctx, []engine.Request{v.write(v.buf[:4096], extra), v.write(v.buf[4096:8192], extra+size-4096)})
	if err == nil {
		t.Fatal("WRITE into unregistered target memory succeeded")
	}
	t.Logf("refused: %v", err)
	if err := v.tgt.Check(extra, size, seed, 0); err != nil {
		t.Fatalf("unregistered target memory was written: %v", err)
	}
	// The registered buffer still works.
	if err := v.roundTrip(ctx, v.tgt.Info().Addr, 4096, seed+2); err != nil {
		t.Fatal(err)
	}
}

// bigBatch submits tasks of blk bytes, READ and WRITE interleaved, over
// the first ringBytes of both buffers, and returns the batch and sizes.
func (v *env) bigBatch(t *testing.T, tasks, blk, ringBytes int) (engine.BatchID, []int) {
	t.Helper()
	base := v.tgt.Info().Addr
	reqs := make([]engine.Request, tasks)
	sizes := make([]int, tasks)
	for i := range reqs {
		off := (i * blk) % ringBytes
		reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: v.buf[off : off+blk], Target: v.seg, TargetAddr: base + uint64(off)}
		sizes[i] = blk
	}
	b, err := v.e.AllocateBatch(tasks)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	return b, sizes
}

// progress waits until batch b has moved some bytes (or finished).
func (v *env) progress(t *testing.T, b engine.BatchID, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		bs, err := v.e.BatchStatus(b)
		if err != nil {
			t.Fatal(err)
		}
		if bs.Transferred > 0 || bs.State != engine.StatePending {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch moved nothing in %v", d)
		}
		time.Sleep(time.Millisecond)
	}
}

// deadTarget checks that transfers to a target that is gone fail within
// the bound (counted from when it died): a transport may learn of the
// death late, but not later than that.
func (v *env) deadTarget(t *testing.T, died time.Time) {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), died.Add(v.s.o.DeadPeer))
	defer cancel()
	for n := 1; ; n++ {
		start := time.Now()
		err := v.transfer(ctx, []engine.Request{v.write(v.buf[:4096], v.tgt.Info().Addr)})
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("transfers to a dead target still pending or succeeding %v after it died", v.s.o.DeadPeer)
		case err != nil:
			t.Logf("transfer %d to the dead target failed in %v, %v after it died: %v", n, time.Since(start).Round(time.Millisecond), time.Since(died).Round(time.Millisecond), err)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// testTargetClosed closes the target engine while a large batch is in
// flight: every task finishes within the bound, and new transfers fail.
func testTargetClosed(t *testing.T, s *suite) {
	const tasks, blk, ring = 1024, 256 << 10, 16 << 20
	v := s.newEnv(t, ring, ring)
	b, sizes := v.bigBatch(t, tasks, blk, ring)
	v.progress(t, b, s.o.Timeout)
	closed := time.Now()
	if err := v.tgt.CloseEngine(); err != nil {
		t.Fatal(err)
	}
	done, failed := v.finished(t, b, sizes, s.o.DeadPeer)
	t.Logf("all tasks finished %v after the target closed: %d COMPLETED, %d FAILED", time.Since(closed).Round(time.Millisecond), done, failed)
	if err := v.e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	v.deadTarget(t, closed)
}

// testPeerKilled SIGKILLs the target process in the middle of a large
// batch: every task finishes within the bound (COMPLETED with all its
// bytes or FAILED), a new transfer fails within the bound, and closing the
// initiator leaves no goroutine behind.
func testPeerKilled(t *testing.T, s *suite) {
	const tasks, blk, ring = 2048, 1 << 20, 64 << 20
	leaks := goleak.IgnoreCurrent()
	v := s.newEnv(t, ring, ring)
	b, sizes := v.bigBatch(t, tasks, blk, ring)
	v.progress(t, b, s.o.Timeout)
	at, _ := v.e.BatchStatus(b)
	killed := time.Now()
	if err := v.tgt.Kill(); err != nil {
		t.Fatal(err)
	}
	done, failed := v.finished(t, b, sizes, s.o.DeadPeer)
	t.Logf("all tasks finished %v after SIGKILL: %d COMPLETED, %d FAILED; %v, %d of %d B moved when the kill was sent",
		time.Since(killed).Round(time.Millisecond), done, failed, at.State, at.Transferred, tasks*blk)
	// A transport that completes a batch inside Submit (shm copies) has
	// nothing in flight to fail; one that had most of it ahead must fail
	// some of it, or it reported bytes no process received.
	if at.State == engine.StatePending && at.Transferred < tasks*blk/2 && failed == 0 {
		t.Fatal("every task COMPLETED although most of the batch was ahead when its target was killed")
	}
	if err := v.e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	v.deadTarget(t, killed)
	v.close()
	goleak.VerifyNone(t, leaks)
}

// testPeerRestart restarts the target (new process or engine: new epoch,
// new buffer, new keys) under the same name. A batch aimed at the old
// incarnation may fail but never lands in the new one; once the
// initiator has the new descriptor, the next batch succeeds on a new
// connection and the old buffer's addresses are refused.
func testPeerRestart(t *testing.T, s *suite) {
	const size = 1 << 20
	v := s.newEnv(t, size, size)
	ctx := ctxFor(t, s.o.Timeout)
	old := v.tgt.Info()
	if err := v.roundTrip(ctx, old.Addr, 64<<10, rand.Uint64()); err != nil {
		t.Fatal(err)
	}
	if err := v.tgt.Restart(size + 64<<10); err != nil {
		t.Fatal(err)
	}
	cur := v.tgt.Info()
	if cur.Epoch == old.Epoch || cur.Name != old.Name {
		t.Fatalf("restart kept epoch %#x or changed the name %q -> %q", old.Epoch, old.Name, cur.Name)
	}
	guard := rand.Uint64()
	if err := v.tgt.Fill(cur.Addr, cur.Size, guard, 0); err != nil {
		t.Fatal(err)
	}
	// At once, with what the initiator knows of the old incarnation.
	Pattern(v.buf[:4096], guard+1, 0)
	dctx, cancel := context.WithTimeout(ctx, s.o.DeadPeer)
	err := v.transfer(dctx, []engine.Request{v.write(v.buf[:4096], old.Addr)})
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a transfer to the restarted target still pending after %v", s.o.DeadPeer)
	}
	t.Logf("transfer right after the restart: %v", err)
	if err == nil {
		// Only possible when it was resolved against the new
		// incarnation, whose buffer happens to hold the old address.
		d, derr := v.e.SegmentDescriptor(v.seg)
		if derr != nil || d.Epoch != cur.Epoch || old.Addr < cur.Addr || old.Addr+4096 > cur.Addr+uint64(cur.Size) {
			t.Fatalf("a transfer to the old incarnation's address %#x succeeded (new buffer %#x+%d)", old.Addr, cur.Addr, cur.Size)
		}
		if err := v.tgt.Check(old.Addr, 4096, guard+1, 0); err != nil {
			t.Fatalf("succeeded but the new incarnation does not hold the bytes: %v", err)
		}
		if err := v.tgt.Fill(cur.Addr, cur.Size, guard, 0); err != nil {
			t.Fatal(err)
		}
	} else if err := v.tgt.Check(cur.Addr, cur.Size, guard, 0); err != nil {
		t.Fatalf("a failed transfer wrote into the new incarnation: %v", err)
	}
	// The initiator learns the new incarnation (its store watch, or
	// SyncSegment as an application would after ErrPeerReset) and its
	// buffer (an engine publishes before it registers memory).
	for {
		if d, err := v.e.SegmentDescriptor(v.seg); err == nil && d.Epoch == cur.Epoch && findOK(d.Find(cur.Addr, uint64(cur.Size))) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the initiator never saw the new incarnation")
		}
		v.e.SyncSegment(ctx, v.seg)
		time.Sleep(20 * time.Millisecond)
	}
	seed := rand.Uint64()
	for _, off := range []uint64{0, uint64(cur.Size) - 64<<10} {
		if err := v.roundTrip(ctx, cur.Addr+off, 64<<10, seed+off); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
	}
	if old.Addr+4096 <= cur.Addr || old.Addr >= cur.Addr+uint64(cur.Size) {
		err := v.transfer(ctx, []engine.Request{v.write(v.buf[:4096], old.Addr)})
		if !errors.Is(err, engine.ErrOutOfRange) {
			t.Fatalf("the old incarnation's address %#x: %v, want ErrOutOfRange", old.Addr, err)
		}
	}
}

// testInitiatorClose closes the initiator engine (and so its transport)
// in the middle of a batch: every task finishes, failed ones with
// ErrClosed; Close is idempotent, later calls fail with ErrClosed, and no
// goroutine is left.
func testInitiatorClose(t *testing.T, s *suite) {
	const tasks, blk, ring = 256, 256 << 10, 16 << 20
	leaks := goleak.IgnoreCurrent()
	v := s.newEnv(t, ring, ring)
	// A first transfer, so connections exist when Close comes.
	if err := v.roundTrip(ctxFor(t, s.o.Timeout), v.tgt.Info().Addr, 4096, rand.Uint64()); err != nil {
		t.Fatal(err)
	}
	b, sizes := v.bigBatch(t, tasks, blk, ring)
	closed := time.Now()
	if err := v.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	done, failed := v.finished(t, b, sizes, s.o.DeadPeer, engine.ErrClosed)
	t.Logf("all tasks finished %v after Close: %d COMPLETED, %d FAILED", time.Since(closed).Round(time.Millisecond), done, failed)
	if err := v.e.Submit(b, nil); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := v.e.AllocateBatch(1); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("AllocateBatch after Close: %v", err)
	}
	v.close()
	goleak.VerifyNone(t, leaks)
}

// railBytes returns the initiator transport's per-rail counters.
func (v *env) railBytes(t *testing.T) []uint64 {
	t.Helper()
	r := v.s.o.Rails
	n := r.Bytes(v.tr)
	if len(n) != r.Count {
		t.Fatalf("Rails.Bytes returned %d rails, want %d", len(n), r.Count)
	}
	return n
}

// stripe moves tasks×blk bytes each way in one batch (WRITEs then READs
// of the same ranges) and checks both sides.
func (v *env) stripe(t *testing.T, ctx context.Context, tasks, blk int) error {
	base := v.tgt.Info().Addr
	half := tasks * blk
	sw, sr := rand.Uint64(), rand.Uint64()
	Pattern(v.buf[:half], sw, 0)
	clear(v.buf[half : 2*half])
	if err := v.tgt.Fill(base+uint64(half), half, sr, 0); err != nil {
		return err
	}
	reqs := make([]engine.Request, 0, 2*tasks)
	for i := range tasks {
		off := i * blk
		reqs = append(reqs, v.write(v.buf[off:off+blk], base+uint64(off)), v.read(v.buf[half+off:half+off+blk], base+uint64(half+off)))
	}
	if err := v.transfer(ctx, reqs); err != nil {
		return err
	}
	if err := v.tgt.Check(base, half, sw, 0); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	return CheckPattern(v.buf[half:2*half], sr, 0)
}

// testMultiRail: one large batch uses every rail.
func testMultiRail(t *testing.T, s *suite) {
	const tasks, blk = 128, 256 << 10
	v := s.newEnv(t, 2*tasks*blk, 2*tasks*blk)
	ctx := ctxFor(t, s.o.Timeout)
	before := v.railBytes(t)
	if err := v.stripe(t, ctx, tasks, blk); err != nil {
		t.Fatal(err)
	}
	after := v.railBytes(t)
	var total uint64
	for i := range after {
		total += after[i] - before[i]
	}
	t.Logf("per-rail bytes of %d B moved: %v", 2*tasks*blk, sub(after, before))
	if total < 2*tasks*blk {
		t.Errorf("rails carried %d B in all, less than the %d B moved", total, 2*tasks*blk)
	}
	for i := range after {
		if after[i] == before[i] {
			t.Errorf("rail %d carried nothing", i)
		}
	}
}

func sub(a, b []uint64) []uint64 {
	d := make([]uint64, len(a))
	for i := range a {
		d[i] = a[i] - b[i]
	}
	return d
}

// testRailDown takes rail 0 down in the middle of a large batch: the
// batch completes on the other rails with its data intact, later batches
// work with the rail down, and the rail is used again once it is back up.
func testRailDown(t *testing.T, s *suite) {
	const tasks, blk = 256, 256 << 10
	r := s.o.Rails
	v := s.newEnv(t, 2*tasks*blk, 2*tasks*blk)
	ctx := ctxFor(t, s.o.Timeout)
	down := false
	t.Cleanup(func() {
		if down {
			r.SetLink(0, true)
		}
	})
	base := v.tgt.Info().Addr
	seed := rand.Uint64()
	Pattern(v.buf[:tasks*blk], seed, 0)
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		off := i * blk
		reqs[i] = v.write(v.buf[off:off+blk], base+uint64(off))
	}
	b, err := v.e.AllocateBatch(tasks)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	v.progress(t, b, s.o.Timeout)
	if err := r.SetLink(0, false); err != nil {
		t.Fatal(err)
	}
	down = true
	at := v.railBytes(t)
	if err := v.e.Wait(ctx, b); err != nil {
		t.Fatalf("batch with rail 0 taken down: %v", err)
	}
	v.e.FreeBatch(b)
	if err := v.tgt.Check(base, tasks*blk, seed, 0); err != nil {
		t.Fatalf("target after rail 0 went down: %v", err)
	}
	at2 := v.railBytes(t)
	t.Logf("per-rail bytes after rail 0 went down: %v", sub(at2, at))
	// A whole batch while the rail is down: nothing can complete on it.
	if err := v.stripe(t, ctx, tasks/2, blk); err != nil {
		t.Fatalf("with rail 0 down: %v", err)
	}
	moved := sub(v.railBytes(t), at2)
	t.Logf("per-rail bytes of a batch with rail 0 down: %v", moved)
	if moved[0] != 0 {
		t.Errorf("rail 0 carried %d B while its link was down", moved[0])
	}
	if err := r.SetLink(0, true); err != nil {
		t.Fatal(err)
	}
	down = false
	up := v.railBytes(t)
	deadline := time.Now().Add(r.Recover)
	for {
		if err := v.stripe(t, ctx, tasks/4, blk); err != nil {
			t.Fatalf("after rail 0 came back: %v", err)
		}
		if n := v.railBytes(t); n[0] > up[0] {
			t.Logf("rail 0 carries bytes again: %v", sub(n, up))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rail 0 unused %v after it came back", r.Recover)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func findOK(_ int, err error) bool { return err == nil }
