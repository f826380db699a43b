package rdma

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
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
)

// The unit tier: the rail's logic (slots, credits, failover, rail choice,
// endpoints across peers and epochs) on the scripted fabric of
// fakeverbs_test.go, on any host, no device needed. The same behaviours on
// real rxe devices are the guest tier's (rdma_test.go, multirail_test.go,
// restart_test.go).

type fnode struct {
	*enginetest.Node
	tr   *Transport
	devs []*fakeDev
}

// newFakeNode starts an engine named name with an rdma transport on devs
// and size bytes of registered memory.
func newFakeNode(t testing.TB, st *enginetest.MemStore, name string, cfg Config, size int, devs ...*fakeDev) *fnode {
	t.Helper()
	tr := New(cfg)
	tr.open = opener(devs...)
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st, Retries: 3}, size, tr)
	return &fnode{Node: n, tr: tr, devs: devs}
}

func openSeg(t testing.TB, n *fnode, name string) engine.SegmentID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seg, err := n.Engine.OpenSegment(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

func fakeRequests(op engine.Op, ini, tgt *fnode, seg engine.SegmentID, tasks, blk int) []engine.Request {
	tb := engine.AddrOf(tgt.Mem.Bytes())
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: op, Local: ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: seg, TargetAddr: tb + uint64(i*blk)}
	}
	return reqs
}

// transfer submits reqs as one batch and waits (at most wait) for it; it
// returns the first failed task's error.
func transfer(t testing.TB, e *engine.Engine, reqs []engine.Request, wait time.Duration) error {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	werr := e.Wait(ctx, b)
	if ctx.Err() != nil {
		return fmt.Errorf("batch of %d still in flight after %v: %w", len(reqs), wait, ctx.Err())
	}
	if werr != nil {
		for i := range reqs {
			if st, _ := e.Status(b, i); st.State != engine.StateCompleted {
				werr = fmt.Errorf("task %d: %v: %w", i, st.State, st.Err)
				break
			}
		}
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	return werr
}

// releaser releases held work requests every 200 µs until stopped.
func releaser(f *fabric) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(200 * time.Microsecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				f.release(-1)
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

func holdAll(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) { return hold, 0 }

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// fakePair is an initiator and a target, each on rails of its own.
func fakePair(t testing.TB, f *fabric, cfg Config, size, rails int) (ini, tgt *fnode, seg engine.SegmentID) {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	var a, b []*fakeDev
	for i := range rails {
		a = append(a, f.dev(fmt.Sprintf("a%d", i), -1))
		b = append(b, f.dev(fmt.Sprintf("b%d", i), -1))
	}
	tgt = newFakeNode(t, st, "target", cfg, size, b...)
	ini = newFakeNode(t, st, "initiator", cfg, size, a...)
	return ini, tgt, openSeg(t, ini, "target")
}

// TestFakeTransfer: WRITE then READ batches over two rails move every byte
// and use both rails.
func TestFakeTransfer(t *testing.T) {
	f := newFabric()
	const tasks, blk = 64, 64 << 10
	ini, tgt, seg := fakePair(t, f, Config{}, tasks*blk, 2)
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("target memory differs after the WRITE batch")
	}
	clear(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Read, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("local memory differs after the READ batch")
	}
	var sum uint64
	for _, r := range ini.tr.Stats() {
		if r.Bytes == 0 {
			t.Errorf("rail %s carried nothing: %+v", r.Device, ini.tr.Stats())
		}
		sum += r.Bytes
	}
	if sum != 2*tasks*blk {
		t.Errorf("rails carried %d bytes, want %d", sum, 2*tasks*blk)
	}
}

// TestFakeFailover: work requests that fail with retry-exceeded on one rail
// (a path that broke) are retried and complete, every byte verified; the
// broken endpoint is torn down and rebuilt.
func TestFakeFailover(t *testing.T) {
	f := newFabric()
	const tasks, blk = 64, 16 << 10
	ini, tgt, seg := fakePair(t, f, Config{}, tasks*blk, 2)
	var mu sync.Mutex
	failed := map[uint64]bool{} // by remote address: each slice fails once at most
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		mu.Lock()
		defer mu.Unlock()
		if q.d == ini.devs[0] && len(failed) < 8 && !failed[wr.RemoteAddr] {
			failed[wr.RemoteAddr] = true
			return fail, uverbs.WCRetryExcErr
		}
		return deliver, 0
	})
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("target memory differs after failover")
	}
	st := ini.tr.Stats()
	if st[0].Errors == 0 {
		t.Errorf("rail a0 counted no errors (%d work requests failed): %+v", len(failed), st)
	}
	if st[0].Bytes+st[1].Bytes != tasks*blk {
		t.Errorf("rails carried %d bytes, want %d", st[0].Bytes+st[1].Bytes, tasks*blk)
	}
	// The broken endpoints were destroyed on both sides, then rebuilt:
	// the target holds no more QPs than two endpoints per rail pair need.
	if n := tgt.tr.TargetQPs(); n > 2*2*2 {
		t.Errorf("target holds %d QPs", n)
	}
}

