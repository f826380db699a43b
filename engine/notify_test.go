package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
)

// TestNotifyUnsupported: a notification over a transport that does not
// carry them fails before anything moves, with ErrNotifyUnsupported (also
// ErrNotSupported); an oversized one with ErrInvalidRequest.
func TestNotifyUnsupported(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<16, &fake{name: "fake"})
	ft := &fake{name: "fake"}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, ft)
	seg, err := ini.Engine.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := ini.Engine.AllocateBatch(4)
	defer ini.Engine.FreeBatch(b)
	req := []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes())}}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: "x"})
	if !errors.Is(err, engine.ErrNotifyUnsupported) || !errors.Is(err, engine.ErrNotSupported) {
		t.Fatalf("SubmitNotify over a transport without notifications: %v", err)
	}
	if n := ft.slices.Load(); n != 0 {
		t.Fatalf("%d slices started by a refused submission", n)
	}
	if err := ini.Engine.Notify(ctxT(t, time.Second), seg, engine.Notify{Name: "x"}); !errors.Is(err, engine.ErrNotifyUnsupported) {
		t.Fatalf("Notify alone: %v", err)
	}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: "x", Msg: make([]byte, engine.MaxNotifyMsg+1)})
	if !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("oversized message: %v", err)
	}
	err = ini.Engine.SubmitNotify(b, req, engine.Notify{Name: strings.Repeat("n", engine.MaxNotifyName+1)})
	if !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("oversized name: %v", err)
	}
	if err := ini.Engine.SubmitNotify(b, nil, engine.Notify{}); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("no requests: %v", err)
	}
	if st, _ := ini.Engine.BatchStatus(b); st.State != engine.StateCompleted || ft.slices.Load() != 0 {
		t.Fatalf("refused submissions left %v, %d slices", st, ft.slices.Load())
	}
}

// noteFake is a fake that carries notifications: it completes the slices
// (failing the one at failAt, when set), then the note with what outcome
// returns for its attempt, and records the attempts.
type noteFake struct {
	*fake
	failAt   int
	outcome  func(attempt int) error
	attempts []int
	bytes    []uint64
}

func (f *noteFake) Driver() driver.Transport { return f }

func (f *noteFake) SubmitNotify(ss []*driver.Slice, n *driver.Note) {
	for i, s := range ss {
		if i == f.failAt-1 {
			s.Done(0, errors.New("fake: refused"))
			continue
		}
		s.Done(uint64(len(s.Local)), nil)
	}
	f.attempts = append(f.attempts, n.Attempt())
	f.bytes = append(f.bytes, n.Bytes)
	n.Done(f.outcome(n.Attempt()))
}

// TestNotifyResend: a note whose first sending ended transiently (a
// connection broke) is sent again alone once every task of its submission
// completed, and the batch completes; when a task failed it is not sent
// again and Wait reports the failure; a note refused for good fails the
// batch with that error.
func TestNotifyResend(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<16, &fake{name: "fake"})
	nf := &noteFake{fake: &fake{name: "fake"}}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, nf)
	seg, err := ini.Engine.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]engine.Request, 4)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*1024 : (i+1)*1024], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes()) + uint64(i*1024)}
	}
	run := func(failAt int, outcome func(int) error) error {
		nf.failAt, nf.outcome, nf.attempts, nf.bytes = failAt, outcome, nil, nil
		b, _ := ini.Engine.AllocateBatch(len(reqs))
		defer ini.Engine.FreeBatch(b)
		err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: "n"})
		if err == nil {
			err = ini.Engine.Wait(ctxT(t, 5*time.Second), b)
		}
		return err
	}
	transientOnce := func(a int) error {
		if a == 0 {
			return fmt.Errorf("fake: connection broke: %w", engine.ErrTransient)
		}
		return nil
	}
	if err := run(0, transientOnce); err != nil || fmt.Sprint(nf.attempts) != "[0 1]" || nf.bytes[1] != 4096 {
		t.Fatalf("transient note: %v, attempts %v, bytes %v", err, nf.attempts, nf.bytes)
	}
	if err := run(2, transientOnce); err == nil || fmt.Sprint(nf.attempts) != "[0]" {
		t.Fatalf("transient note, failed task: %v, attempts %v", err, nf.attempts)
	}
	full := func(int) error { return fmt.Errorf("fake: %w", engine.ErrNotifyFull) }
	if err := run(0, full); !errors.Is(err, engine.ErrNotifyFull) || fmt.Sprint(nf.attempts) != "[0]" {
		t.Fatalf("refused note: %v, attempts %v", err, nf.attempts)
	}
	// The notification's outcome is in BatchStatus too.
	nf.failAt, nf.outcome = 0, full
	b, _ := ini.Engine.AllocateBatch(len(reqs))
	if err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	if s, _ := ini.Engine.BatchStatus(b); s.State != engine.StateFailed || !errors.Is(s.Err, engine.ErrNotifyFull) {
		t.Fatalf("status of a batch whose note was refused: %+v", s)
	}
	ini.Engine.FreeBatch(b)
}

