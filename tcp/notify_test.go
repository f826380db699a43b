package tcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"net"
	"os"
	"os/exec"
	"strings"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/segment"
)

// pattern fills b (a multiple of 8 bytes long) with words derived from
// seed, so that a receiver knowing seed can check every byte.
func pattern(b []byte, seed uint64) {
	x := seed | 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

func patternOK(b []byte, seed uint64) bool {
	x := seed | 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if binary.LittleEndian.Uint64(b[i:]) != x {
			return false
		}
	}
	return true
}

// noteMsg is what the ordering tests' notes carry: which submitter, which
// round, the pattern's seed, and where its bytes went.
type noteMsg struct {
	who, round int
	seed       uint64
	off, n     uint64
}

func (m noteMsg) encode() []byte {
	b := make([]byte, 40)
	binary.LittleEndian.PutUint64(b[0:], uint64(m.who))
	binary.LittleEndian.PutUint64(b[8:], uint64(m.round))
	binary.LittleEndian.PutUint64(b[16:], m.seed)
	binary.LittleEndian.PutUint64(b[24:], m.off)
	binary.LittleEndian.PutUint64(b[32:], m.n)
	return b
}

func decodeNoteMsg(b []byte) (noteMsg, bool) {
	if len(b) != 40 {
		return noteMsg{}, false
	}
	return noteMsg{
		who: int(binary.LittleEndian.Uint64(b[0:])), round: int(binary.LittleEndian.Uint64(b[8:])),
		seed: binary.LittleEndian.Uint64(b[16:]), off: binary.LittleEndian.Uint64(b[24:]), n: binary.LittleEndian.Uint64(b[32:]),
	}, true
}