// TestFakeRailDown takes rail a1's port down with a batch in flight: its
// slices move to a0 and the batch completes with every byte; a1 reports
// down, and carries traffic again once its port is back.
func TestFakeRailDown(t *testing.T) {
	f := newFabric()
	const tasks, blk = 128, 16 << 10
	ini, tgt, seg := fakePair(t, f, Config{}, tasks*blk, 2)
	f.setPost(holdAll)
	rand.Read(ini.Mem.Bytes())
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	errc := make(chan error, 1)
	go func() { errc <- transfer(t, ini.Engine, reqs, 10*time.Second) }()
	waitFor(t, "work requests held on both rails", func() bool {
		return ini.devs[0].out.Load() > 0 && ini.devs[1].out.Load() > 0
	})
	f.setPort(ini.devs[1], false)
	waitFor(t, "rail a1 down", func() bool { return !ini.tr.Stats()[1].Up })
	stop := releaser(f)
	err := <-errc
	stop()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("target memory differs after the batch that lost a rail")
	}
	st := ini.tr.Stats()
	if st[1].Errors == 0 || st[0].Bytes+st[1].Bytes != tasks*blk {
		t.Errorf("after rail down: %+v", st)
	}
	f.setPost(nil)
	f.setPort(ini.devs[1], true)
	waitFor(t, "rail a1 up again", func() bool { return ini.tr.Stats()[1].Up })
	before := ini.tr.Stats()[1].Bytes
	if err := transfer(t, ini.Engine, reqs[:32], 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ini.tr.Stats()[1].Bytes == before {
		t.Errorf("rail a1 carried nothing after it came back: %+v", ini.tr.Stats())
	}
}

// TestFakeCredits: no QP ever has more work requests outstanding than its
// send queue holds; the rest wait on the rail and go out as completions
// return credits.
func TestFakeCredits(t *testing.T) {
	f := newFabric()
	const tasks, blk = 64, 4096
	ini, tgt, seg := fakePair(t, f, Config{SendDepth: 4, QPsPerPath: 2}, tasks*blk, 1)
	f.setPost(holdAll)
	rand.Read(ini.Mem.Bytes())
	errc := make(chan error, 1)
	go func() {
		errc <- transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second)
	}()
	waitFor(t, "8 work requests held", func() bool { return f.nheld() == 8 })
	time.Sleep(10 * time.Millisecond)
	if n := f.nheld(); n != 8 {
		t.Fatalf("%d work requests posted on 2 QPs of 4 credits each", n)
	}
	for f.nheld() > 0 || len(errc) == 0 {
		f.release(3) // fewer than a QP's credits at a time
		time.Sleep(100 * time.Microsecond)
		if m := f.maxQP.Load(); m > 4 {
			t.Fatalf("%d work requests outstanding on a QP of 4", m)
		}
		if f.posted.Load() > tasks {
			t.Fatalf("%d work requests posted for %d slices", f.posted.Load(), tasks)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("target memory differs")
	}
}

