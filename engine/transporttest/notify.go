package transporttest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// RunNotify runs the notification cases (engine.SubmitNotify over a
// driver.Notifier) with both engines in this process:
//
//   - AfterData: concurrent submitters, submissions of 1 to 4096 tasks;
//     the target checks every byte of a submission the moment its
//     notification arrives; each completed submission is notified once,
//     with the sender's name and epoch and the byte count.
//   - FailedBatch: a submission with a request the target refuses (its
//     descriptor, as the initiator sees it, names memory the target does
//     not have) fails, and its notification never arrives.
//   - Flood: a target that does not drain holds its per-sender and total
//     bounds, plus at most Options.NotifyHeld notes per sender in the
//     transport's custody; the notes beyond fail at their senders with
//     engine.ErrNotifyFull; every note that succeeded arrives once the
//     target drains, and then notes flow again.
//   - Restart: a sender restarted under the same name replaces its old
//     incarnation: the old one's notes are dropped, whether queued
//     already or arriving late.
//   - CloseAfterWait: a sender that closes as soon as its notified batch
//     completed: the note still arrives (the target has custody).
//
// A refused note waits up to the transport's bound on waiting for the
// target (tcp and shm: half the I/O timeout; rdma: its slice timeout), so
// f should configure a short one (a second). At most one Options may be
// given (Shared, Target and NotifyHeld are honoured).
func RunNotify(t *testing.T, f Factory, opts ...Options) {
	var o Options
	if len(opts) > 1 {
		t.Fatal("transporttest: more than one Options")
	} else if len(opts) == 1 {
		o = opts[0]
	}
	o = o.withDefaults()
	t.Run("AfterData", func(t *testing.T) { testNotifyAfterData(t, f, o) })
	t.Run("FailedBatch", func(t *testing.T) { testNotifyFailed(t, f, o) })
	t.Run("Flood", func(t *testing.T) { testNotifyFlood(t, f, o) })
	t.Run("Restart", func(t *testing.T) { testNotifyRestart(t, f, o) })
	t.Run("CloseAfterWait", func(t *testing.T) { testNotifyCloseAfterWait(t, f, o) })
}

// eventually polls cond every few milliseconds until it holds or d has
// passed, and reports whether it held. A transport whose target has
// custody of a note completes it before the target's engine queued it.
func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

// targetOr is the target's factory: Target, or f.
func (o Options) targetOr(f Factory) Factory {
	if o.Target != nil {
		return o.Target
	}
	return f
}

// notifyNode starts an engine with a fresh transport and size bytes of
// registered memory.
func notifyNode(t *testing.T, f Factory, o Options, st segment.Store, cfg engine.Config, size int) *enginetest.Node {
	t.Helper()
	cfg.Store = st
	n := enginetest.NewNode(t, cfg, 0, f(t))
	mem, err := o.alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Engine.Close()
		mem.Close()
	})
	if err := n.Engine.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	n.Mem = mem
	return n
}