// TestNotifyAfterData: under concurrent submitters, with submissions of 1
// to 4096 tasks spread over one to four lanes (and slices cut small), the
// target checks every byte of a submission the moment its notification
// arrives: never before the data, never lost on success, never twice.
func TestNotifyAfterData(t *testing.T) {
	const (
		submitters = 4
		region     = 16 << 20
	)
	shapes := []struct{ tasks, size int }{{1, 64}, {7, 4096}, {300, 1024}, {4096, 64}, {4096, 4096}, {64, 256 << 10}}
	rounds := len(shapes) * 2
	if raceEnabled {
		// The detector slows every copy: the same shapes, once, and
		// 4096 tasks of 1 KiB (still over several lanes).
		shapes[4].size, rounds = 1024, len(shapes)
	}
	p := newPair(t, submitters*region, submitters*region, Config{SliceSize: 64 << 10})
	acks := make([]chan error, submitters)
	for i := range acks {
		acks[i] = make(chan error, 1)
	}
	// The target's checker: the notification says which bytes must be
	// there now.
	seen := make(map[[2]int]int)
	var checkErr error
	checkDone := make(chan struct{})
	go func() {
		defer close(checkDone)
		for n := range p.tgt.e.Notifications() {
			m, ok := decodeNoteMsg(n.Msg)
			var err error
			switch {
			case !ok || n.From != "initiator" || n.FromEpoch != p.ini.e.Epoch():
				err = fmt.Errorf("notification %+v: bad sender or message", n)
			case n.Bytes != m.n:
				err = fmt.Errorf("notification for %d bytes, submission had %d", n.Bytes, m.n)
			case !patternOK(p.tgt.buf()[m.off:m.off+m.n], m.seed):
				err = fmt.Errorf("submitter %d round %d: notified before its %d bytes landed", m.who, m.round, m.n)
			}
			seen[[2]int{m.who, m.round}]++
			if c := seen[[2]int{m.who, m.round}]; c > 1 && err == nil {
				err = fmt.Errorf("submitter %d round %d notified %d times", m.who, m.round, c)
			}
			if err != nil && checkErr == nil {
				checkErr = err
			}
			if m.who >= 0 && m.who < submitters {
				acks[m.who] <- err
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, submitters)
	for w := range submitters {
		wg.Go(func() {
			b, err := p.ini.e.AllocateBatch(4096)
			if err != nil {
				errs <- err
				return
			}
			defer p.ini.e.FreeBatch(b)
			reqs := make([]engine.Request, 4096)
			for r := range rounds {
				sh := shapes[(r+w)%len(shapes)]
				off := uint64(w * region)
				n := uint64(sh.tasks * sh.size)
				seed := uint64(w)<<32 | uint64(r)<<8 | 0x5a
				pattern(p.ini.buf()[off:off+n], seed)
				for i := range sh.tasks {
					o := off + uint64(i*sh.size)
					reqs[i] = engine.Request{Op: engine.Write, Local: p.ini.buf()[o : o+uint64(sh.size)], Target: p.seg, TargetAddr: p.tgt.base() + o}
				}
				msg := noteMsg{who: w, round: r, seed: seed, off: off, n: n}.encode()
				err := p.ini.e.SubmitNotify(b, reqs[:sh.tasks], engine.Notify{Name: "kv", Msg: msg})
				if err == nil {
					err = p.ini.e.Wait(ctxT(t, 30*time.Second), b)
				}
				if err == nil {
					select {
					case err = <-acks[w]:
					case <-time.After(30 * time.Second):
						err = errors.New("no notification within 30s of the batch's completion")
					}
				}
				if err == nil {
					err = p.ini.e.FreeBatch(b)
				}
				if err == nil {
					b, err = p.ini.e.AllocateBatch(4096)
				}
				if err != nil {
					errs <- fmt.Errorf("submitter %d round %d (%d×%d B): %w", w, r, sh.tasks, sh.size, err)
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
	p.tgt.e.Close()
	<-checkDone
	if checkErr != nil {
		t.Fatal(checkErr)
	}
	if len(seen) != submitters*rounds {
		t.Fatalf("%d notifications for %d submissions", len(seen), submitters*rounds)
	}
}

// rawMark encodes a mark payload for a hand-driven connection.
func rawMark(kind byte, lanes, frames int, body bool, name, msg string, bytes uint64, abort bool) []byte {
	var m mark
	m.encode(&driver.Note{Name: name, Msg: []byte(msg), Bytes: bytes}, kind, lanes, frames, body)
	if abort {
		m.setAbort()
	}
	return m.buf
}

func dialRawAs(t *testing.T, n *node, from auth.Party) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", n.tr.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := dialHandshake(c, n.tr.cfg.Auth, from, auth.Party{Name: n.e.Name(), Epoch: n.e.Epoch()}); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

// TestNotifyFailedRun: on the wire, a mark whose run had a refused WRITE,
// whose run was aborted, or that claims more frames than the connection
// carried is answered "not delivered" and delivers nothing; across two
// connections one bad run spoils the note; a clean one is delivered with
// the handshake's sender; a malformed mark is refused and the connection
// stays in sync.
func TestNotifyFailedRun(t *testing.T) {
	n := newNode(t, nil, "target", 1<<16, Config{})
	base := n.base()
	from := auth.Party{Name: "raw-ini", Epoch: 77}
	r := dialRawAs(t, n, from)
	data := bytes.Repeat([]byte{7}, 64)
	id := uint64(0)
	expect := func(op op, st status) {
		t.Helper()
		if h := r.reply(); h.op != op|opReply || h.id != id-1 || h.status != st {
			t.Fatalf("reply %v, want op %#x status %d", h, op|opReply, st)
		}
	}
	write := func(addr uint64) {
		r.send(header{op: opWrite, id: id, addr: addr, length: 64}, data)
		id++
	}
	markFrame := func(noteID uint64, payload []byte) {
		r.send(header{op: opMark, id: id, addr: noteID, length: uint64(len(payload))}, payload)
		id++
	}
	write(4096) // outside registered memory
	expect(opWrite, statusOutOfRange)
	markFrame(1, rawMark(markKindMark, 1, 1, true, "bad", "", 64, false))
	expect(opMark, statusNotDelivered)

	write(base)
	expect(opWrite, statusOK)
	markFrame(2, rawMark(markKindMark, 1, 1, true, "aborted", "", 64, true))
	expect(opMark, statusNotDelivered)
	markFrame(3, rawMark(markKindMark, 1, 5, true, "too many frames", "", 64, false))
	expect(opMark, statusNotDelivered)
	bad := rawMark(markKindMark, 1, 0, true, "x", "", 0, false)
	bad[20] = 1 // reserved bytes
	markFrame(4, bad)
	expect(opMark, statusBadRequest)

	// Two lanes: the second connection's run fails, the note is spoiled.
	r2 := dialRawAs(t, n, from)
	write(base)
	expect(opWrite, statusOK)
	markFrame(5, rawMark(markKindMark, 2, 1, true, "two lanes, one bad", "", 128, false))
	expect(opMark, statusOK) // counted
	r2.send(header{op: opWrite, id: 0, addr: 8, length: 64}, data)
	if h := r2.reply(); h.status != statusOutOfRange {
		t.Fatalf("r2 WRITE: %v", h)
	}
	p := rawMark(markKindMark, 2, 1, false, "", "", 128, false)
	r2.send(header{op: opMark, id: 1, addr: 5, length: uint64(len(p))}, p)
	if h := r2.reply(); h.op != opMark|opReply || h.status != statusNotDelivered {
		t.Fatalf("r2 mark: %v", h)
	}
	if got := n.e.DrainNotifications(nil); len(got) != 0 {
		t.Fatalf("delivered for failed runs: %+v", got)
	}

	// Clean runs over two lanes: delivered once the second mark is in.
	write(base)
	expect(opWrite, statusOK)
	markFrame(6, rawMark(markKindMark, 2, 1, true, "ok", "message", 128, false))
	expect(opMark, statusOK)
	if got := n.e.DrainNotifications(nil); len(got) != 0 {
		t.Fatalf("delivered after one of two marks: %+v", got)
	}
	r2.send(header{op: opWrite, id: 2, addr: base + 64, length: 64}, data)
	if h := r2.reply(); h.status != statusOK {
		t.Fatalf("r2 WRITE: %v", h)
	}
	r2.send(header{op: opMark, id: 3, addr: 6, length: uint64(len(p))}, p)
	if h := r2.reply(); h.status != statusOK {
		t.Fatalf("r2 mark: %v", h)
	}
	got := n.e.DrainNotifications(nil)
	if len(got) != 1 || got[0].From != from.Name || got[0].FromEpoch != from.Epoch || got[0].Name != "ok" || string(got[0].Msg) != "message" || got[0].Bytes != 128 {
		t.Fatalf("delivered %+v", got)
	}
	// A final copy of a delivered note is dropped, and answered OK.
	markFrame(6, rawMark(markKindFinal, 1, 0, true, "ok", "message", 128, false))
	expect(opMark, statusOK)
	if got := n.e.DrainNotifications(nil); len(got) != 0 || n.e.NotifyStats().Duplicates != 1 {
		t.Fatalf("final copy: delivered %+v, stats %+v", got, n.e.NotifyStats())
	}
}

// newNotifyNode is newNode with the engine's notification bounds set.
func newNotifyNode(t testing.TB, st *enginetest.MemStore, name string, memSize int, tc Config, total, per int) *node {
	t.Helper()
	cfg := engine.Config{Name: name, MetadataTimeout: 2 * time.Second, NotifyQueue: total, NotifyQueuePerSender: per, Retries: 4}
	if st != nil {
		cfg.Store = st
	}
	tr := New(tc)
	n := enginetest.NewNode(t, cfg, memSize, tr)
	return &node{e: n.Engine, mem: n.Mem, tr: tr}
}

// TestNotifyFlood: a target that does not drain holds at most its
// per-sender bound from one sender and its total bound from all; a flood
// beyond waits, then fails at the senders with ErrNotifyFull; memory does
// not grow; once drained, notifications flow again.
func TestNotifyFlood(t *testing.T) {
	const per, total = 8, 12
	st := enginetest.NewMemStore()
	defer st.Close()
	tc := Config{IOTimeout: time.Second}
	tgt := newNotifyNode(t, st, "target", 1<<16, tc, total, per)
	a := newNotifyNode(t, st, "a", 1<<16, tc, 0, 0)
	b := newNotifyNode(t, st, "b", 1<<16, tc, 0, 0)
	flood := func(n *node, count int) (ok, full int) {
		seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range count {
			wg.Go(func() {
				err := n.e.Notify(ctxT(t, 20*time.Second), seg, engine.Notify{Name: fmt.Sprint(i), Msg: make([]byte, 1024)})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ok++
				case errors.Is(err, engine.ErrNotifyFull):
					full++
				default:
					t.Errorf("notify %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		return ok, full
	}
	if ok, full := flood(a, 32); ok != per || full != 32-per {
		t.Fatalf("sender a: %d queued, %d refused as full; want %d, %d", ok, full, per, 32-per)
	}
	if ok, full := flood(b, 16); ok != total-per || full != 16-(total-per) {
		t.Fatalf("sender b: %d queued, %d refused as full; want %d, %d", ok, full, total-per, 16-(total-per))
	}
	if s := tgt.e.NotifyStats(); s.Queued != total || s.Full != 32-per+16-(total-per) {
		t.Fatalf("stats %+v", s)
	}
	if got := tgt.e.DrainNotifications(nil); len(got) != total {
		t.Fatalf("drained %d", len(got))
	}
	if ok, full := flood(a, 4); ok != 4 || full != 0 {
		t.Fatalf("after draining: %d queued, %d full", ok, full)
	}
}

// TestNotifyStaleEpoch: a sender that restarts under the same name
// replaces its old incarnation at the target: the old one's queued notes
// are dropped, and a late note from it is refused (ErrPeerReset on the
// wire).
func TestNotifyStaleEpoch(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := newNode(t, st, "target", 1<<16, Config{})
	old := newNode(t, st, "ini", 1<<16, Config{})
	notify := func(n *node, name string) {
		t.Helper()
		seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.e.Notify(ctxT(t, 5*time.Second), seg, engine.Notify{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		notify(old, fmt.Sprint("old ", i))
	}
	oldEpoch := old.e.Epoch()
	old.e.Close()
	restarted := newNode(t, st, "ini", 1<<16, Config{})
	notify(restarted, "new")
	got := tgt.e.DrainNotifications(nil)
	if len(got) != 1 || got[0].Name != "new" || got[0].FromEpoch != restarted.e.Epoch() {
		t.Fatalf("after a restart: %+v", got)
	}
	// A late note of the old incarnation (its connection outlived it).
	r := dialRawAs(t, tgt, auth.Party{Name: "ini", Epoch: oldEpoch})
	p := rawMark(markKindFinal, 1, 0, true, "late", "", 0, false)
	r.send(header{op: opMark, id: 0, addr: 99, length: uint64(len(p))}, p)
	if h := r.reply(); h.status != statusStaleEpoch {
		t.Fatalf("late note: %v", h)
	}
	if got := tgt.e.DrainNotifications(nil); len(got) != 0 {
		t.Fatalf("late note delivered: %+v", got)
	}
	if s := tgt.e.NotifyStats(); s.Stale != 4 {
		t.Fatalf("stats %+v: want 4 stale", s)
	}
}

// TestNotifyRetryOnce: while the target keeps dropping connections,
// notified submissions are retried (slices on fresh connections, the note
// resent alone after them): a submission that completes is notified
// exactly once, never before its bytes; one that fails at most once.
func TestNotifyRetryOnce(t *testing.T) {
	const tasks = 256
	size := uint64(16 << 10)
	if raceEnabled {
		size = 4 << 10
	}
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := newNotifyNode(t, st, "target", int(2*tasks*size), Config{SliceSize: 4096}, 0, 0)
	ini := newNotifyNode(t, st, "ini", int(2*tasks*size), Config{SliceSize: 4096}, 0, 0)
	seg, err := ini.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		round int
		ok    bool // its bytes were in place when it arrived
	}
	results := make(chan result, 1024)
	go func() {
		defer close(results)
		for n := range tgt.e.Notifications() {
			m, _ := decodeNoteMsg(n.Msg)
			results <- result{m.round, patternOK(tgt.buf()[m.off:m.off+m.n], m.seed)}
		}
	}()
	counts := map[int]int{}
	mismatch := map[int]bool{}
	record := func(r result) {
		counts[r.round]++
		if !r.ok {
			mismatch[r.round] = true
		}
	}
	stop := make(chan struct{})
	var breaker sync.WaitGroup
	breaker.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			for _, c := range tgt.tr.gate.Conns() {
				c.Close()
			}
		}
	})
	before := resends.Load()
	reqs := make([]engine.Request, tasks)
	completed := map[int]bool{}
	rounds := 0
	for r := 0; r < 400 && (r < 40 || resends.Load() == before); r++ {
		rounds++
		off := uint64(r%2) * tasks * size
		seed := uint64(r)<<8 | 0x33
		pattern(ini.buf()[off:off+tasks*size], seed)
		for i := range reqs {
			o := off + uint64(i)*size
			reqs[i] = engine.Request{Op: engine.Write, Local: ini.buf()[o : o+size], Target: seg, TargetAddr: tgt.base() + o}
		}
		msg := noteMsg{round: r, seed: seed, off: off, n: tasks * size}.encode()
		b, _ := ini.e.AllocateBatch(tasks)
		err := ini.e.SubmitNotify(b, reqs, engine.Notify{Name: "retry", Msg: msg})
		if err == nil {
			err = ini.e.Wait(ctxT(t, 30*time.Second), b)
			completed[r] = err == nil
		}
		if err := ini.e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		if !completed[r] {
			continue
		}
		// A completed round's note is queued already: take it before
		// a later round overwrites the range it describes.
		for counts[r] == 0 {
			select {
			case res := <-results:
				record(res)
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d completed, but no notification within 10s", r)
			}
		}
	}
	close(stop)
	breaker.Wait()
	tgt.e.Close()
	for res := range results {
		record(res)
	}
	ok := 0
	for r := range rounds {
		switch {
		case counts[r] > 1:
			t.Errorf("round %d notified %d times", r, counts[r])
		case completed[r] && mismatch[r]:
			t.Errorf("round %d notified before its bytes landed", r)
		case completed[r]:
			ok++
		}
	}
	t.Logf("%d rounds: %d completed, notes resent %d times, duplicates dropped %d", rounds, ok, resends.Load()-before, tgt.e.NotifyStats().Duplicates)
	if ok == 0 {
		t.Fatal("no round completed")
	}
	if resends.Load() == before {
		t.Fatal("no note was resent: the test did not break a connection at the right time")
	}
}

// TestNotifyCancel: slices still queued when their batch is cancelled are
// not sent (their tasks end CANCELED), the note of that submission is not
// delivered, and a submission already on the wire completes and is
// notified. The lane is held up deterministically: the target's queue for
// this sender is full, so its connection waits in delivery while a large
// batch fills the socket.
func TestNotifyCancel(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tc := Config{Lanes: 1, IOTimeout: 8 * time.Second}
	tgt := newNotifyNode(t, st, "target", 64<<20, tc, 0, 1)
	ini := newNotifyNode(t, st, "ini", 64<<20, tc, 0, 0)
	seg, err := ini.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	if err := ini.e.Notify(ctx, seg, engine.Notify{Name: "fills the queue"}); err != nil {
		t.Fatal(err)
	}
	blocked := make(chan error, 1)
	go func() { blocked <- ini.e.Notify(ctx, seg, engine.Notify{Name: "waits for room"}) }()
	time.Sleep(100 * time.Millisecond)
	// 48 MiB: more than the socket buffers hold while the target waits.
	big := make([]engine.Request, 48)
	for i := range big {
		o := uint64(i) << 20
		big[i] = engine.Request{Op: engine.Write, Local: ini.buf()[o : o+1<<20], Target: seg, TargetAddr: tgt.base() + o}
	}
	b1, _ := ini.e.AllocateBatch(len(big))
	if err := ini.e.SubmitNotify(b1, big, engine.Notify{Name: "in flight"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	small := make([]engine.Request, 16)
	for i := range small {
		o := uint64(60<<20) + uint64(i)*4096
		small[i] = engine.Request{Op: engine.Write, Local: ini.buf()[o : o+4096], Target: seg, TargetAddr: tgt.base() + o}
	}
	b2, _ := ini.e.AllocateBatch(len(small))
	if err := ini.e.SubmitNotify(b2, small, engine.Notify{Name: "cancelled"}); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Cancel(b2); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Submit(b2, small[:1]); !errors.Is(err, engine.ErrCanceled) {
		t.Fatalf("submit to a cancelled batch: %v", err)
	}
	// Let the target go on: its application receives from now on.
	arrived := tgt.e.Notifications()
	var names []string
	recv := func() {
		select {
		case n := <-arrived:
			names = append(names, n.Name)
		case <-time.After(10 * time.Second):
			t.Fatalf("after %q: no further notification in 10s", names)
		}
	}
	recv()
	if err := <-blocked; err != nil {
		t.Fatalf("notify that waited for room: %v", err)
	}
	if err := ini.e.Wait(ctx, b1); err != nil {
		t.Fatalf("batch on the wire: %v", err)
	}
	err = ini.e.Wait(ctx, b2)
	if !errors.Is(err, engine.ErrCanceled) {
		t.Fatalf("cancelled batch: %v", err)
	}
	for i := range small {
		if s, _ := ini.e.Status(b2, i); s.State != engine.StateCanceled || !errors.Is(s.Err, engine.ErrCanceled) {
			t.Fatalf("task %d: %+v", i, s)
		}
	}
	if s, _ := ini.e.BatchStatus(b2); s.State != engine.StateCanceled {
		t.Fatalf("batch status %+v", s)
	}
	recv()
	recv()
	// Both batches are done, so the target has decided on both notes:
	// the cancelled one was never accepted.
	want := []string{"fills the queue", "waits for room", "in flight"}
	if fmt.Sprint(names) != fmt.Sprint(want) || tgt.e.NotifyStats().Accepted != 3 {
		t.Fatalf("notifications %q (%+v), want %q", names, tgt.e.NotifyStats(), want)
	}
	ini.e.FreeBatch(b1)
	ini.e.FreeBatch(b2)
}

// TestNotifyAllocs: submitting with a notification, waiting and freeing,
// and a notification alone, allocate nothing in the initiator's process
// once warm. The target runs in a child process (it allocates each
// notification it hands to its application).
func TestNotifyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	d, stop := childTarget(t)
	defer stop()
	st := enginetest.NewMemStore()
	defer st.Close()
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tasks, size int
	}{{1, 4096}, {128, 4096}, {64, 1 << 20}} {
		t.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(t *testing.T) {
			n := newNode(t, st, "ini", c.tasks*c.size, Config{})
			seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "child", nil)
			if err != nil {
				t.Fatal(err)
			}
			reqs := make([]engine.Request, c.tasks)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: n.buf()[i*c.size : (i+1)*c.size], Target: seg, TargetAddr: d.Buffers[0].Addr + uint64(i*c.size)}
			}
			msg := make([]byte, 512)
			ctx := context.Background()
			var failed error
			run := func() {
				b, err := n.e.AllocateBatch(c.tasks)
				if err == nil {
					err = n.e.SubmitNotify(b, reqs, engine.Notify{Name: "layer", Msg: msg})
				}
				if err == nil {
					err = n.e.Wait(ctx, b)
				}
				if err == nil {
					err = n.e.FreeBatch(b)
				}
				if err == nil {
					err = n.e.Notify(ctx, seg, engine.Notify{Name: "alone", Msg: msg})
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			for range 10 {
				run()
			}
			allocs := enginetest.AllocsPerRun(20, run)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per notified batch", allocs)
			}
		})
	}
}

// FuzzDecodeMark: any bytes decode to a bounded mark or an error, without
// panicking; a decoded mark re-encodes to the same bytes.
func FuzzDecodeMark(f *testing.F) {
	f.Add(rawMark(markKindMark, 2, 17, true, "name", "message", 1<<20, false))
	f.Add(rawMark(markKindMark, 4, 1, false, "", "", 99, true))
	f.Add(rawMark(markKindFinal, 1, 0, true, "", "", 0, false))
	f.Add(make([]byte, markHdrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		mi, err := decodeMark(b)
		if err != nil {
			return
		}
		if len(mi.name) > driver.MaxNotifyName || len(mi.msg) > driver.MaxNotifyMsg || mi.lanes < 1 || mi.lanes > markMaxLanes {
			t.Fatalf("decoded out of bounds: %+v", mi)
		}
		body := mi.flags&markFlagBody != 0
		again := rawMark(mi.kind, mi.lanes, int(mi.frames), body, string(mi.name), string(mi.msg), mi.bytes, mi.flags&markFlagAbort != 0)
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %x, decoded from %x", again, b)
		}
	})
}

// childTarget starts runChildTarget in a child process and returns its
// descriptor; stop ends it.
func childTarget(t *testing.T) (*segment.Descriptor, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err == nil {
		var d *segment.Descriptor
		if d, err = segment.Unmarshal([]byte(strings.TrimSpace(line))); err == nil {
			return d, stop
		}
	}
	stop()
	t.Fatal(err)
	return nil, nil
}

// TestNotifyConformance runs the transport-independent notification cases.
func TestNotifyConformance(t *testing.T) {
	transporttest.RunNotify(t, func(testing.TB) engine.Transport {
		return New(Config{IOTimeout: time.Second})
	})
}

// BenchmarkNotify: plain batches and batches with a notification, taking
// turns: completion latency of each, submit to the target's application
// receiving the note, and the throughput ratio (notify/plain).
func BenchmarkNotify(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotify(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{}, c.tasks, c.size)
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
			transporttest.BenchNotifyStream(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{}, c.tasks, c.size)
		})
	}
}

func BenchmarkNotifyStreamRemote(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotifyStreamRemote(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{}, c.tasks, c.size)
		})
	}
}