// TestFakeSlotReuse: a rail never has more work requests in flight than its
// slot table (sized to the CQ, less a quarter set aside for notification
// receives) holds, whatever its QPs' credits; slots are reused across many
// batches, and a stale completion (an old generation of a slot) is
// ignored.
func TestFakeSlotReuse(t *testing.T) {
	f := newFabric()
	const tasks, blk = 64, 4096
	const slots = 8 - 8/4
	ini, tgt, seg := fakePair(t, f, Config{CQDepth: 8, QPsPerPath: 2}, tasks*blk, 1)
	f.setPost(holdAll)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	errc := make(chan error, 1)
	go func() { errc <- transfer(t, ini.Engine, reqs, 10*time.Second) }()
	waitFor(t, "a slot table's work requests held", func() bool { return f.nheld() == slots })
	time.Sleep(10 * time.Millisecond)
	if n := f.nheld(); n != slots {
		t.Fatalf("%d work requests in flight on a rail of %d slots", n, slots)
	}
	// A completion for slot 0 of an old generation: ignored.
	ini.devs[0].push(uverbs.WC{ID: 0xffff << 32, Status: uverbs.WCSuccess})
	ini.tr.rails[0].kick()
	stop := releaser(f)
	defer stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		rand.Read(ini.Mem.Bytes())
		if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
			t.Fatalf("batch %d: target memory differs", i)
		}
	}
	if m := f.maxDev.Load(); m > slots {
		t.Fatalf("%d work requests in flight on a rail of %d slots", m, slots)
	}
	if got := ini.tr.Stats()[0].Slices; got != 11*tasks {
		t.Fatalf("%d slices completed, want %d", got, 11*tasks)
	}
}

// TestFakeEviction: with room for one endpoint, alternating between two
// targets evicts the idle one each time; the evicted endpoint's QPs go on
// both sides, and the next use connects again.
func TestFakeEviction(t *testing.T) {
	f := newFabric()
	const blk = 4096
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	t1 := newFakeNode(t, st, "t1", Config{}, blk, f.dev("t1", -1))
	t2 := newFakeNode(t, st, "t2", Config{}, blk, f.dev("t2", -1))
	ini := newFakeNode(t, st, "ini", Config{MaxEndpoints: 1}, blk, f.dev("i0", -1))
	s1, s2 := openSeg(t, ini, "t1"), openSeg(t, ini, "t2")
	for i := range 3 {
		for _, x := range []struct {
			tgt *fnode
			seg engine.SegmentID
		}{{t1, s1}, {t2, s2}} {
			rand.Read(ini.Mem.Bytes())
			if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, x.tgt, x.seg, 1, blk), 10*time.Second); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if !bytes.Equal(ini.Mem.Bytes(), x.tgt.Mem.Bytes()) {
				t.Fatalf("round %d: target memory differs", i)
			}
			if held, _ := ini.tr.Endpoints(); held > 1 {
				t.Fatalf("%d endpoints held, bound 1", held)
			}
		}
	}
	if _, ev := ini.tr.Endpoints(); ev < 5 {
		t.Errorf("%d evictions in 6 alternating transfers, want 5", ev)
	}
	// The last evicted endpoint was t1's: the target dropped its QPs.
	// t2 keeps the live endpoint's two; the goodbye for its endpoint
	// evicted a round before may still be on its way.
	waitFor(t, "t1 to drop the evicted endpoint's QPs", func() bool { return t1.tr.TargetQPs() == 0 })
	waitFor(t, "t2 to hold only the live endpoint's 2 QPs", func() bool { return t2.tr.TargetQPs() == 2 })
}

// TestFakeEpochs restarts the target (a new engine under the same name: new
// epoch, new memory, new keys) with a batch in flight: that batch ends
// (completed or failed, never hanging), the old incarnation's QPs go, and
// the initiator connects to the new one; every work request carries the
// keys of the incarnation it was built for.
func TestFakeEpochs(t *testing.T) {
	f := newFabric()
	const tasks, blk = 16, 16 << 10
	var (
		mu    sync.Mutex
		posts []posted
	)
	postHook = func(epoch uint64, rkey uint32, addr, n uint64) {
		mu.Lock()
		posts = append(posts, posted{epoch, rkey, addr, n})
		mu.Unlock()
	}
	t.Cleanup(func() { postHook = nil })
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := newFakeNode(t, st, "target", Config{}, tasks*blk, f.dev("t0", -1))
	ini := newFakeNode(t, st, "initiator", Config{}, tasks*blk, f.dev("i0", -1))
	seg := openSeg(t, ini, "target")
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	old, _ := ini.Engine.SegmentDescriptor(seg)
	f.setPost(holdAll)
	errc := make(chan error, 1)
	go func() {
		errc <- transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk), 10*time.Second)
	}()
	waitFor(t, "work requests held", func() bool { return f.nheld() > 0 })
	if err := tgt.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	t.Logf("batch in flight when the target closed: %v", err)
	if err != nil && !errors.Is(err, engine.ErrPeerReset) && !errors.Is(err, engine.ErrTransient) {
		t.Errorf("batch in flight across the restart failed with %v, want a peer reset", err)
	}
	f.setPost(nil)
	tgt2 := newFakeNode(t, st, "target", Config{}, tasks*blk, f.dev("t0b", -1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if d, err := ini.Engine.SegmentDescriptor(seg); err == nil && d.Epoch != old.Epoch && len(d.Buffers) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the initiator never saw the new incarnation")
		}
		ini.Engine.SyncSegment(ctx, seg)
		time.Sleep(5 * time.Millisecond)
	}
	cur, _ := ini.Engine.SegmentDescriptor(seg)
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt2, seg, tasks, blk), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt2.Mem.Bytes()) {
		t.Fatal("the new incarnation does not hold the written bytes")
	}
	mu.Lock()
	defer mu.Unlock()
	var toNew int
	for _, w := range posts {
		d := map[uint64]*descriptorKeys{old.Epoch: keysOf(bufferKeys(old, 0)), cur.Epoch: keysOf(bufferKeys(cur, 0))}[w.epoch]
		if d == nil || !d.has(w.rkey) {
			t.Fatalf("a work request for epoch %#x carries rkey %#x (old %#x %v, new %#x %v)", w.epoch, w.rkey,
				old.Epoch, bufferKeys(old, 0), cur.Epoch, bufferKeys(cur, 0))
		}
		if w.epoch == cur.Epoch {
			toNew++
		}
	}
	if toNew != tasks {
		t.Errorf("%d work requests to the new incarnation, want %d", toNew, tasks)
	}
}

