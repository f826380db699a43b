package rdma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/uverbs"
)

// notePair is fakePair with the target's notification queue bounded to
// perSender per sender (0: the engine's default).
func notePair(t testing.TB, f *fabric, cfg Config, size, rails, perSender int) (ini, tgt *fnode, seg engine.SegmentID) {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	var a, b []*fakeDev
	for i := range rails {
		a = append(a, f.dev(fmt.Sprintf("a%d", i), -1))
		b = append(b, f.dev(fmt.Sprintf("b%d", i), -1))
	}
	mk := func(name string, devs []*fakeDev, per int) *fnode {
		tr := New(cfg)
		tr.open = opener(devs...)
		n := enginetest.NewNode(t, engine.Config{Name: name, Store: st, Retries: 3, NotifyQueuePerSender: per}, size, tr)
		return &fnode{Node: n, tr: tr, devs: devs}
	}
	tgt = mk("target", b, perSender)
	ini = mk("initiator", a, 0)
	return ini, tgt, openSeg(t, ini, "target")
}

// submitNotify submits reqs with a notification and waits for the batch.
func submitNotify(t testing.TB, e *engine.Engine, reqs []engine.Request, n engine.Notify) error {
	t.Helper()
	b, err := e.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	defer e.FreeBatch(b)
	if err := e.SubmitNotify(b, reqs, n); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.Wait(ctx, b)
}

// TestFakeNotifyAfterData: concurrent submitters each WRITE a batch over
// two rails (the fabric holding and releasing work requests to
// interleave them) with a notification; the target checks every byte of
// that batch the moment each notification arrives, gets each exactly
// once, and no SEND ever meets an empty receive queue. One batch of 4096
// tasks goes the same way.
func TestFakeNotifyAfterData(t *testing.T) { bothModes(t, testFakeNotifyAfterData) }

func testFakeNotifyAfterData(t *testing.T, markers bool) {
	f := newFabric()
	const submitters, rounds, tasks, blk = 8, 10, 16, 1024
	region := tasks * blk
	ini, tgt, seg := notePair(t, f, Config{NotifyDepth: 2, NotifyMarkers: markers}, submitters*region, 2, 0)
	tb := tgt.Mem.Bytes()
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if wr.ID%3 == 0 {
			return hold, 0
		}
		return deliver, 0
	})
	stop := releaser(f)
	defer stop()

	// The target: each notification is checked against memory as it
	// arrives; its submitter writes the next round only after that.
	var acks [submitters]chan struct{}
	for i := range acks {
		acks[i] = make(chan struct{}, 1)
	}
	var bad []error
	seen := map[[2]uint32]bool{}
	got := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := range tgt.Engine.Notifications() {
			if n.Name == "big" {
				continue
			}
			w, round := binary.BigEndian.Uint32(n.Msg), binary.BigEndian.Uint32(n.Msg[4:])
			want := byte(int(w)*rounds + int(round) + 1)
			for i, c := range tb[int(w)*region : int(w+1)*region] {
				if c != want {
					bad = append(bad, fmt.Errorf("submitter %d round %d: byte %d is %d at the notification, want %d", w, round, i, c, want))
					break
				}
			}
			if n.Bytes != uint64(region) || n.From != "initiator" || n.Name != "kv" {
				bad = append(bad, fmt.Errorf("notification %+v", n))
			}
			k := [2]uint32{w, round}
			if seen[k] {
				bad = append(bad, fmt.Errorf("submitter %d round %d notified twice", w, round))
			}
			seen[k] = true
			if got++; got == submitters*rounds {
				return
			}
			acks[w] <- struct{}{}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, submitters)
	for w := range submitters {
		wg.Go(func() {
			mine := ini.Mem.Bytes()[w*region : (w+1)*region]
			base := engine.AddrOf(tb) + uint64(w*region)
			reqs := make([]engine.Request, tasks)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: mine[i*blk : (i+1)*blk], Target: seg, TargetAddr: base + uint64(i*blk)}
			}
			msg := make([]byte, 8)
			for round := range rounds {
				for i := range mine {
					mine[i] = byte(w*rounds + round + 1)
				}
				binary.BigEndian.PutUint32(msg, uint32(w))
				binary.BigEndian.PutUint32(msg[4:], uint32(round))
				if err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: "kv", Msg: msg}); err != nil {
					errs <- fmt.Errorf("submitter %d round %d: %w", w, round, err)
					return
				}
				if round == rounds-1 {
					return
				}
				select {
				case <-acks[w]:
				case <-time.After(10 * time.Second):
					errs <- fmt.Errorf("submitter %d round %d: not notified in 10 s", w, round)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d notifications in 10 s", got, submitters*rounds)
	}
	for _, err := range bad {
		t.Error(err)
	}
	// 4096 tasks of 32 bytes in one submission.
	big := fakeRequests(engine.Write, ini, tgt, seg, 4096, 32)
	if err := submitNotify(t, ini.Engine, big, engine.Notify{Name: "big"}); err != nil {
		t.Fatal(err)
	}
	if n := f.rnr.Load(); n != 0 {
		t.Errorf("%d SENDs met an empty receive queue", n)
	}
}

