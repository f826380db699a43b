package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rdmago/te/engine/enginetest"
	"reflect"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/segment/p2p"
)

// TestNotify runs the notification cases over shm: notes follow the
// copies, failures are not notified, the target's bounds hold, a
// restarted sender's notes are dropped.
func TestNotify(t *testing.T) {
	transporttest.RunNotify(t, func(testing.TB) engine.Transport {
		return New(Config{IOTimeout: time.Second})
	}, transporttest.Options{Shared: true, NotifyHeld: noteSlots})
}

// BenchmarkNotify: as tcp's.
func BenchmarkNotify(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotify(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}

// BenchmarkNotifyStream: throughput of streams of batches with a
// notification each against plain ones (transporttest.BenchNotifyStream),
// both engines in this process; BenchmarkNotifyStreamRemote with the
// target in a child process.
func BenchmarkNotifyStream(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotifyStream(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}

func BenchmarkNotifyStreamRemote(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotifyStreamRemote(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}

// BenchmarkNotifyRemote is BenchmarkNotify with the target in a child
// process, as deployed: its application's wake-ups run there, not among
// the initiator's goroutines.
func BenchmarkNotifyRemote(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotifyRemote(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{Shared: true}, c.tasks, c.size)
		})
	}
}

// TestNotifyCancel: a batch cancelled while its copies run: the copies
// not begun are skipped (their tasks end CANCELED) and its notification is
// never delivered; a batch whose copies all ran completes and is notified.
func TestNotifyCancel(t *testing.T) {
	ini, tgt, _, _, seg := inProcessPair(t, 64<<20, Config{Copiers: 1})
	base := engine.AddrOf(tgt.Mem.Bytes())
	reqs := make([]engine.Request, 1024)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i<<16 : (i+1)<<16], Target: seg, TargetAddr: base + uint64(i<<16)}
	}
	ctx := ctxT(t, 30*time.Second)
	cancelled := 0
	for round := 0; round < 40 && cancelled == 0; round++ {
		b, _ := ini.Engine.AllocateBatch(len(reqs))
		// Cancel lands at some point of the copies (64 MiB of them).
		tm := time.AfterFunc(time.Duration(round%8)*200*time.Microsecond, func() { ini.Engine.Cancel(b) })
		err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: fmt.Sprint(round)})
		if errors.Is(err, engine.ErrCanceled) {
			// Cancelled before it was submitted: nothing to see.
			tm.Stop()
			ini.Engine.FreeBatch(b)
			continue
		}
		if err == nil {
			err = ini.Engine.Wait(ctx, b)
		}
		tm.Stop()
		got := tgt.Engine.DrainNotifications(nil)
		if err == nil {
			// Wait returned once the note was in the target's ring.
			eventually(t, 10*time.Second, "the notification", func() bool {
				got = tgt.Engine.DrainNotifications(got)
				return len(got) > 0
			})
		}
		switch {
		case err == nil:
			if len(got) != 1 || got[0].Name != fmt.Sprint(round) {
				t.Fatalf("round %d completed, notifications %+v", round, got)
			}
		case errors.Is(err, engine.ErrCanceled):
			cancelled++
			if len(got) != 0 {
				t.Fatalf("round %d cancelled, yet notified: %+v", round, got)
			}
			n := 0
			for i := range reqs {
				if s, _ := ini.Engine.Status(b, i); s.State == engine.StateCanceled {
					n++
				} else if s.State != engine.StateCompleted {
					t.Fatalf("task %d: %+v", i, s)
				}
			}
			if n == 0 {
				t.Fatal("a cancelled batch without a cancelled task")
			}
		default:
			t.Fatalf("round %d: %v", round, err)
		}
		ini.Engine.FreeBatch(b)
	}
	if cancelled == 0 {
		t.Fatal("no round was cancelled in time: the test proved nothing")
	}
}