type posted struct {
	epoch   uint64
	rkey    uint32
	addr, n uint64
}

type descriptorKeys struct{ keys []uint32 }

func keysOf(k []uint32) *descriptorKeys { return &descriptorKeys{k} }

func (d *descriptorKeys) has(k uint32) bool {
	for _, x := range d.keys {
		if x == k {
			return true
		}
	}
	return false
}

// TestFakeRailChoice: memory goes over the rails its location prefers
// (Config.Priority, else the NUMA node of "cpu:N"), over the others only
// while those are down; among equals, a rail gets bytes in proportion to
// its measured rate.
func TestFakeRailChoice(t *testing.T) {
	const tasks, blk = 32, 16 << 10
	run := func(t *testing.T, cfg Config, numa [2]int, want int) {
		f := newFabric()
		st := enginetest.NewMemStore()
		t.Cleanup(func() { st.Close() })
		tgt := newFakeNode(t, st, "target", Config{}, tasks*blk, f.dev("b0", -1), f.dev("b1", -1))
		ini := newFakeNode(t, st, "initiator", cfg, tasks*blk, f.dev("a0", numa[0]), f.dev("a1", numa[1]))
		seg := openSeg(t, ini, "target")
		reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
		if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if st := ini.tr.Stats(); st[want].Bytes != tasks*blk {
			t.Fatalf("preferred rail a%d: %+v", want, st)
		}
		f.setPort(ini.devs[want], false)
		waitFor(t, "preferred rail down", func() bool { return !ini.tr.Stats()[want].Up })
		if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if st := ini.tr.Stats(); st[1-want].Bytes != tasks*blk {
			t.Fatalf("preferred rail down, the other should carry the batch: %+v", st)
		}
	}
	t.Run("priority", func(t *testing.T) { run(t, Config{Priority: map[string][]string{"cpu:0": {"a1"}}}, [2]int{-1, -1}, 1) })
	t.Run("numa", func(t *testing.T) { run(t, Config{}, [2]int{1, 0}, 1) })
	t.Run("rate", func(t *testing.T) {
		tr := &Transport{}
		for i, rate := range []uint64{100 << 20, 300 << 20} {
			r := &rail{t: tr, idx: i}
			r.up.Store(true)
			r.rate.Store(rate)
			tr.rails = append(tr.rails, r)
		}
		var n [2]int
		for range 400 {
			r := tr.pickRail(0, ^uint64(0), blk, 0)
			r.outstanding.Add(blk)
			n[r.idx]++
		}
		if n[0] < 90 || n[0] > 110 {
			t.Fatalf("rails of 100 and 300 MB/s took %d and %d of 400 slices, want about 100 and 300", n[0], n[1])
		}
		tr.rails[1].up.Store(false)
		if r := tr.pickRail(0, ^uint64(0), blk, 0); r != tr.rails[0] {
			t.Fatal("a rail that is down was chosen")
		}
	})
}