// TestFakeNotifyBackPressure: a target whose queue for a sender is full
// holds the notifications it received (and so the sender's credits): the
// sender's further notifications wait at the sender, none fails, none
// meets an empty receive queue, the target receives no more than the
// receives it posted; drained, every one arrives, exactly once.
func TestFakeNotifyBackPressure(t *testing.T) { bothModes(t, testFakeNotifyBackPressure) }

func testFakeNotifyBackPressure(t *testing.T, markers bool) {
	f := newFabric()
	const depth, qps, flood, room = 2, 2, 40, 3
	ini, tgt, seg := notePair(t, f, Config{NotifyDepth: depth, QPsPerPath: qps, NotifyMarkers: markers}, 4096, 1, room)
	if err := transfer(t, ini.Engine, fakeRequests(engine.Write, ini, tgt, seg, 1, 4096), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var done atomic.Int64
	errs := make(chan error, flood)
	for i := range flood {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := ini.Engine.Notify(ctx, seg, engine.Notify{Name: "n", Msg: []byte{byte(i)}}); err != nil {
				errs <- err
			}
			done.Add(1)
		})
	}
	// The inbox takes 3, the target holds what the credits let through,
	// the rest waits at the initiator.
	waitFor(t, "the credits used up", func() bool { return f.recvs.Load() == room+depth*qps })
	// Each Notify that the target received returns; the goroutine that
	// called it may be scheduled late on a busy machine, so wait for the
	// count, then give any further (wrong) completion time to show.
	waitFor(t, "the received notifications completed", func() bool { return done.Load() >= room+depth*qps })
	time.Sleep(20 * time.Millisecond)
	if got, q := f.recvs.Load(), tgt.Engine.NotifyStats().Queued; got != room+depth*qps || q != room {
		t.Fatalf("%d notifications received, %d queued, with %d receives posted", got, q, depth*qps)
	}
	if d := done.Load(); d != room+depth*qps {
		t.Fatalf("%d notifications completed at the initiator, want the %d the target received", d, room+depth*qps)
	}
	got := map[byte]int{}
	for len(got) < flood {
		select {
		case n := <-tgt.Engine.Notifications():
			got[n.Msg[0]]++
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d notifications", len(got), flood)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for k, c := range got {
		if c != 1 {
			t.Errorf("notification %d delivered %d times", k, c)
		}
	}
	if n := f.rnr.Load(); n != 0 {
		t.Errorf("%d SENDs met an empty receive queue", n)
	}
}

// TestFakeNotifyResentOnce: a SEND that landed but whose completion
// failed (a lost ACK) is sent again on a fresh endpoint with its note
// ID; the target drops the copy. The batch succeeds.
func TestFakeNotifyResentOnce(t *testing.T) { bothModes(t, testFakeNotifyResentOnce) }

func testFakeNotifyResentOnce(t *testing.T, markers bool) {
	f := newFabric()
	ini, tgt, seg := notePair(t, f, Config{NotifyMarkers: markers}, 4096, 1, 0)
	var sends atomic.Int64
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if wr.Opcode == uverbs.WRSend && sends.Add(1) == 1 {
			return landFail, uverbs.WCRetryExcErr
		}
		return deliver, 0
	})
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 1, 4096)
	for _, name := range []string{"once", "next"} {
		if err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	got := tgt.Engine.DrainNotifications(nil)
	// After: one SEND per note, one resent. Markers: one per QP of the
	// endpoint (2), the note resent alone after the first failed.
	want := int64(3)
	if markers {
		want = 5
	}
	if len(got) != 2 || got[0].Name != "once" || got[1].Name != "next" || sends.Load() != want {
		t.Fatalf("delivered %v of %d SENDs, want once and next of %d (one resent)", got, sends.Load(), want)
	}
	if d := tgt.Engine.NotifyStats().Duplicates; d != 1 {
		t.Errorf("%d duplicates dropped, want 1", d)
	}
}