// childNoteAllocs is TestNotifyAllocs's initiator: it opens the segment
// target over shm, warms up, and prints "allocs N": the allocations per
// batch of 128 × 4 KiB WRITEs with a notification (submit, wait, free)
// plus a notification alone.
func childNoteAllocs(target string) error {
	ctx := context.Background()
	// childNode's store polls every 20 ms, allocating as it does: this
	// one does not poll while the allocations are counted.
	st, err := p2p.New(ctx, p2p.Options{Listen: "127.0.0.1:0", PollInterval: time.Hour})
	if err != nil {
		return err
	}
	defer st.Close()
	e, err := engine.New(engine.Config{Name: st.Name(), Store: st})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.Install(New(Config{})); err != nil {
		return err
	}
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		return err
	}
	defer mem.Close()
	if err := e.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		return err
	}
	seg, err := e.OpenSegment(ctx, target, &engine.OpenOptions{Transport: "shm"})
	if err != nil {
		return err
	}
	d, err := e.SegmentDescriptor(seg)
	if err != nil {
		return err
	}
	reqs := make([]engine.Request, 128)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: mem.Bytes()[i*4096 : (i+1)*4096], Target: seg, TargetAddr: d.Buffers[0].Addr + uint64(i*4096)}
	}
	msg := make([]byte, 512)
	var failed error
	run := func() {
		b, err := e.AllocateBatch(len(reqs))
		if err == nil {
			err = e.SubmitNotify(b, reqs, engine.Notify{Name: "layer", Msg: msg})
		}
		if err == nil {
			err = e.Wait(ctx, b)
		}
		if err == nil {
			err = e.FreeBatch(b)
		}
		if err == nil {
			err = e.Notify(ctx, seg, engine.Notify{Name: "alone", Msg: msg})
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	for range 10 {
		run()
	}
	a := enginetest.AllocsPerRun(50, run)
	if failed != nil {
		return failed
	}
	fmt.Printf("allocs %v\n", a)
	return nil
}

// TestNotifyAllocs: over shm, a notified batch and a notification alone
// allocate nothing in the initiator's process once warm. The initiator
// runs in a child process (the target here allocates each notification it
// hands to its application).
func TestNotifyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	e, _, _ := target(t, 1<<20, Config{})
	go func() {
		for range e.Notifications() {
		}
	}()
	c := startChild(t, "", "noteallocs", e.Name(), nil)
	if l := c.expect(t, "allocs "); l != "allocs 0" {
		t.Fatalf("initiator: %s per notified batch", l)
	}
	// The last notes may still be on their way from the ring.
	eventually(t, 10*time.Second, "every notification accepted", func() bool { return e.NotifyStats().Accepted >= 2*60 })
}

// onlyPeer returns the initiator's one connection.
func onlyPeer(t *testing.T, tr *Transport) *peer {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.peers) != 1 {
		t.Fatalf("%d peers, want 1", len(tr.peers))
	}
	for p := range tr.peers {
		return p
	}
	return nil
}