// TestFakeAllocs: a batch of 128 slices submitted, completed and freed
// allocates nothing, initiator and target included, with the counters
// that the metrics export counting every byte.
func TestFakeAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	f := newFabric()
	const tasks, blk = 128, 4096
	ini, tgt, seg := fakePair(t, f, Config{}, tasks*blk, 2)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	ctx := context.Background()
	run, failed := enginetest.BatchLoop(ctx, ini.Engine, reqs)
	for range 8 {
		run()
	}
	// The counters the metrics read are on: every byte shows in the
	// engine's and the rails' counters.
	written := func() (eng, rails uint64) {
		s := ini.Engine.Snapshot()
		for _, tr := range s.Traffic {
			eng += tr.WriteBytes
		}
		for _, tr := range s.Transports {
			for _, p := range tr.Traffic {
				rails += p.WriteBytes
			}
		}
		return eng, rails
	}
	e0, r0 := written()
	allocs := enginetest.AllocsPerRun(20, run)
	if err := failed(); err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d", allocs, tasks)
	}
	e1, r1 := written()
	if want := uint64(21 * tasks * blk); e1-e0 != want || r1-r0 != want {
		t.Fatalf("counted %d bytes in the engine and %d on the rails over 21 batches, want %d", e1-e0, r1-r0, want)
	} // Inspect: both rails up with nothing queued or posted, the
	// endpoints to the target ready.
	st := ini.Engine.Snapshot().Transports[0]
	if len(st.Rails) != 2 || !st.Rails[0].Up || st.Rails[0].Queued != 0 || st.Rails[0].Posted != 0 || st.Rails[0].Attrs["mtu"] == "" {
		t.Fatalf("rails %+v", st.Rails)
	}
	ready := 0
	for _, p := range st.Paths {
		if p.Peer == "target" && p.State == "ready" && p.Queued == 0 && p.Posted == 0 {
			ready++
		}
	}
	if ready == 0 {
		t.Fatalf("no ready endpoint to the target among %+v", st.Paths)
	}
}

// TestFakeSliceTimeout: work requests the device never completes fail
// their slices after Config.SliceTimeout with ErrSliceTimeout (after the
// engine's retries) instead of hanging; their endpoint is flushed and
// rebuilt, and the next batch goes through. The default timeout is
// 4 × uverbs.RetryBound of the provider's defaults.
func TestFakeSliceTimeout(t *testing.T) {
	f := newFabric()
	const tasks, blk = 4, 4096
	const timeout = 40 * time.Millisecond
	ini, tgt, seg := fakePair(t, f, Config{SliceTimeout: timeout}, tasks*blk, 1)
	if got := tgt.tr.rails[0].sliceTimeout; got != timeout {
		t.Fatalf("slice timeout %v, want %v as configured", got, timeout)
	}
	f.setPost(func(*fakeQP, *uverbs.SendWR) (verdict, uverbs.WCStatus) { return lose, 0 })
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	start := time.Now()
	err := transfer(t, ini.Engine, reqs, 10*time.Second)
	took := time.Since(start)
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, ErrSliceTimeout) {
		t.Fatalf("a batch the device never completes: %v, want ErrSliceTimeout", err)
	}
	// Each of 1+3 tries waits out the timeout, found within a quarter of it.
	if took < 4*timeout || took > 4*timeout*5/4+2*time.Second {
		t.Errorf("failed after %v; 4 tries of %v", took, timeout)
	}
	waitFor(t, "the lost work requests flushed", func() bool { return f.nheld() == 0 })
	waitFor(t, "every slot free", func() bool { return ini.tr.rails[0].outstanding.Load() == 0 })
	f.setPost(nil)
	rand.Read(ini.Mem.Bytes())
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
		t.Fatal("target memory differs")
	}
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	n := newFakeNode(t, st, "x", Config{}, 0, f.dev("x", -1))
	if got, want := n.tr.rails[0].sliceTimeout, 4*uverbs.RetryBound(14, 6); got != want {
		t.Errorf("default slice timeout %v, want %v (4 retry bounds of the provider's defaults)", got, want)
	}
}