// TestInboxOrderHandOff: notifications reach the channel in the order
// they were accepted, whether handed straight to the waiting receiver or
// queued for the pump while the receiver is slow, delivered quietly
// (driver.QuietInbox) and announced by Wake one, two or three at a time
// or not; none is lost or duplicated.
// ReceiveNotifications is held to the same, its runs of notifications in
// order.
func TestInboxOrderHandOff(t *testing.T) {
	for _, receive := range []bool{false, true} {
		for _, quiet := range []bool{false, true} {
			t.Run(fmt.Sprintf("receive=%v/quiet=%v", receive, quiet), func(t *testing.T) { testInboxOrder(t, quiet, receive) })
		}
	}
}

func testInboxOrder(t *testing.T, quiet, receive bool) {
	f := &fake{name: "fake"}
	n := enginetest.NewNode(t, engine.Config{Name: "target", NotifyQueue: 64, NotifyQueuePerSender: 64}, 1<<12, f)
	ib := f.host.Inbox()
	const total = 20000
	got := make(chan error, 1)
	// next returns the next notification, from the channel or from the
	// run ReceiveNotifications took last.
	var next func() (engine.Notification, bool)
	if receive {
		var run []engine.Notification
		next = func() (engine.Notification, bool) {
			if len(run) == 0 {
				var err error
				if run, err = n.Engine.ReceiveNotifications(context.Background(), run[:0]); err != nil {
					return engine.Notification{}, false
				}
			}
			m := run[0]
			run = run[1:]
			return m, true
		}
	} else {
		ch := n.Engine.Notifications()
		next = func() (engine.Notification, bool) { m, ok := <-ch; return m, ok }
	}
	go func() {
		for i := uint64(1); i <= total; i++ {
			m, ok := next()
			switch {
			case !ok:
				got <- fmt.Errorf("receiving ended after %d", i-1)
				return
			case m.Bytes != i || m.Name != "n" || m.From != "ini":
				got <- fmt.Errorf("notification %d: got %+v", i, m)
				return
			}
			if i%97 == 0 {
				time.Sleep(50 * time.Microsecond) // let some queue up
			}
		}
		got <- nil
	}()
	ctx := ctxT(t, 30*time.Second)
	d := driver.Delivery{From: driver.Sender{Name: "ini", Epoch: 1}, Name: []byte("n")}
	qib, _ := ib.(driver.QuietInbox)
	if quiet && qib == nil {
		t.Fatal("the engine's inbox is no driver.QuietInbox")
	}
	for i := uint64(1); i <= total; i++ {
		d.ID, d.Bytes = i, i
		var err error
		switch {
		case !quiet, i%7 == 0:
			// A loud delivery among quiet ones announces them.
			err = ib.Deliver(driver.NoWait, &d)
		default:
			err = qib.DeliverQuiet(driver.NoWait, &d)
			if i%3 == 0 {
				qib.Wake()
			}
		}
		if errors.Is(err, driver.ErrNotifyFull) {
			err = ib.Deliver(ctx, &d)
		}
		if err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
		if i%5 == 0 {
			// A resent copy is dropped.
			if err := ib.Deliver(driver.NoWait, &d); err != nil {
				t.Fatalf("second copy of %d: %v", i, err)
			}
		}
	}
	if quiet {
		qib.Wake()
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("notifications stopped arriving")
	}
	if s := n.Engine.NotifyStats(); s.Accepted != total || s.Duplicates != total/5 || s.Queued != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestInboxQuiet: a note delivered quietly is queued (Drain sees it)
// but not handed to a receiver waiting on the channel until Wake; then it
// arrives, once.
func TestInboxQuiet(t *testing.T) {
	f := &fake{name: "fake"}
	n := enginetest.NewNode(t, engine.Config{Name: "target"}, 1<<12, f)
	qib, ok := f.host.Inbox().(driver.QuietInbox)
	if !ok {
		t.Fatal("the engine's inbox is no driver.QuietInbox")
	}
	ch := n.Engine.Notifications()
	deliver := func(id uint64) {
		t.Helper()
		if err := qib.DeliverQuiet(driver.NoWait, &driver.Delivery{From: driver.Sender{Name: "ini", Epoch: 1}, ID: id, Name: []byte("n"), Bytes: id}); err != nil {
			t.Fatal(err)
		}
	}
	// A pump that has not parked yet on an empty queue takes a quiet
	// note itself: try again, the pump having had longer.
	id := uint64(0)
	for try := 1; ; try++ {
		time.Sleep(time.Duration(try) * 20 * time.Millisecond)
		id++
		deliver(id)
		select {
		case m := <-ch:
			if m.Bytes != id {
				t.Fatalf("got %+v, want note %d", m, id)
			}
			if try == 5 {
				t.Fatal("quiet notes reached the channel before Wake")
			}
			continue
		case <-time.After(50 * time.Millisecond):
		}
		break
	}
	qib.Wake()
	select {
	case m := <-ch:
		if m.Bytes != id {
			t.Fatalf("got %+v, want note %d", m, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a quiet note did not arrive after Wake")
	}
	id++
	deliver(id)
	if got := n.Engine.DrainNotifications(nil); len(got) != 1 || got[0].Bytes != id {
		t.Fatalf("drained %+v, want the quiet note %d", got, id)
	}
	qib.Wake() // nothing left: no copy arrives
	select {
	case m := <-ch:
		t.Fatalf("a drained note reached the channel too: %+v", m)
	case <-time.After(20 * time.Millisecond):
	}
	if s := n.Engine.NotifyStats(); s.Accepted != id || s.Queued != 0 {
		t.Fatalf("stats %+v, want %d accepted", s, id)
	}
}

// TestReceiveNotifications: a waiting ReceiveNotifications wakes for a
// notification, takes every queued one in one call, ends with its
// context's error, and after the engine closes returns what is still
// queued, then ErrClosed.
func TestReceiveNotifications(t *testing.T) {
	f := &fake{name: "fake"}
	n := enginetest.NewNode(t, engine.Config{Name: "target"}, 1<<12, f)
	ib := f.host.Inbox()
	deliver := func(id uint64) {
		t.Helper()
		if err := ib.Deliver(driver.NoWait, &driver.Delivery{From: driver.Sender{Name: "ini", Epoch: 1}, ID: id, Name: []byte("n"), Msg: []byte{byte(id)}, Bytes: id}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	got, err := n.Engine.ReceiveNotifications(ctx, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != 0 {
		t.Fatalf("nothing queued: got %v, %v; want context.DeadlineExceeded", got, err)
	}

	type result struct {
		got []engine.Notification
		err error
	}
	res := make(chan result, 1)
	go func() {
		got, err := n.Engine.ReceiveNotifications(ctxT(t, 10*time.Second), nil)
		res <- result{got, err}
	}()
	time.Sleep(10 * time.Millisecond) // most often it waits by now
	deliver(1)
	if r := <-res; r.err != nil || len(r.got) != 1 || r.got[0].Bytes != 1 || string(r.got[0].Msg) != "\x01" {
		t.Fatalf("woken receiver got %+v, %v", r.got, r.err)
	}

	for id := uint64(2); id <= 9; id++ {
		deliver(id)
	}
	dst := make([]engine.Notification, 0, 16)
	got, err = n.Engine.ReceiveNotifications(ctxT(t, 10*time.Second), dst)
	if err != nil || len(got) != 8 || got[0].Bytes != 2 || got[7].Bytes != 9 || &got[0] != &dst[:1][0] {
		t.Fatalf("eight queued: got %+v, %v (want them appended to dst)", got, err)
	}

	deliver(10)
	if err := n.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := n.Engine.ReceiveNotifications(context.Background(), nil); err != nil || len(got) != 1 || got[0].Bytes != 10 {
		t.Fatalf("after Close, the queued one: got %+v, %v", got, err)
	}
	if got, err := n.Engine.ReceiveNotifications(context.Background(), nil); !errors.Is(err, engine.ErrClosed) || len(got) != 0 {
		t.Fatalf("after Close, nothing queued: got %+v, %v; want ErrClosed", got, err)
	}
	if s := n.Engine.NotifyStats(); s.Accepted != 10 || s.Queued != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestInboxLateOldIncarnation: a restarted sender's new connection
// delivered first, its old connection's late notes after: the old ones
// are dropped as stale (epochs are random; the connections' Seq orders
// them), the new ones kept. Without Seq the later epoch wins as before.
func TestInboxLateOldIncarnation(t *testing.T) {
	f := &fake{name: "fake"}
	n := enginetest.NewNode(t, engine.Config{Name: "target"}, 1<<12, f)
	ib := f.host.Inbox()
	oldC := driver.Sender{Name: "ini", Epoch: 0xb0, Seq: driver.NextSeq()}
	newC := driver.Sender{Name: "ini", Epoch: 0xa0, Seq: driver.NextSeq()}
	deliver := func(from driver.Sender, id uint64) error {
		return ib.Deliver(driver.NoWait, &driver.Delivery{From: from, ID: id, Name: []byte("n"), Bytes: id})
	}
	if err := deliver(newC, 1); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if err := deliver(oldC, id); !errors.Is(err, engine.ErrPeerReset) {
			t.Fatalf("old incarnation's late note %d: %v, want ErrPeerReset", id, err)
		}
	}
	if err := deliver(newC, 2); err != nil {
		t.Fatal(err)
	}
	got := n.Engine.DrainNotifications(nil)
	if len(got) != 2 || got[0].Bytes != 1 || got[1].Bytes != 2 || got[0].FromEpoch != newC.Epoch {
		t.Fatalf("delivered %+v, want the new incarnation's notes 1 and 2", got)
	}
	if s := n.Engine.NotifyStats(); s.Stale != 3 || s.Accepted != 2 {
		t.Fatalf("stats %+v, want 3 stale and 2 accepted", s)
	}
	// A newer connection under another epoch is a restart: it replaces.
	newer := driver.Sender{Name: "ini", Epoch: 0xc0, Seq: driver.NextSeq()}
	if err := deliver(newer, 1); err != nil {
		t.Fatal(err)
	}
	if err := deliver(newC, 3); !errors.Is(err, engine.ErrPeerReset) {
		t.Fatalf("replaced incarnation's note: %v, want ErrPeerReset", err)
	}
}

// foldFake completes a notified submission's slices and its note with
// driver.DoneAllNote: the slices before split with DoneAll first, the
// rest with the note (split 0: all of them; split len(ss): none, so the
// note alone).
type foldFake struct {
	*fake
	split int
}

func (f *foldFake) Driver() driver.Transport { return f }

func (f *foldFake) SubmitNotify(ss []*driver.Slice, n *driver.Note) {
	k := min(f.split, len(ss))
	driver.DoneAll(ss[:k])
	driver.DoneAllNote(ss[k:], n)
}

// TestDoneAllNote: a note completed with its slices in one step
// (driver.DoneAllNote), whether with all of them, the last of them or
// none, completes its batch with every task COMPLETED and its bytes, the
// pins and in-flight counts dropped; completing the note again panics.
func TestDoneAllNote(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<16, &fake{name: "fake"})
	ff := &foldFake{fake: &fake{name: "fake"}}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, ff)
	e := ini.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]engine.Request, 4)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*1024 : (i+1)*1024], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes()) + uint64(i*1024)}
	}
	for _, split := range []int{0, 3, 4} {
		ff.split = split
		for range 3 { // the batch and its note reused
			b, _ := e.AllocateBatch(len(reqs))
			if err := e.SubmitNotify(b, reqs, engine.Notify{Name: "n"}); err != nil {
				t.Fatal(err)
			}
			if err := e.Wait(ctxT(t, 5*time.Second), b); err != nil {
				t.Fatalf("split %d: %v", split, err)
			}
			if bs, _ := e.BatchStatus(b); bs.State != engine.StateCompleted || bs.Transferred != 4096 {
				t.Fatalf("split %d: %+v, want COMPLETED with 4096 bytes", split, bs)
			}
			for i := range reqs {
				if ts, _ := e.Status(b, i); ts.State != engine.StateCompleted || ts.Transferred != 1024 {
					t.Fatalf("split %d, task %d: %+v", split, i, ts)
				}
			}
			if err := e.FreeBatch(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("a note completed twice did not panic")
			}
		}()
		var n driver.Note
		driver.DoneAllNote(nil, &n)
	}()
	if err := e.CloseSegment(seg); err != nil {
		t.Fatalf("close segment after DoneAllNote: %v (in-flight count left)", err)
	}
	if err := e.UnregisterLocalMemory(ini.Mem.Bytes()); err != nil {
		t.Fatalf("unregister after DoneAllNote: %v (pin left)", err)
	}
}