// TestNotifyHostileRing: an initiator that writes a head beyond the
// ring's slots, or a slot beyond the notification bounds, is
// disconnected; nothing of it is delivered, and the target serves the
// next initiator.
func TestNotifyHostileRing(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	ctx := ctxT(t, 10*time.Second)
	ttr := New(Config{IOTimeout: time.Second})
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 0, ttr)
	for i, bad := range []string{"head", "slot", ""} {
		itr := New(Config{})
		ini := enginetest.NewNode(t, engine.Config{Name: fmt.Sprint("initiator ", i), Store: st}, 0, itr)
		seg, err := ini.Engine.OpenSegment(ctx, "target", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: fmt.Sprint("good ", i)}); err != nil {
			t.Fatal(err)
		}
		if bad == "" {
			break
		}
		eventually(t, 5*time.Second, bad+": the good note", func() bool { return tgt.Engine.NotifyStats().Accepted == uint64(i+1) })
		p := onlyPeer(t, itr)
		p.noteMu.Lock()
		switch bad {
		case "head":
			p.ring.head.Store(p.head + noteSlots + 1)
		case "slot":
			s := &p.ring.slots[p.head%noteSlots]
			s.nameLen, s.msgLen = 1, engine.MaxNotifyMsg+1
			p.ring.head.Store(p.head + 1)
		}
		p.noteMu.Unlock()
		p.ringBell()
		eventually(t, 5*time.Second, bad+": the target drops the connection", func() bool { return ttr.Stats().Served == 0 })
		eventually(t, 5*time.Second, bad+": the initiator sees it", func() bool { return itr.Stats().Peers == 0 })
		ini.Engine.Close()
	}
	var got []string
	eventually(t, 5*time.Second, "every good note", func() bool {
		for _, n := range tgt.Engine.DrainNotifications(nil) {
			got = append(got, n.Name)
		}
		return len(got) >= 3
	})
	time.Sleep(10 * time.Millisecond)
	for _, n := range tgt.Engine.DrainNotifications(nil) {
		got = append(got, n.Name)
	}
	if fmt.Sprint(got) != "[good 0 good 1 good 2]" {
		t.Fatalf("delivered %v", got)
	}
}

// TestNotifyLost: a note whose batch succeeded but which the target then
// refuses (it has seen a newer engine under the sender's name since) is
// reported to its sender's process: NOTELOST, counted in
// Stats.NotesLost and logged.
func TestNotifyLost(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	ctx := ctxT(t, 10*time.Second)
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 0, New(Config{}))
	itr := New(Config{})
	ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 0, itr)
	seg, err := ini.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the first note", func() bool { return tgt.Engine.NotifyStats().Accepted == 1 })
	// Another engine under the same name: the target takes it for a
	// restart of the sender.
	twin := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 0, New(Config{}))
	tseg, err := twin.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := twin.Engine.Notify(ctx, tseg, engine.Notify{Name: "twin"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the twin's note", func() bool { return tgt.Engine.NotifyStats().Accepted == 2 })
	if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: "late"}); err != nil {
		t.Fatalf("the note completes once in the ring: %v", err)
	}
	eventually(t, 5*time.Second, "the sender hears of the lost note", func() bool { return itr.Stats().NotesLost == 1 })
	if s := tgt.Engine.NotifyStats(); s.Stale < 2 {
		t.Fatalf("target: %+v, want the first note and the late one stale", s)
	}
	for _, n := range tgt.Engine.DrainNotifications(nil) {
		if n.Name != "twin" {
			t.Fatalf("delivered %q", n.Name)
		}
	}
}

// TestRingLayout: ringSize is noteRing's size, and the ring fits the
// control memory after the page.
func TestRingLayout(t *testing.T) {
	if got := reflect.TypeFor[noteRing]().Size(); got != ringSize {
		t.Fatalf("noteRing is %d bytes, ringSize says %d", got, ringSize)
	}
	if got := reflect.TypeFor[noteSlot]().Size(); got != noteSlotSize {
		t.Fatalf("noteSlot is %d bytes, noteSlotSize says %d", got, noteSlotSize)
	}
	if ringOff < int(reflect.TypeFor[ctlPage]().Size()) || ringOff+ringLen != ctlSize {
		t.Fatalf("ring at %d+%d in %d bytes of control memory", ringOff, ringLen, ctlSize)
	}
}

// napPair is an in-process pair whose target's reader naps for nap after
// a note (noteNap, restored after the engines' cleanups: their readers
// read it), with one note ("first") sent; it returns the initiator's
// peer, whose ring the target's reader watches.
func napPair(t *testing.T, nap time.Duration) (ini, tgt *enginetest.Node, ttr *Transport, seg engine.SegmentID, p *peer, ctx context.Context) {
	t.Helper()
	d := noteNap
	t.Cleanup(func() { noteNap = d })
	noteNap = nap
	ini, tgt, itr, ttr, seg := inProcessPair(t, 1<<20, Config{IOTimeout: 5 * time.Second})
	ctx = ctxT(t, 60*time.Second)
	if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: "first"}); err != nil {
		t.Fatal(err)
	}
	return ini, tgt, ttr, seg, onlyPeer(t, itr), ctx
}

