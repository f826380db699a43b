package shm

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// inProcessPair starts a target and an initiator engine in this process,
// both with shm, and opens the target.
func inProcessPair(t testing.TB, size int, cfg Config) (ini, tgt *enginetest.Node, itr, ttr *Transport, seg engine.SegmentID) {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	node := func(name string, tr *Transport) *enginetest.Node {
		n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 0, tr)
		mem, err := engine.AllocShared(size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		if err := n.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
			t.Fatal(err)
		}
		n.Mem = mem
		return n
	}
	ttr, itr = New(cfg), New(cfg)
	tgt, ini = node("target", ttr), node("initiator", itr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if seg, err = ini.Engine.OpenSegment(ctx, "target", nil); err != nil {
		t.Fatal(err)
	}
	return
}

// TestZeroAllocs: a steady stream of batches (small ones copied by the
// submitter, large ones spread over the copiers) allocates nothing.
func TestZeroAllocs(t *testing.T) {
	const size = 16 << 20
	ini, tgt, _, _, seg := inProcessPair(t, size, Config{})
	e := ini.Engine
	ctx := context.Background()
	base := engine.AddrOf(tgt.Mem.Bytes())
	for _, c := range []struct {
		n, blk int
	}{{128, 4096}, {16, 1 << 20}} {
		reqs := make([]engine.Request, c.n)
		for i := range reqs {
			reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: ini.Mem.Bytes()[i*c.blk : (i+1)*c.blk], Target: seg, TargetAddr: base + uint64(i*c.blk)}
		}
		b, _ := e.AllocateBatch(c.n)
		run := func() {
			if err := e.Submit(b, reqs); err != nil {
				t.Fatal(err)
			}
			if err := e.Wait(ctx, b); err != nil {
				t.Fatal(err)
			}
			e.FreeBatch(b)
			b, _ = e.AllocateBatch(c.n)
		}
		run()
		if a, all := enginetest.SteadyAllocs(100, 3, run); a != 0 {
			t.Errorf("%d × %d B: %.1f allocations per batch (tries: %v)", c.n, c.blk, a, all)
		}
	}
}

// TestUnregisterWaitsForCopy: while an initiator is inside a copy into a
// region, unregistering the region waits; once the copy ends it returns,
// and the next copy is refused. A copy stuck past IOTimeout gets its
// initiator disconnected instead.
func TestUnregisterWaitsForCopy(t *testing.T) {
	for _, stuck := range []bool{false, true} {
		timeout := 30 * time.Second
		if stuck {
			timeout = 200 * time.Millisecond
		}
		ini, tgt, itr, ttr, seg := inProcessPair(t, 1<<20, Config{IOTimeout: timeout})
		ctx := context.Background()
		base := engine.AddrOf(tgt.Mem.Bytes())
		if err := ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: base}}); err != nil {
			t.Fatal(err)
		}
		// Play an initiator inside a copy: hold the peer and raise the
		// slot's busy counter, as copyRun does (hold).
		var p *peer
		itr.mu.Lock()
		for x := range itr.peers {
			p = x
		}
		itr.mu.Unlock()
		m := p.find(base, 64)
		p.users.Add(1)
		p.page.busy[m.slot].Add(1)
		release := func() {
			p.page.busy[m.slot].Add(-1)
			p.users.Add(-1)
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- tgt.Engine.UnregisterLocalMemory(tgt.Mem.Bytes()) }()
		if !stuck {
			select {
			case err := <-done:
				t.Fatalf("unregistered during a copy: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
			if g := p.page.gen[m.slot].Load(); g != 0 {
				t.Fatalf("generation %d during revocation, want 0", g)
			}
			release()
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if stuck {
			if d := time.Since(start); d < timeout {
				t.Fatalf("gave up on the stuck peer after %v, before IOTimeout %v", d, timeout)
			}
			eventually(t, 5*time.Second, "stuck initiator disconnected", func() bool { return ttr.Stats().Served == 0 })
			release()
			continue
		}
		// The next copy is refused, and the initiator unmaps the region.
		err := ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: base}})
		if err == nil {
			t.Fatal("WRITE after unregistration succeeded")
		}
		eventually(t, 5*time.Second, "initiator unmaps the region", func() bool { return itr.Stats().Mapped == 0 })
	}
}

// TestSpreadCopiesEach: a submission shared by the submitter (from the
// front) and copiers (from the back) copies every slice exactly once,
// whatever their sizes and wherever the two ends meet.
func TestSpreadCopiesEach(t *testing.T) {
	for _, copiers := range []int{1, 3} {
		const size = 4 << 20
		ini, tgt, itr, _, seg := inProcessPair(t, size, Config{Copiers: copiers, ParallelMin: 1})
		base := engine.AddrOf(tgt.Mem.Bytes())
		ctx := ctxT(t, 30*time.Second)
		for round := range 20 {
			itr.pace.shared.Store(0) // share the WRITE (pace.share)
			rnd := rand.New(rand.NewPCG(uint64(copiers), uint64(round)))
			local, remote := ini.Mem.Bytes()[:size/2], tgt.Mem.Bytes()[:size/2]
			for i := range local {
				local[i] = byte(rnd.Uint32())
			}
			clear(remote)
			var reqs []engine.Request
			for off := 0; off < len(local); {
				n := min(1+rnd.IntN(16<<10), len(local)-off)
				reqs = append(reqs, engine.Request{Op: engine.Write, Local: local[off : off+n], Target: seg, TargetAddr: base + uint64(off)})
				off += n
			}
			if err := ini.Engine.Transfer(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(remote, local) {
				t.Fatalf("%d copiers, round %d: WRITE of %d requests differs", copiers, round, len(reqs))
			}
			back := ini.Mem.Bytes()[size/2:]
			for i := range reqs {
				off := reqs[i].TargetAddr - base
				reqs[i].Op, reqs[i].Local = engine.Read, back[off:off+uint64(len(reqs[i].Local))]
			}
			if err := ini.Engine.Transfer(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, local) {
				t.Fatalf("%d copiers, round %d: READ of %d requests differs", copiers, round, len(reqs))
			}
		}
	}
}

// TestPace: large submissions are shared until both ways are measured,
// then go the faster way, except one in probeEvery, which goes the other
// way; a change of pace turns the choice.
func TestPace(t *testing.T) {
	var p pace
	if !p.share() {
		t.Fatal("first large submission not shared")
	}
	p.learn(true, 1<<20, 100*time.Microsecond)
	if p.share() {
		t.Fatal("alone not tried once sharing was measured")
	}
	p.learn(false, 2<<20, 400*time.Microsecond) // 200 µs a MiB alone, 100 shared
	count := func() (shared int) {
		for range probeEvery {
			if p.share() {
				shared++
			}
		}
		return shared
	}
	if n := count(); n != probeEvery-1 {
		t.Fatalf("shared %d of %d while sharing is faster, want all but the probe", n, probeEvery)
	}
	for range 10 {
		p.learn(true, 1<<20, time.Millisecond) // the copiers' CPUs got busy
	}
	if n := count(); n != 1 {
		t.Fatalf("shared %d of %d while alone is faster, want the probe only", n, probeEvery)
	}
}