func openSeg(t *testing.T, e *engine.Engine, name string) engine.SegmentID {
	t.Helper()
	seg, err := e.OpenSegment(ctxFor(t, 10*time.Second), name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return seg
}

// noteInfo is what AfterData's notes carry: whose, which round, the
// pattern's seed and where the bytes went (offset in the target's
// buffer).
type noteInfo struct {
	who, round, seed, off, n uint64
}

func (m noteInfo) bytes() []byte {
	b := make([]byte, 40)
	for i, v := range []uint64{m.who, m.round, m.seed, m.off, m.n} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

func parseNoteInfo(b []byte) (m noteInfo, ok bool) {
	if len(b) != 40 {
		return m, false
	}
	v := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	return noteInfo{v(0), v(1), v(2), v(3), v(4)}, true
}

func testNotifyAfterData(t *testing.T, f Factory, o Options) {
	const (
		submitters = 4
		region     = 4 << 20
	)
	shapes := []struct{ tasks, size int }{{1, 64}, {7, 4096}, {300, 1024}, {4096, 64}, {4096, 1024}, {16, 256 << 10}}
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := notifyNode(t, o.targetOr(f), o, st, engine.Config{Name: "target"}, submitters*region)
	ini := notifyNode(t, f, o, st, engine.Config{Name: "initiator"}, submitters*region)
	seg := openSeg(t, ini.Engine, "target")
	base := engine.AddrOf(tgt.Mem.Bytes())

	acks := make([]chan error, submitters)
	for i := range acks {
		acks[i] = make(chan error, 1)
	}
	seen := map[[2]uint64]int{}
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for n := range tgt.Engine.Notifications() {
			m, ok := parseNoteInfo(n.Msg)
			var err error
			switch {
			case !ok || m.who >= submitters:
				err = fmt.Errorf("notification %q: not one of the test's", n.Name)
			case n.From != "initiator" || n.FromEpoch != ini.Engine.Epoch() || n.Name != "kv":
				err = fmt.Errorf("notification from %s epoch %#x named %q, want initiator %#x kv", n.From, n.FromEpoch, n.Name, ini.Engine.Epoch())
			case n.Bytes != m.n:
				err = fmt.Errorf("notification for %d bytes, the submission had %d", n.Bytes, m.n)
			default:
				if cerr := CheckPattern(tgt.Mem.Bytes()[m.off:m.off+m.n], m.seed, 0); cerr != nil {
					err = fmt.Errorf("notified before the data landed: %w", cerr)
				}
			}
			if ok {
				seen[[2]uint64{m.who, m.round}]++
				if c := seen[[2]uint64{m.who, m.round}]; c > 1 && err == nil {
					err = fmt.Errorf("submitter %d round %d notified %d times", m.who, m.round, c)
				}
			}
			if ok && m.who < submitters {
				acks[m.who] <- err
			} else {
				t.Error(err)
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range submitters {
		wg.Go(func() {
			reqs := make([]engine.Request, 4096)
			for r := range shapes {
				sh := shapes[(r+w)%len(shapes)]
				off := uint64(w * region)
				n := uint64(sh.tasks * sh.size)
				seed := uint64(w)<<32 | uint64(r)<<8 | 0xa5
				Pattern(ini.Mem.Bytes()[off:off+n], seed, 0)
				for i := range sh.tasks {
					p := off + uint64(i*sh.size)
					reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[p : p+uint64(sh.size)], Target: seg, TargetAddr: base + p}
				}
				b, err := ini.Engine.AllocateBatch(sh.tasks)
				if err == nil {
					err = ini.Engine.SubmitNotify(b, reqs[:sh.tasks], engine.Notify{Name: "kv", Msg: noteInfo{uint64(w), uint64(r), seed, off, n}.bytes()})
					if err == nil {
						err = ini.Engine.Wait(ctxFor(t, o.Timeout), b)
					}
					if ferr := ini.Engine.FreeBatch(b); err == nil {
						err = ferr
					}
				}
				if err == nil {
					// The note is queued once Wait succeeds; the checker
					// is done with the range before it is written again.
					select {
					case err = <-acks[w]:
					case <-time.After(o.Timeout):
						err = errors.New("no notification after the batch completed")
					}
				}
				if err != nil {
					t.Errorf("submitter %d round %d (%d × %d B): %v", w, r, sh.tasks, sh.size, err)
					return
				}
			}
		})
	}
	wg.Wait()
	tgt.Engine.Close()
	<-checked
	if !t.Failed() && len(seen) != submitters*len(shapes) {
		t.Fatalf("%d submissions notified, want %d", len(seen), submitters*len(shapes))
	}
}

func testNotifyFailed(t *testing.T, f Factory, o Options) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := notifyNode(t, o.targetOr(f), o, st, engine.Config{Name: "target"}, 1<<20)
	ini := notifyNode(t, f, o, st, engine.Config{Name: "initiator"}, 1<<20)
	seg := openSeg(t, ini.Engine, "target")
	base := engine.AddrOf(tgt.Mem.Bytes())
	// The initiator learns of a buffer the target does not have.
	d, err := ini.Engine.SegmentDescriptor(seg)
	if err != nil {
		t.Fatal(err)
	}
	ghost := base + 1<<30
	d.Buffers = append(d.Buffers, segment.Buffer{Addr: ghost, Length: 1 << 16, Location: "cpu:0"})
	// A transport whose part names keys per buffer gets the first
	// buffer's for it: keys of memory that does not hold the range.
	d.Protocols = slices.Clone(d.Protocols)
	for i, p := range d.Protocols {
		if r := p.RDMA; r != nil && len(r.RKeys) > 0 {
			c := *r
			c.RKeys = append(slices.Clone(r.RKeys), r.RKeys[0])
			d.Protocols[i].RDMA = &c
		}
	}
	d.Version++
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if cur, _ := ini.Engine.SegmentDescriptor(seg); cur != nil && len(cur.Buffers) == len(d.Buffers) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the initiator did not see the new descriptor within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reqs := make([]engine.Request, 9)
	for i := range 8 {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*4096 : (i+1)*4096], Target: seg, TargetAddr: base + uint64(i*4096)}
	}
	reqs[8] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: ghost}
	ctx := ctxFor(t, o.Timeout)
	for _, order := range []string{"refused last", "refused first"} {
		b, _ := ini.Engine.AllocateBatch(len(reqs))
		err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: order})
		if err == nil {
			err = ini.Engine.Wait(ctx, b)
		}
		if err == nil {
			t.Fatalf("%s: a batch with a refused request completed", order)
		}
		ini.Engine.FreeBatch(b)
		// Wait covers the note: the target has decided on it.
		if got := tgt.Engine.DrainNotifications(nil); len(got) != 0 {
			t.Fatalf("%s: notification for a failed batch: %+v", order, got)
		}
		reqs[0], reqs[8] = reqs[8], reqs[0]
	}
	// The same target still notifies a good batch.
	b, _ := ini.Engine.AllocateBatch(8)
	err = ini.Engine.SubmitNotify(b, reqs[:8], engine.Notify{Name: "good"})
	if err == nil {
		err = ini.Engine.Wait(ctx, b)
	}
	ini.Engine.FreeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	// The failed batches' notes would have come before this one.
	var got []engine.Notification
	eventually(o.Timeout, func() bool {
		got = tgt.Engine.DrainNotifications(got)
		return len(got) > 0
	})
	time.Sleep(20 * time.Millisecond)
	if got = tgt.Engine.DrainNotifications(got); len(got) != 1 || got[0].Name != "good" || got[0].Bytes != 8*4096 {
		t.Fatalf("good batch: %+v", got)
	}
}