// TestNotifyNap: after a note the target's reader sleeps on the ring's
// futex; the next note wakes it, so does a MAPREQ (a region registered
// since), and so does the target closing, each long before the nap would
// end (noteNap is an hour here).
func TestNotifyNap(t *testing.T) {
	ini, tgt, ttr, seg, p, ctx := napPair(t, time.Hour)
	ring := p.ring
	napping := func(what string) {
		t.Helper()
		eventually(t, 10*time.Second, what+": the reader naps on the futex", func() bool { return ring.sleep.Load() == sleepFutex })
	}
	var got []string
	take := func(want int) {
		t.Helper()
		eventually(t, 10*time.Second, fmt.Sprint(want, " notes"), func() bool {
			for _, n := range tgt.Engine.DrainNotifications(nil) {
				got = append(got, n.Name)
			}
			return len(got) >= want
		})
	}
	take(1)
	for i := range 3 {
		napping(fmt.Sprint("note ", i))
		if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		take(i + 2)
	}
	if fmt.Sprint(got) != "[first 0 1 2]" {
		t.Fatalf("delivered %v", got)
	}

	// A region registered after the connection: the initiator's first
	// write into it asks for it (MAPREQ) while the reader naps.
	mem, err := engine.AllocShared(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	napping("MAPREQ")
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	src := ini.Mem.Bytes()[:1<<16]
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	eventually(t, 20*time.Second, "a write into the new region", func() bool {
		b, _ := ini.Engine.AllocateBatch(1)
		defer ini.Engine.FreeBatch(b)
		err := ini.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: src, Target: seg, TargetAddr: engine.AddrOf(mem.Bytes())}})
		if err == nil {
			err = ini.Engine.Wait(ctx, b)
		}
		return err == nil
	})
	if !bytes.Equal(mem.Bytes(), src) {
		t.Fatal("the new region does not hold the bytes written")
	}
	if s := ttr.Stats(); s.Served != 1 {
		t.Fatalf("target serves %d connections, want the one", s.Served)
	}

	// The target closes while its reader naps: Close returns.
	if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: "last"}); err != nil {
		t.Fatal(err)
	}
	take(5)
	napping("Close")
	closed := make(chan error, 1)
	go func() { closed <- tgt.Engine.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the target's Close did not return within 20s while its reader napped")
	}
}

// TestNotifyNapUnannounced: an initiator that knows no futex (an older
// te) publishes a note without waking a napping reader; the reader takes
// it when its nap ends.
func TestNotifyNapUnannounced(t *testing.T) {
	_, tgt, _, _, p, _ := napPair(t, 50*time.Millisecond)
	ring := p.ring
	eventually(t, 10*time.Second, "the reader naps on the futex", func() bool { return ring.sleep.Load() == sleepFutex })
	// As an older initiator publishes: slot, then head, and no wake
	// (it clears only sleepSocket).
	p.noteMu.Lock()
	s := &ring.slots[p.head%noteSlots]
	s.id, s.bytes, s.msgLen = 1<<40, 0, 0
	s.nameLen = uint32(copy(s.data[:], "unannounced"))
	p.head++
	ring.head.Store(p.head)
	p.noteMu.Unlock()
	var got []string
	eventually(t, 10*time.Second, "both notes", func() bool {
		for _, n := range tgt.Engine.DrainNotifications(nil) {
			got = append(got, n.Name)
		}
		return len(got) >= 2
	})
	if fmt.Sprint(got) != "[first unannounced]" {
		t.Fatalf("delivered %v", got)
	}
}