// BenchmarkNotifyRemote is BenchmarkNotify with the target in a child
// process, as deployed: its application's wake-ups run there, not among
// the initiator's goroutines.
func BenchmarkNotifyRemote(b *testing.B) {
	for _, c := range []struct{ tasks, size int }{{1, 4096}, {128, 4096}, {128, 64 << 10}, {64, 1 << 20}} {
		b.Run(fmt.Sprintf("%dx%d", c.tasks, c.size), func(b *testing.B) {
			transporttest.BenchNotifyRemote(b, func(testing.TB) engine.Transport { return New(Config{}) }, transporttest.Options{}, c.tasks, c.size)
		})
	}
}

// TestNotifyAuth: with a cluster secret on the target, an initiator
// without it cannot notify (its handshake is refused: auth.ErrDenied) and
// nothing is delivered; one holding it can.
func TestNotifyAuth(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	s := testSecret(t)
	tgt := newNode(t, st, "target", 1<<16, Config{Auth: s})
	for _, c := range []struct {
		name   string
		secret bool
	}{{"stranger", false}, {"member", true}} {
		var cfg Config
		if c.secret {
			cfg.Auth = s
		}
		ini := newNode(t, st, c.name, 1<<16, cfg)
		seg, err := ini.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
		if err == nil {
			err = ini.e.Notify(ctxT(t, 5*time.Second), seg, engine.Notify{Name: c.name})
		}
		if c.secret != (err == nil) || !c.secret && !errors.Is(err, auth.ErrDenied) {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	got := tgt.e.DrainNotifications(nil)
	if len(got) != 1 || got[0].From != "member" {
		t.Fatalf("delivered %+v", got)
	}
}