func testNotifyFlood(t *testing.T, f Factory, o Options) {
	const per, total = 4, 6
	held := o.NotifyHeld
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := notifyNode(t, o.targetOr(f), o, st, engine.Config{Name: "target", NotifyQueue: total, NotifyQueuePerSender: per}, 1<<16)
	flood := func(name string, count int) (ok, full int) {
		n := notifyNode(t, f, o, st, engine.Config{Name: name}, 1<<16)
		seg := openSeg(t, n.Engine, "target")
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range count {
			wg.Go(func() {
				err := n.Engine.Notify(ctxFor(t, o.Timeout), seg, engine.Notify{Name: fmt.Sprint(i), Msg: make([]byte, engine.MaxNotifyMsg)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, engine.ErrNotifyFull):
					full++
				default:
					t.Errorf("%s: notify %d: %v", name, i, err)
				}
			})
		}
		wg.Wait()
		return ok, full
	}
	queued := func(want int) {
		t.Helper()
		var s engine.NotifyStats
		if !eventually(o.Timeout, func() bool { s = tgt.Engine.NotifyStats(); return s.Queued >= want }) || s.Queued != want {
			t.Fatalf("queued %d, want %d (%+v)", s.Queued, want, s)
		}
	}
	// Sender a: its bound, what the transport holds, and as many more.
	okA, fullA := flood("a", 2*per+held)
	if okA < per || okA > per+held || fullA < per {
		t.Fatalf("sender a: %d accepted, %d refused as full; want %d to %d accepted, at least %d refused", okA, fullA, per, per+held, per)
	}
	queued(per)
	// Sender b finds room for total-per.
	okB, fullB := flood("b", per+held)
	if okB < total-per || okB > total-per+held || fullB < per-(total-per) {
		t.Fatalf("sender b: %d accepted, %d refused; want %d to %d accepted, at least %d refused", okB, fullB, total-per, total-per+held, per-(total-per))
	}
	queued(total)
	// Every note that succeeded arrives as the target drains; the queue
	// never holds more than its bound.
	got := 0
	drained := eventually(o.Timeout, func() bool {
		if s := tgt.Engine.NotifyStats(); s.Queued > total {
			t.Fatalf("queued %d, bound %d (%+v)", s.Queued, total, s)
		}
		got += len(tgt.Engine.DrainNotifications(nil))
		return got >= okA+okB
	})
	time.Sleep(20 * time.Millisecond)
	got += len(tgt.Engine.DrainNotifications(nil))
	if !drained || got != okA+okB {
		t.Fatalf("drained %d notifications, %d succeeded at their senders", got, okA+okB)
	}
	if ok, full := flood("c", per); ok != per || full != 0 {
		t.Fatalf("after a drain: %d queued, %d refused", ok, full)
	}
}

