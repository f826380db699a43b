package rdma_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"github.com/rdmago/te/engine/enginetest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/test/softroce/srenv"
)

// TestNotifyAfterData: on Soft-RoCE, concurrent submitters WRITE random
// bytes over both rails with a notification per batch; the target
// compares its memory with what each submitter wrote the moment each
// notification arrives (no byte of that batch may be missing), gets each
// exactly once, and a batch of 4096 tasks is notified the same way.
func TestNotifyAfterData(t *testing.T) {
	topo := srenv.Require(t)
	for _, markers := range []bool{false, true} {
		t.Run(fmt.Sprintf("markers=%v", markers), func(t *testing.T) { testNotifyAfterData(t, topo, markers) })
	}
}

func testNotifyAfterData(t *testing.T, topo srenv.Topo, markers bool) {
	const submitters, rounds, tasks, blk = 4, 6, 32, 16 << 10
	region := tasks * blk
	p := newPair(t, submitters*region, names(topo.HostA), names(topo.HostB), rdma.Config{NotifyMarkers: markers})
	ib, tb := p.ini.Mem.Bytes(), p.tgt.Mem.Bytes()
	var acks [submitters]chan struct{}
	for i := range acks {
		acks[i] = make(chan struct{}, 1)
	}
	errs := make(chan error, submitters+1)
	go func() {
		seen := map[[2]uint32]bool{}
		for got := 0; got < submitters*rounds; got++ {
			var n engine.Notification
			select {
			case n = <-p.tgt.Engine.Notifications():
			case <-time.After(60 * time.Second):
				errs <- fmt.Errorf("%d of %d notifications after 60 s", got, submitters*rounds)
				return
			}
			w, round := binary.BigEndian.Uint32(n.Msg), binary.BigEndian.Uint32(n.Msg[4:])
			// The submitter waits for this ack before it writes again, so
			// its bytes are stable in its own memory now.
			if i := firstDiff(ib[int(w)*region:int(w+1)*region], tb[int(w)*region:int(w+1)*region]); i >= 0 {
				errs <- fmt.Errorf("submitter %d round %d: byte %d differs at the notification", w, round, i)
				return
			}
			if n.Bytes != uint64(region) || n.From != "initiator" {
				errs <- fmt.Errorf("notification %+v", n)
				return
			}
			k := [2]uint32{w, round}
			if seen[k] {
				errs <- fmt.Errorf("submitter %d round %d notified twice", w, round)
				return
			}
			seen[k] = true
			acks[w] <- struct{}{}
		}
		errs <- nil
	}()
	var wg sync.WaitGroup
	for w := range submitters {
		wg.Go(func() {
			base := engine.AddrOf(tb) + uint64(w*region)
			reqs := make([]engine.Request, tasks)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: ib[w*region+i*blk : w*region+(i+1)*blk], Target: p.seg, TargetAddr: base + uint64(i*blk)}
			}
			msg := make([]byte, 8)
			for round := range rounds {
				rand.Read(ib[w*region : (w+1)*region])
				binary.BigEndian.PutUint32(msg, uint32(w))
				binary.BigEndian.PutUint32(msg[4:], uint32(round))
				if err := notifyBatch(p.ini.Engine, reqs, engine.Notify{Name: "kv", Msg: msg}); err != nil {
					errs <- fmt.Errorf("submitter %d round %d: %w", w, round, err)
					return
				}
				select {
				case <-acks[w]:
				case <-time.After(60 * time.Second):
					errs <- fmt.Errorf("submitter %d round %d: not notified in 60 s", w, round)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	// 4096 tasks of 64 bytes.
	rand.Read(ib[:4096*64])
	big := p.requests(engine.Write, 4096, 64)
	if err := notifyBatch(p.ini.Engine, big, engine.Notify{Name: "big"}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-p.tgt.Engine.Notifications():
		if i := firstDiff(ib[:4096*64], tb[:4096*64]); n.Name != "big" || i >= 0 {
			t.Fatalf("notification %q; first byte differing at it: %d", n.Name, i)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the 4096-task batch was not notified in 60 s")
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func notifyBatch(e *engine.Engine, reqs []engine.Request, n engine.Notify) error {
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		return err
	}
	defer e.FreeBatch(b)
	if err := e.SubmitNotify(b, reqs, n); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return e.Wait(ctx, b)
}

// TestNotifySteadyStateAllocs: a batch of 128 WRITEs with a notification,
// notified and drained, allocates nothing once warm, initiator and
// target included (the notification's name and message are empty: the
// target's inbox copies what it queues).
func TestNotifySteadyStateAllocs(t *testing.T) {
	topo := srenv.Require(t)
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const tasks, blk = 128, 4096
	p := newPair(t, tasks*blk, names(topo.HostA), names(topo.HostB), rdma.Config{})
	reqs := p.requests(engine.Write, tasks, blk)
	ctx := context.Background()
	got := make([]engine.Notification, 0, 8)
	var failed error
	run := func() {
		b, err := p.ini.Engine.AllocateBatch(tasks)
		if err == nil {
			err = p.ini.Engine.SubmitNotify(b, reqs, engine.Notify{})
		}
		if err == nil {
			err = p.ini.Engine.Wait(ctx, b)
		}
		if err == nil {
			err = p.ini.Engine.FreeBatch(b)
		}
		for len(got) == 0 && err == nil {
			got = p.tgt.Engine.DrainNotifications(got[:0])
		}
		got = got[:0]
		if err != nil && failed == nil {
			failed = err
		}
	}
	for range 8 {
		run()
	}
	allocs := enginetest.AllocsPerRun(8, run)
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d with a notification", allocs, tasks)
	}
}

// BenchmarkNotify measures, side by side in one run over both rails,
// the two ways a note follows its data: sent after the data completed
// ("after") and as markers behind the data on every QP ("markers"). For
// a small batch: the time from submit to the target's notification next
// to the initiator's own completion of the same batch and of a batch
// without a notification (p50, p99). For 4 MiB batches: the throughput
// with a notification per batch (until the target has it) next to
// without (alternating, so all see the same machine).
func BenchmarkNotify(b *testing.B) {
	topo := srenv.Require(b)
	type mode struct {
		name string
		p    *pair
		ch   <-chan engine.Notification
	}
	setup := func(b *testing.B, tasks, blk int) (*pair, []*mode, []engine.Request) {
		var ms []*mode
		for _, markers := range []bool{false, true} {
			p := newPair(b, tasks*blk, names(topo.HostA), names(topo.HostB), rdma.Config{NotifyMarkers: markers})
			name := "after"
			if markers {
				name = "markers"
			}
			ms = append(ms, &mode{name: name, p: p, ch: p.tgt.Engine.Notifications()})
		}
		return ms[0].p, ms, ms[0].p.requests(engine.Write, tasks, blk)
	}
	ctx := context.Background()
	b.Run("latency", func(b *testing.B) {
		const tasks, blk = 4, 4096
		p0, ms, reqs := setup(b, tasks, blk)
		var plain []time.Duration
		done := map[string][]time.Duration{}
		noted := map[string][]time.Duration{}
		for b.Loop() {
			e := p0.ini.Engine
			id, _ := e.AllocateBatch(tasks)
			start := time.Now()
			if err := e.Submit(id, reqs); err != nil {
				b.Fatal(err)
			}
			if err := e.Wait(ctx, id); err != nil {
				b.Fatal(err)
			}
			plain = append(plain, time.Since(start))
			e.FreeBatch(id)
			for _, m := range ms {
				e := m.p.ini.Engine
				reqs := m.p.requests(engine.Write, tasks, blk)
				id, _ := e.AllocateBatch(tasks)
				start := time.Now()
				if err := e.SubmitNotify(id, reqs, engine.Notify{Name: "n"}); err != nil {
					b.Fatal(err)
				}
				if err := e.Wait(ctx, id); err != nil {
					b.Fatal(err)
				}
				done[m.name] = append(done[m.name], time.Since(start))
				<-m.ch
				noted[m.name] = append(noted[m.name], time.Since(start))
				e.FreeBatch(id)
			}
		}
		report(b, "plain", plain)
		for _, m := range ms {
			report(b, m.name+"-complete", done[m.name])
			report(b, m.name+"-notify", noted[m.name])
		}
	})
	b.Run("throughput", func(b *testing.B) {
		// Batches back to back: plain ones, then ones with a note each
		// whose notes the target takes as they come; the time of the
		// latter runs to the last note's arrival.
		const tasks, blk = 64, 64 << 10
		p0, ms, reqs := setup(b, tasks, blk)
		var plain time.Duration
		noted := map[string]time.Duration{}
		n := 0
		for b.Loop() {
			e := p0.ini.Engine
			id, _ := e.AllocateBatch(tasks)
			start := time.Now()
			if err := e.Submit(id, reqs); err != nil {
				b.Fatal(err)
			}
			if err := e.Wait(ctx, id); err != nil {
				b.Fatal(err)
			}
			plain += time.Since(start)
			e.FreeBatch(id)
			for _, m := range ms {
				e := m.p.ini.Engine
				reqs := m.p.requests(engine.Write, tasks, blk)
				id, _ := e.AllocateBatch(tasks)
				start := time.Now()
				if err := e.SubmitNotify(id, reqs, engine.Notify{Name: "n"}); err != nil {
					b.Fatal(err)
				}
				if err := e.Wait(ctx, id); err != nil {
					b.Fatal(err)
				}
				noted[m.name] += time.Since(start)
				e.FreeBatch(id)
			}
			n++
		}
		for _, m := range ms {
			// What is still on its way counts: the last notes' arrival.
			start := time.Now()
			for range n {
				<-m.ch
			}
			noted[m.name] += time.Since(start)
		}
		bytes := float64(n * tasks * blk)
		b.ReportMetric(bytes/plain.Seconds()/1e9, "GB/s-plain")
		for _, m := range ms {
			b.ReportMetric(bytes/noted[m.name].Seconds()/1e9, "GB/s-"+m.name)
			b.ReportMetric(plain.Seconds()/noted[m.name].Seconds(), "ratio-"+m.name)
		}
	})
}

func report(b *testing.B, what string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), what+"-p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), what+"-p99-µs")
}

// TestNotifyConformance runs the engine's notification cases
// (transporttest.RunNotify) on Soft-RoCE between the two simulated hosts
// (initiators on host A's rails, the target on host B's), notes after
// their data (the default; TestFakeNotifyConformance runs both ways over
// the fake fabric). The target holds at most NotifyDepth × QPsPerPath
// notes per endpoint, one endpoint per rail: the Flood case's NotifyHeld.
// A note the target holds no credit for fails after SliceTimeout, which
// is short, but not so short that a slice of the 4 MiB submissions on an
// emulated rxe hits it.
func TestNotifyConformance(t *testing.T) {
	topo := srenv.Require(t)
	cfg := rdma.Config{NotifyDepth: 2, QPsPerPath: 2, SliceTimeout: 10 * time.Second}
	transporttest.RunNotify(t, factory(names(topo.HostA), cfg), transporttest.Options{
		Target:     factory(names(topo.HostB), cfg),
		NotifyHeld: cfg.NotifyDepth * cfg.QPsPerPath * len(topo.HostA),
		Timeout:    60 * time.Second,
	})
}