// TestFakeNotifyFailedBatch: a submission whose WRITE fails at the target
// delivers no notification; one whose WRITE fails once and succeeds on
// its retry delivers exactly one.
func TestFakeNotifyFailedBatch(t *testing.T) { bothModes(t, testFakeNotifyFailedBatch) }

func testFakeNotifyFailedBatch(t *testing.T, markers bool) {
	f := newFabric()
	ini, tgt, seg := notePair(t, f, Config{NotifyMarkers: markers}, 8*4096, 2, 0)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 8, 4096)
	var writes atomic.Int64
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if wr.Opcode == uverbs.WRRDMAWrite && writes.Add(1) == 5 {
			return fail, uverbs.WCRemAccessErr
		}
		return deliver, 0
	})
	if err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: "failed"}); err == nil {
		t.Fatal("a batch with a failed WRITE succeeded")
	}
	writes.Store(0)
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if wr.Opcode == uverbs.WRRDMAWrite && writes.Add(1) == 3 {
			return fail, uverbs.WCRetryExcErr
		}
		return deliver, 0
	})
	if err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: "retried"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	got := tgt.Engine.DrainNotifications(nil)
	if len(got) != 1 || got[0].Name != "retried" {
		t.Fatalf("delivered %v, want only the retried batch's", got)
	}
}

// TestFakeNotifyPeerReset: a notification to a target that closes under
// it fails its batch and is delivered nowhere.
func TestFakeNotifyPeerReset(t *testing.T) { bothModes(t, testFakeNotifyPeerReset) }

func testFakeNotifyPeerReset(t *testing.T, markers bool) {
	f := newFabric()
	ini, tgt, seg := notePair(t, f, Config{NotifyMarkers: markers}, 4096, 1, 0)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 1, 4096)
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f.setPost(func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus) {
		if wr.Opcode == uverbs.WRSend {
			return hold, 0
		}
		return deliver, 0
	})
	b, err := ini.Engine.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the SEND posted", func() bool { return f.nheld() >= 1 })
	tgt.Engine.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ini.Engine.Wait(ctx, b); err == nil || ctx.Err() != nil {
		t.Fatalf("a batch whose target closed under its notification: %v", err)
	}
	f.release(-1)
	if got := tgt.Engine.DrainNotifications(nil); len(got) != 0 {
		t.Fatalf("a closed target delivered %v", got)
	}
}