func testNotifyRestart(t *testing.T, f Factory, o Options) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := notifyNode(t, o.targetOr(f), o, st, engine.Config{Name: "target"}, 1<<16)
	notify := func(n *enginetest.Node, name string) {
		t.Helper()
		seg := openSeg(t, n.Engine, "target")
		if err := n.Engine.Notify(ctxFor(t, o.Timeout), seg, engine.Notify{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	old := notifyNode(t, f, o, st, engine.Config{Name: "sender"}, 1<<16)
	for i := range 3 {
		notify(old, fmt.Sprint("old ", i))
	}
	old.Engine.Close()
	restarted := notifyNode(t, f, o, st, engine.Config{Name: "sender"}, 1<<16)
	notify(restarted, "new")
	// The old notes were queued and then dropped when "new" came, or
	// arrive after it and are refused: stale either way.
	var s engine.NotifyStats
	if !eventually(o.Timeout, func() bool { s = tgt.Engine.NotifyStats(); return s.Stale >= 3 && s.Queued >= 1 }) {
		t.Fatalf("after the sender restarted: %+v, want 3 stale and the new one queued", s)
	}
	time.Sleep(20 * time.Millisecond)
	got := tgt.Engine.DrainNotifications(nil)
	if len(got) != 1 || got[0].Name != "new" || got[0].FromEpoch != restarted.Engine.Epoch() {
		t.Fatalf("after the sender restarted: %+v", got)
	}
	if s := tgt.Engine.NotifyStats(); s.Stale != 3 {
		t.Fatalf("%d stale notes dropped, want 3", s.Stale)
	}
}

func testNotifyCloseAfterWait(t *testing.T, f Factory, o Options) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := notifyNode(t, o.targetOr(f), o, st, engine.Config{Name: "target"}, 1<<16)
	base := engine.AddrOf(tgt.Mem.Bytes())
	for i := range 5 {
		ini := notifyNode(t, f, o, st, engine.Config{Name: fmt.Sprint("sender ", i)}, 1<<16)
		seg := openSeg(t, ini.Engine, "target")
		Pattern(ini.Mem.Bytes()[:4096], uint64(i), 0)
		b, err := ini.Engine.AllocateBatch(1)
		if err == nil {
			err = ini.Engine.SubmitNotify(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: base}}, engine.Notify{Name: "last"})
		}
		if err == nil {
			err = ini.Engine.Wait(ctxFor(t, o.Timeout), b)
		}
		if err != nil {
			t.Fatal(err)
		}
		ini.Engine.Close()
		var got []engine.Notification
		if !eventually(o.Timeout, func() bool { got = tgt.Engine.DrainNotifications(got); return len(got) > 0 }) {
			t.Fatalf("sender %d closed after its batch completed: its notification never arrived", i)
		}
		if len(got) != 1 || got[0].From != fmt.Sprint("sender ", i) || got[0].Name != "last" {
			t.Fatalf("sender %d: %+v", i, got)
		}
		if err := CheckPattern(tgt.Mem.Bytes()[:4096], uint64(i), 0); err != nil {
			t.Fatalf("sender %d: notified before its data: %v", i, err)
		}
	}
}