// TestFakeSubmitOncePerRail: a batch of 128 slices over two rails takes
// each rail's queue lock once, not once per slice.
func TestFakeSubmitOncePerRail(t *testing.T) {
	f := newFabric()
	const tasks, blk = 128, 4096
	ini, tgt, seg := fakePair(t, f, Config{}, tasks*blk, 2)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil { // endpoints up
		t.Fatal(err)
	}
	var mu sync.Mutex
	var locks [2]int
	enqueueHook = func(r int) {
		mu.Lock()
		locks[r]++
		mu.Unlock()
	}
	t.Cleanup(func() { enqueueHook = nil })
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if locks != [2]int{1, 1} {
		t.Fatalf("a batch of %d over 2 rails took the rails' queue locks %v times, want once each", tasks, locks)
	}
}

// bufferKeys returns buffer i's keys in d's rdma entry.
func bufferKeys(d *segment.Descriptor, i int) []uint32 {
	p, _ := d.Protocol(segment.ProtoRDMA)
	return p.RDMA.Keys(i)
}

// TestFakeHeldSlices: with more than one rail, a rail keeps at most
// Config.RailPostBytes of slices posted and holds the rest, and a rail
// with room and nothing of its own left takes what another holds: while
// rail a0's work requests do not complete, rail a1 carries all of a0's
// share of the batch but the slices a0 had posted. Held slices fail with
// ErrClosed when the transport closes.
func TestFakeHeldSlices(t *testing.T) {
	const tasks, blk, posted = 64, 16 << 10, 4
	cfg := Config{RailPostBytes: posted * blk}
	t.Run("steal", func(t *testing.T) {
		f := newFabric()
		ini, tgt, seg := fakePair(t, f, cfg, tasks*blk, 2)
		reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
		// Both rails' endpoints ready first: slices that wait for a
		// handshake are posted when it ends, not held.
		if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		before := ini.tr.Stats()
		slow := ini.devs[0]
		f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
			if q.d == slow {
				return hold, 0
			}
			return deliver, 0
		})
		rand.Read(ini.Mem.Bytes())
		errc := make(chan error, 1)
		go func() { errc <- transfer(t, ini.Engine, reqs, 10*time.Second) }()
		waitFor(t, "rail a1 to carry all but a0's posted slices", func() bool {
			return ini.tr.Stats()[1].Slices-before[1].Slices == tasks-posted
		})
		if n := f.nheld(); n != posted {
			t.Fatalf("%d work requests posted on the stalled rail, want %d (RailPostBytes)", n, posted)
		}
		if len(errc) != 0 {
			t.Fatalf("batch done with work requests held: %v", <-errc)
		}
		f.release(-1)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ini.Mem.Bytes(), tgt.Mem.Bytes()) {
			t.Fatal("target memory differs")
		}
		after := ini.tr.Stats()
		if got := after[0].Slices - before[0].Slices; got != posted {
			t.Fatalf("stalled rail completed %d slices, want %d: %+v", got, posted, after)
		}
		for _, r := range after {
			if r.Outstanding != 0 {
				t.Fatalf("bytes outstanding after the batch: %+v", after)
			}
		}
	})
	t.Run("close", func(t *testing.T) {
		f := newFabric()
		ini, tgt, seg := fakePair(t, f, cfg, tasks*blk, 2)
		reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
		if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		f.setPost(holdAll)
		e := ini.Engine
		b, err := e.AllocateBatch(tasks)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "both rails' posted slices held", func() bool { return f.nheld() == 2*posted })
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Wait(ctx, b); ctx.Err() != nil {
			t.Fatalf("batch still in flight after Close: %v", err)
		}
		for i := range reqs {
			st, _ := e.Status(b, i)
			if st.State != engine.StateFailed || !errors.Is(st.Err, engine.ErrClosed) {
				t.Fatalf("task %d after Close: %v, %v; want failed with ErrClosed", i, st.State, st.Err)
			}
		}
	})
}

// TestFakeHeldAllocs: batches whose slices are held back (RailPostBytes of
// four slices against 64 per rail) and taken by the other rail allocate
// nothing in steady state.
func TestFakeHeldAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	f := newFabric()
	const tasks, blk = 128, 4096
	ini, tgt, seg := fakePair(t, f, Config{RailPostBytes: 4 * blk}, tasks*blk, 2)
	run, failed := enginetest.BatchLoop(context.Background(), ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, tasks, blk))
	for range 8 {
		run()
	}
	allocs := enginetest.AllocsPerRun(20, run)
	if err := failed(); err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d with slices held", allocs, tasks)
	}
	for _, r := range ini.tr.Stats() {
		if r.Slices == 0 || r.Outstanding != 0 {
			t.Fatalf("rails after the batches: %+v", ini.tr.Stats())
		}
	}
}