// TestFakeNotifyStaleSender: notifications a target holds for a sender
// that then restarts are dropped, not delivered, and the new
// incarnation's arrive.
func TestFakeNotifyStaleSender(t *testing.T) {
	f := newFabric()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	node := func(name string, per int) *fnode {
		tr := New(Config{})
		d := f.dev(name+"-dev", -1)
		tr.open = opener(d)
		n := enginetest.NewNode(t, engine.Config{Name: name, Store: st, Retries: 3, NotifyQueuePerSender: per}, 4096, tr)
		return &fnode{Node: n, tr: tr, devs: []*fakeDev{d}}
	}
	tgt := node("target", 1)
	old := node("initiator", 0)
	seg := openSeg(t, old, "target")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := old.Engine.Notify(ctx, seg, engine.Notify{Name: "old 1"}); err != nil {
		t.Fatal(err)
	}
	// The queue holds one: the second waits at the target, in custody.
	if err := old.Engine.Notify(ctx, seg, engine.Notify{Name: "old 2"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "one queued, one held", func() bool { return tgt.Engine.NotifyStats().Queued == 1 && f.recvs.Load() == 2 })
	time.Sleep(10 * time.Millisecond)
	old.Engine.Close()
	cur := node("initiator", 0)
	seg = openSeg(t, cur, "target")
	if err := cur.Engine.Notify(ctx, seg, engine.Notify{Name: "new"}); err != nil {
		t.Fatal(err)
	}
	// The target held "old 2" when its sender restarted: it is dropped,
	// never delivered. ("old 1", already queued, is the inbox's.)
	// Nothing is drained before "new" is in: draining would make room
	// for "old 2" while its sender was still the current one.
	waitFor(t, "the restarted sender's notification", func() bool { return tgt.Engine.NotifyStats().Accepted == 2 })
	time.Sleep(20 * time.Millisecond)
	var got []string
	for _, n := range tgt.Engine.DrainNotifications(nil) {
		got = append(got, n.Name)
	}
	if len(got) == 0 || got[len(got)-1] != "new" {
		t.Fatalf("delivered %v, want the restarted sender's last", got)
	}
	for _, n := range got {
		if n == "old 2" {
			t.Fatalf("delivered %v: the held notification of the replaced sender came through", got)
		}
	}
	if st := tgt.Engine.NotifyStats(); st.Stale == 0 {
		t.Errorf("no stale notification counted (%+v)", st)
	}
}

// FuzzNote: a received notification decodes without panic, and what
// decodes encodes back to the same bytes.
func FuzzNote(f *testing.F) {
	b := make([]byte, noteBufSize)
	n, _ := putNote(b, 7, 1<<20, 2, "kv", []byte("layer 3"))
	f.Add(b[:n])
	f.Add(b[:noteHeaderLen])
	f.Fuzz(func(t *testing.T, in []byte) {
		seq, n, marks, name, msg, err := parseNote(in)
		if err != nil {
			return
		}
		out := make([]byte, noteBufSize)
		k, err := putNote(out, seq, n, marks, string(name), msg)
		if err != nil || !bytes.Equal(out[:k], in) {
			t.Fatalf("re-encodes differently (%v)", err)
		}
	})
}

var _ = errors.Is
var _ = driver.ErrCanceled

// TestFakeNotifyAllocs: a batch of 128 WRITEs with a notification,
// submitted, completed, notified and drained, allocates nothing once
// warm: the initiator's path (tracker, SEND, credits back) and rdma's
// target path (receive, delivery, repost, credit). The notification's
// name and message are empty because the target's inbox copies what it
// queues (its own allocations, not the transport's).
func TestFakeNotifyAllocs(t *testing.T) { bothModes(t, testFakeNotifyAllocs) }

func testFakeNotifyAllocs(t *testing.T, markers bool) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	f := newFabric()
	const tasks, blk = 128, 4096
	ini, tgt, seg := notePair(t, f, Config{NotifyMarkers: markers}, tasks*blk, 2, 0)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
	ctx := context.Background()
	var failed error
	got := make([]engine.Notification, 0, 8)
	run := func() {
		b, err := ini.Engine.AllocateBatch(tasks)
		if err == nil {
			err = ini.Engine.SubmitNotify(b, reqs, engine.Notify{})
		}
		if err == nil {
			err = ini.Engine.Wait(ctx, b)
		}
		if err == nil {
			err = ini.Engine.FreeBatch(b)
		}
		for len(got) == 0 && err == nil {
			got = tgt.Engine.DrainNotifications(got[:0])
		}
		got = got[:0]
		if err != nil && failed == nil {
			failed = err
		}
	}
	for range 8 {
		run()
	}
	allocs := enginetest.AllocsPerRun(20, run)
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d with a notification", allocs, tasks)
	}
}

// bothModes runs a notification test with the note sent after its data
// completed and with markers behind the data on every QP.
func bothModes(t *testing.T, f func(*testing.T, bool)) {
	t.Run("after", func(t *testing.T) { f(t, false) })
	t.Run("markers", func(t *testing.T) { f(t, true) })
}

// TestFakeNotifyStalled: notes that wait at the sender for a credit
// longer than Config.SliceTimeout (the target's application drains
// nothing) fail with ErrNotifyFull, without being sent; those the target
// took succeed.
func TestFakeNotifyStalled(t *testing.T) { bothModes(t, testFakeNotifyStalled) }

func testFakeNotifyStalled(t *testing.T, markers bool) {
	f := newFabric()
	const depth, qps, flood, room = 1, 2, 12, 1
	const timeout = 50 * time.Millisecond
	ini, tgt, seg := notePair(t, f, Config{NotifyDepth: depth, QPsPerPath: qps, SliceTimeout: timeout, NotifyMarkers: markers}, 4096, 1, room)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 1, 4096)
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var ok, full atomic.Int64
	errs := make(chan error, flood)
	for range flood {
		wg.Go(func() {
			switch err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: "n"}); {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, driver.ErrNotifyFull):
				full.Add(1)
			default:
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ok.Load() == 0 || full.Load() == 0 || ok.Load()+full.Load() != flood {
		t.Fatalf("%d notes succeeded and %d failed full, of %d", ok.Load(), full.Load(), flood)
	}
	if got := f.recvs.Load(); !markers && got != ok.Load() {
		t.Fatalf("%d notes received by the target, %d succeeded at the sender", got, ok.Load())
	}
	// Drained, the ones that succeeded are all there.
	n := 0
	deadline := time.Now().Add(10 * time.Second)
	for int64(n) < ok.Load() && time.Now().Before(deadline) {
		n += len(tgt.Engine.DrainNotifications(nil))
		time.Sleep(time.Millisecond)
	}
	if int64(n) != ok.Load() {
		t.Fatalf("%d notes delivered, %d succeeded at the sender", n, ok.Load())
	}
}