// notifyPair makes a target and an initiator engine in this process over
// fresh transports from f, each with n bytes of registered memory, and
// opens the target's segment on the initiator.
func notifyPair(b *testing.B, f Factory, o Options, n int) (tgt, ini *enginetest.Node, seg engine.SegmentID) {
	st := enginetest.NewMemStore()
	b.Cleanup(func() { st.Close() })
	node := func(name string) *enginetest.Node {
		nd := enginetest.NewNode(b, engine.Config{Name: name, Store: st}, 0, f(b))
		mem, err := o.alloc(n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			nd.Engine.Close()
			mem.Close()
		})
		if err := nd.Engine.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
			b.Fatal(err)
		}
		nd.Mem = mem
		return nd
	}
	tgt, ini = node("target"), node("initiator")
	seg, err := ini.Engine.OpenSegment(context.Background(), "target", nil)
	if err != nil {
		b.Fatal(err)
	}
	return tgt, ini, seg
}

// BenchNotify measures, with both engines in this process over fresh
// transports from f, batches of tasks WRITEs of size bytes, side by side
// in one run: plain batches and batches with a notification take turns.
// It reports the initiator's completion latency (submit to Wait
// returning) of each, the latency from submit to the target's application
// receiving the notification, and the throughput of notified batches
// relative to plain ones: notify/plain is the median, over each plain
// batch and the notified one after it, of the plain one's time over the
// notified one's (a CPU taken away for milliseconds, as on a busy
// machine, moves it little); notify/plain-sum divides the total times.
// Each notified batch's notification has arrived before the next batch
// starts, outside the times.
func BenchNotify(b *testing.B, f Factory, o Options, tasks, size int) {
	tgt, ini, seg := notifyPair(b, f, o, tasks*size)
	// The target's application: the time each notification arrives.
	arrived := make(chan time.Time, 1)
	go receiveNotes(tgt.Engine, func(n int) {
		for range n {
			arrived <- time.Now()
		}
	})
	benchNotify(b, ini, seg, engine.AddrOf(tgt.Mem.Bytes()), tasks, size, func(notified bool) time.Time {
		if !notified {
			return time.Time{}
		}
		return <-arrived
	})
}

// BenchNotifyRemote is BenchNotify with the target engine in a child
// process (StartRemoteTarget: the package's TestMain calls
// ServeTargetIfChild), as deployed: the target's application, woken by
// each notification, runs in its own process, not among the initiator's
// goroutines. The child counts the notifications it receives in memory
// after the batches' target range (and the wall-clock time of the last
// one's arrival), and after every batch, plain or notified, the initiator
// READs that counter until it has each notification sent so far: as in
// BenchNotify, the target's delivery is outside the times, and every
// batch starts with the notifications before it delivered.
func BenchNotifyRemote(b *testing.B, f Factory, o Options, tasks, size int) {
	ini, seg, base, arrived := remoteNotified(b, f, o, tasks*size)
	var sent uint64
	benchNotify(b, ini, seg, base, tasks, size, func(notified bool) time.Time {
		if notified {
			sent++
		}
		return arrived(sent, 0)
	})
}

// remoteNotified starts a target in a child process and an initiator here
// with n bytes of memory each (and the counter after them), opens the
// target's segment, and has the child count the notifications it
// receives. arrived READs the counter until it has sent notifications,
// pausing between looks when pause > 0, and returns the last one's
// arrival.
func remoteNotified(b *testing.B, f Factory, o Options, n int) (ini *enginetest.Node, seg engine.SegmentID, base uint64, arrived func(sent uint64, pause time.Duration) time.Time) {
	tgt := StartRemoteTarget(b, o, n+noteCounterLen, "")
	ini = Initiator(b, o, nil, n+noteCounterLen, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	seg, err := ini.Engine.OpenSegment(ctx, tgt.Name(), nil)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	counter := tgt.Base() + uint64(n)
	if _, err := tgt.do("countnotes %#x", counter); err != nil {
		b.Fatal(err)
	}
	local := ini.Mem.Bytes()[n : n+noteCounterLen]
	read := []engine.Request{{Op: engine.Read, Local: local, Target: seg, TargetAddr: counter}}
	return ini, seg, tgt.Base(), func(sent uint64, pause time.Duration) time.Time {
		for {
			if err := ini.Engine.Transfer(context.Background(), read); err != nil {
				b.Fatal(err)
			}
			if got := binary.LittleEndian.Uint64(local[8:]); got > sent {
				b.Fatalf("target counted %d notifications of %d sent", got, sent)
			} else if got == sent {
				return time.Unix(0, int64(binary.LittleEndian.Uint64(local)))
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	}
}

// BenchNotifyStream measures throughput: streams of batches of tasks
// WRITEs of size bytes back to back, plain ones and ones with a
// notification each, with both engines in this process over fresh
// transports from f. The target's application takes the notifications
// as they come, each run of them in one ReceiveNotifications (the
// channel's one at a time with EnvNotifyRecv=channel); the two kinds of
// stream take turns, a few milliseconds each (notifyStreamBytes), and a
// notified stream's time runs to the later of its last batch's
// completion and its last notification's arrival (a note that waits at
// the initiator for room at the target is in its batch's time). It
// reports each kind's time per batch and
// notify/plain-stream, the notified streams' throughput relative to the
// plain ones'. Where BenchNotify's notify/plain is the cost of a note in
// one batch's latency, with the target idle between batches, this is
// what a sender of a notification per batch gets through.
func BenchNotifyStream(b *testing.B, f Factory, o Options, tasks, size int) {
	tgt, ini, seg := notifyPair(b, f, o, tasks*size)
	// The target's application: the count of notifications and the
	// last one's arrival.
	var mu sync.Mutex
	var count uint64
	var at time.Time
	more := sync.NewCond(&mu)
	go receiveNotes(tgt.Engine, func(n int) {
		now := time.Now()
		mu.Lock()
		count += uint64(n)
		at = now
		more.Broadcast()
		mu.Unlock()
	})
	benchNotifyStream(b, ini, seg, engine.AddrOf(tgt.Mem.Bytes()), tasks, size, func(sent uint64) time.Time {
		mu.Lock()
		defer mu.Unlock()
		for count < sent {
			more.Wait()
		}
		if count > sent {
			b.Fatalf("target received %d notifications of %d sent", count, sent)
		}
		return at
	})
}

// BenchNotifyStreamRemote is BenchNotifyStream with the target engine in
// a child process, as deployed (see BenchNotifyRemote): the child counts
// the notifications and stamps the last one's arrival, and at the end of
// each notified stream the initiator READs the count until it has them
// all (the time between that and the next stream is in neither kind's).
func BenchNotifyStreamRemote(b *testing.B, f Factory, o Options, tasks, size int) {
	ini, seg, base, arrived := remoteNotified(b, f, o, tasks*size)
	benchNotifyStream(b, ini, seg, base, tasks, size, func(sent uint64) time.Time {
		// The arrival time is the child's stamp, so a late look costs
		// nothing timed, and looking in a loop would take the CPU the
		// child needs to catch up.
		return arrived(sent, 50*time.Microsecond)
	})
}

// notifyStreamBytes is about how much a stream of BenchNotifyStream moves
// before the other kind takes its turn (at least 4 batches and at most
// 4096): a few milliseconds, so that a turn's start and end are a small
// part of it, and many turns in a run.
const notifyStreamBytes = 64 << 20

// benchNotifyStream runs BenchNotifyStream's streams from ini to seg
// (target memory at base) and reports; last waits until the target has
// received sent notifications and returns the last one's arrival.
func benchNotifyStream(b *testing.B, ini *enginetest.Node, seg engine.SegmentID, base uint64, tasks, size int, last func(sent uint64) time.Time) {
	batch := notifyBatch(b, ini, seg, base, tasks, size)
	var sent uint64
	var plainTime, noteTime time.Duration
	var plainN, noteN int
	stream := func(notify bool, k int) {
		t0 := time.Now()
		for range k {
			batch(notify)
		}
		if !notify {
			plainTime += time.Since(t0)
			plainN += k
			return
		}
		sent += uint64(k)
		end := time.Now()
		if at := last(sent); at.After(end) {
			end = at
		}
		noteTime += end.Sub(t0)
		noteN += k
	}
	turn := min(max(notifyStreamBytes/(tasks*size), 4), 4096)
	stream(false, turn)
	stream(true, turn)
	plainTime, noteTime, plainN, noteN = 0, 0, 0, 0
	b.SetBytes(int64(tasks * size))
	b.ResetTimer()
	arm := os.Getenv(EnvNotifyArm)
	for i := 0; i < b.N; i += turn {
		k := min(turn, b.N-i)
		switch {
		case arm == "plain":
			stream(false, k)
		case arm == "notify":
			stream(true, k)
		default:
			stream(i/turn%2 == 1, k)
		}
	}
	b.StopTimer()
	per := func(d time.Duration, n int) float64 {
		if n == 0 {
			return 0
		}
		return d.Seconds() * 1e6 / float64(n)
	}
	b.ReportMetric(per(plainTime, plainN), "plain-us/batch")
	b.ReportMetric(per(noteTime, noteN), "notify-us/batch")
	if plainN > 0 && noteN > 0 {
		b.ReportMetric(per(plainTime, plainN)/per(noteTime, noteN), "notify/plain-stream")
	}
}

// EnvNotifyArm, set to "plain" or "notify", makes BenchNotify,
// BenchNotifyStream and their Remote forms run batches of that kind only
// (each arm's latency or throughput without the other's interleaved; no
// ratio is reported).
const EnvNotifyArm = "TE_TRANSPORTTEST_NOTIFY_ARM"

// EnvNotifyRecv, set to "channel", makes the notify benches' target
// application take notifications from Engine.Notifications' channel, one
// at a time, instead of ReceiveNotifications' runs.
const EnvNotifyRecv = "TE_TRANSPORTTEST_NOTIFY_RECV"

// receiveNotes is the notify benches' target application: it calls got
// with how many notifications arrived, as they arrive, until e closes.
func receiveNotes(e *engine.Engine, got func(n int)) {
	if os.Getenv(EnvNotifyRecv) == "channel" {
		for range e.Notifications() {
			got(1)
		}
		return
	}
	var run []engine.Notification
	for {
		var err error
		if run, err = e.ReceiveNotifications(context.Background(), run[:0]); err != nil {
			return
		}
		got(len(run))
	}
}

// noteCounterLen is the target memory of BenchNotifyRemote's counter: the
// last notification's arrival (Unix ns), then the count, little-endian.
const noteCounterLen = 64

// notifyBatch returns a function that runs one batch of the notify
// benches (tasks WRITEs of size bytes from ini's memory to seg at base,
// with a notification when notify) and returns when it was submitted and
// how long it took to complete.
func notifyBatch(b *testing.B, ini *enginetest.Node, seg engine.SegmentID, base uint64, tasks, size int) func(notify bool) (time.Time, time.Duration) {
	ctx := context.Background()
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*size : (i+1)*size], Target: seg, TargetAddr: base + uint64(i*size)}
	}
	msg := make([]byte, 64)
	return func(notify bool) (time.Time, time.Duration) {
		bid, err := ini.Engine.AllocateBatch(tasks)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if notify {
			err = ini.Engine.SubmitNotify(bid, reqs, engine.Notify{Name: "bench", Msg: msg})
		} else {
			err = ini.Engine.Submit(bid, reqs)
		}
		if err == nil {
			err = ini.Engine.Wait(ctx, bid)
		}
		done := time.Since(t0)
		if err == nil {
			err = ini.Engine.FreeBatch(bid)
		}
		if err != nil {
			b.Fatal(err)
		}
		return t0, done
	}
}