// BenchmarkFakeNotify is the CPU cost of a batch of 128 small WRITEs
// over two rails of the fake fabric without a notification, with one
// sent after the data, and with markers behind it: the engine, Submit,
// the rail owners, the target's delivery and the completions.
func BenchmarkFakeNotify(b *testing.B) {
	for _, c := range []struct {
		name           string
		notify, marked bool
	}{{"plain", false, false}, {"after", true, false}, {"markers", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			f := newFabric()
			const tasks, blk = 128, 64
			ini, tgt, seg := notePair(b, f, Config{NotifyMarkers: c.marked}, tasks*blk, 2, 0)
			reqs := fakeRequests(engine.Write, ini, tgt, seg, tasks, blk)
			ctx := context.Background()
			ch := tgt.Engine.Notifications()
			b.ReportAllocs()
			for b.Loop() {
				id, err := ini.Engine.AllocateBatch(tasks)
				if err == nil && c.notify {
					err = ini.Engine.SubmitNotify(id, reqs, engine.Notify{})
				} else if err == nil {
					err = ini.Engine.Submit(id, reqs)
				}
				if err == nil {
					err = ini.Engine.Wait(ctx, id)
				}
				if err == nil {
					err = ini.Engine.FreeBatch(id)
				}
				if c.notify && err == nil {
					<-ch
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFakeNotifyAuth: with a cluster secret on both sides, a note
// arrives named by the sender the handshake proved; an initiator without
// the secret gets no QP, so it cannot notify at all.
func TestFakeNotifyAuth(t *testing.T) {
	secret, err := auth.New(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	f := newFabric()
	ini, tgt, seg := notePair(t, f, Config{Auth: secret}, 4096, 1, 0)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 1, 4096)
	if err := submitNotify(t, ini.Engine, reqs, engine.Notify{Name: "ok"}); err != nil {
		t.Fatal(err)
	}
	got := tgt.Engine.DrainNotifications(nil)
	for len(got) == 0 {
		time.Sleep(time.Millisecond)
		got = tgt.Engine.DrainNotifications(nil)
	}
	if got[0].Name != "ok" || got[0].From != "initiator" || got[0].FromEpoch != ini.Engine.Epoch() {
		t.Fatalf("notification %+v", got[0])
	}
	// No secret: refused before any endpoint.
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt2 := New(Config{Auth: secret})
	tgt2.open = opener(f.dev("t2", -1))
	enginetest.NewNode(t, engine.Config{Name: "target2", Store: st}, 4096, tgt2)
	bad := New(Config{})
	bad.open = opener(f.dev("b2", -1))
	bn := &fnode{Node: enginetest.NewNode(t, engine.Config{Name: "intruder", Store: st, Retries: 1}, 4096, bad), tr: bad}
	seg2 := openSeg(t, bn, "target2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bn.Engine.Notify(ctx, seg2, engine.Notify{Name: "spoof"}); err == nil {
		t.Fatal("an initiator without the secret notified")
	}
	if n := tgt2.TargetQPs(); n != 0 {
		t.Fatalf("the target holds %d QPs for an initiator without the secret", n)
	}
}

// TestFakeNotifyConformance runs the engine's notification cases
// (transporttest.RunNotify) over the fake fabric, each engine on two
// devices of its own (two rails), both ways a note follows its data. The
// target holds at most NotifyDepth × QPsPerPath notes per endpoint, one
// endpoint per rail: the Flood case's NotifyHeld.
func TestFakeNotifyConformance(t *testing.T) { bothModes(t, testFakeNotifyConformance) }

func testFakeNotifyConformance(t *testing.T, markers bool) {
	f := newFabric()
	// The slice timeout bounds the Flood case's wait for credits; it is
	// long enough that a loaded host's slices do not hit it.
	cfg := Config{NotifyDepth: 2, QPsPerPath: 2, SliceTimeout: 3 * time.Second, NotifyMarkers: markers}
	var k atomic.Int64
	factory := func(testing.TB) engine.Transport {
		tr := New(cfg)
		n := k.Add(1)
		tr.open = opener(f.dev(fmt.Sprint("d", n, "a"), -1), f.dev(fmt.Sprint("d", n, "b"), -1))
		return tr
	}
	transporttest.RunNotify(t, factory, transporttest.Options{NotifyHeld: cfg.NotifyDepth * cfg.QPsPerPath * 2, Timeout: 30 * time.Second})
}