// benchNotify runs BenchNotify's batches from ini to seg (target memory at
// base) and reports; after each batch, outside the times, sync waits for
// the target and returns when a notified batch's notification arrived.
func benchNotify(b *testing.B, ini *enginetest.Node, seg engine.SegmentID, base uint64, tasks, size int, sync func(notified bool) time.Time) {
	batch := notifyBatch(b, ini, seg, base, tasks, size)
	var plainLat, noteLat, notifyLat []time.Duration
	var plainTime, noteTime time.Duration
	step := func(notify bool) {
		t0, done := batch(notify)
		at := sync(notify)
		if !notify {
			plainLat, plainTime = append(plainLat, done), plainTime+done
			return
		}
		noteLat, noteTime = append(noteLat, done), noteTime+done
		notifyLat = append(notifyLat, at.Sub(t0))
	}
	for range 20 {
		step(false)
		step(true)
	}
	plainLat, noteLat, notifyLat = plainLat[:0], noteLat[:0], notifyLat[:0]
	plainTime, noteTime = 0, 0
	b.SetBytes(int64(tasks * size))
	b.ResetTimer()
	arm := os.Getenv(EnvNotifyArm)
	for i := range b.N {
		switch arm {
		case "plain":
			step(false)
		case "notify":
			step(true)
		default:
			step(i%2 == 1)
		}
	}
	b.StopTimer()
	q := func(ds []time.Duration, p float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(p*float64(len(s))))]) / 1e3
	}
	b.ReportMetric(q(plainLat, 0.5), "plain-done-p50-us")
	b.ReportMetric(q(plainLat, 0.99), "plain-done-p99-us")
	b.ReportMetric(q(noteLat, 0.5), "notify-done-p50-us")
	b.ReportMetric(q(noteLat, 0.99), "notify-done-p99-us")
	b.ReportMetric(q(notifyLat, 0.5), "submit-to-note-p50-us")
	b.ReportMetric(q(notifyLat, 0.99), "submit-to-note-p99-us")
	if len(plainLat) > 0 && len(noteLat) > 0 && noteTime > 0 {
		plain := float64(len(plainLat)) / plainTime.Seconds()
		note := float64(len(noteLat)) / noteTime.Seconds()
		b.ReportMetric(note/plain, "notify/plain-sum")
		rs := make([]float64, min(len(plainLat), len(noteLat)))
		for i := range rs {
			rs[i] = float64(plainLat[i]) / float64(noteLat[i])
		}
		slices.Sort(rs)
		b.ReportMetric(rs[len(rs)/2], "notify/plain")
	}
}
