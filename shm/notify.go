package shm

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/unix"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// Notifications (driver.Notifier). The initiator copies a submission's
// slices itself, so it knows when every byte is in the target's memory:
// once the last copy of the submission is done (on whichever goroutine
// did it), it writes the note into a free slot of the connection's note
// ring (noteRing, in the control memory) and publishes it; the note is
// then done. The ring's head is written after the copies and read by the
// target before it reads the data, so the target sees the data first.
//
// The target's reader takes the notes in order and hands each to its
// engine's inbox; while the inbox is full it waits (it has custody: the
// note is dropped only if its sender's incarnation has been replaced or
// the target closes), holding the note's slot. A sender whose notes the
// target does not take runs out of slots; a note then waits at the
// initiator, and one that finds no slot within half the I/O timeout
// fails with ErrNotifyFull, before anything of it was sent. So nothing
// grows with a flood, and a notified batch completes without waiting for
// the target: a plain batch never involves the target, and a notified
// one only writes its slot (the BELL below aside).
//
// No system call per note: the target's reader watches the ring for a
// moment after each note (noteLinger) and rings are rung only while it
// sleeps on the socket:
//
//	initiator → target  BELL      (empty) the ring has notes; sent by the
//	                              publisher that cleared the ring's sleep
//	target → initiator  ROOM      (empty) a slot is free; sent by the
//	                              target that cleared the ring's want
//	target → initiator  NOTELOST  u64 id | u16 status: a note taken from
//	                              the ring was not delivered (its sender
//	                              was replaced, the target is closing)
//
// The initiator's batch has succeeded by then: the initiator logs it
// and counts it (Stats.NotesLost), and the target's NotifyStats count it.
const (
	msgNoteBell wire.Type = 13 // 10 is the handshake's verdict; 11 and 12 were te 0.x's NOTE and NOTEACK
	msgNoteLost wire.Type = 14
	msgNoteRoom wire.Type = 15
)

// NOTELOST statuses.
const (
	noteOK    = 0
	noteStale = 2 // the sender's incarnation was replaced
	noteNo    = 3 // not delivered (the target is closing)
)

// noteLinger is how long the target's reader keeps watching the ring
// after a note while notes come less than that apart (watchFor): a
// sender of a note per batch then finds it awake and wakes nothing.
// noteNap is how long after a note it then sleeps on the ring's futex,
// which a publisher wakes with one system call, before it sleeps on the
// socket (a BELL: a message and a goroutine woken on each side). A watch
// holds a core that the initiator's copiers on the same host may need,
// and a wake-up costs both sides (tens of µs on a 2-CPU VM), so sparse
// notes are slept for and dense ones watched for.
const noteLinger = 200 * time.Microsecond

var noteNap = 10 * time.Millisecond // a variable for the tests

var (
	// ErrNotifyUnsupported: the target's shm transport does not carry
	// notifications (an older version). Nothing was copied.
	ErrNotifyUnsupported = fmt.Errorf("shm: target does not carry notifications: %w", engine.ErrNotifyUnsupported)

	errNoNotifyRemote = fmt.Errorf("%w (its descriptor's shm part lacks notify)", ErrNotifyUnsupported)
	errNotifyFull     = fmt.Errorf("shm: notification not sent: the target took none of this process's for half the I/O timeout (its application does not drain them): %w", driver.ErrNotifyFull)
	errNoteRefused    = errors.New("shm: notification not sent")
	errSliceCanceled  = fmt.Errorf("shm: not copied: %w", driver.ErrCanceled)
)

func remoteNotifies(d *segment.Descriptor) bool {
	if d == nil {
		return false
	}
	pr, ok := d.Protocol(segment.ProtoSHM)
	return ok && pr.SHM != nil && pr.SHM.Notify
}

// failures are the first failures of a submission's copies.
type failures struct {
	hard  error // a copy failed: not delivered
	trans error // a copy failed transiently: the engine resends the note
}

func (f *failures) add(err error) {
	if errors.Is(err, driver.ErrTransient) {
		if f.trans == nil {
			f.trans = err
		}
	} else if f.hard == nil {
		f.hard = err
	}
}

func (f *failures) merge(g failures) {
	if f.trans == nil {
		f.trans = g.trans
	}
	if f.hard == nil {
		f.hard = g.hard
	}
}

// snote is the initiator's state of one note whose slices are copied by
// several goroutines (a job).
type snote struct {
	p *peer
	n *driver.Note
	// left counts the slices not yet done; the last copyDone sends.
	left atomic.Int64
	mu   sync.Mutex
	f    failures
}

// waitNote is a note waiting at the initiator for a ring slot, until
// its deadline.
type waitNote struct {
	n  *driver.Note
	dl time.Time
}

func (p *peer) getNote(n *driver.Note) *snote {
	p.noteMu.Lock()
	defer p.noteMu.Unlock()
	var sn *snote
	if k := len(p.nfree); k > 0 {
		sn = p.nfree[k-1]
		p.nfree = p.nfree[:k-1]
	} else {
		sn = &snote{p: p}
	}
	sn.n = n
	return sn
}

// record notes a run of copies' failures.
func (sn *snote) record(f failures) {
	if f == (failures{}) {
		return
	}
	sn.mu.Lock()
	sn.f.merge(f)
	sn.mu.Unlock()
}

// copied runs once every copy of the job's submission is done: it sends
// the note, or completes it when a copy failed.
func (sn *snote) copied() {
	p, n, f := sn.p, sn.n, sn.f
	sn.n, sn.f = nil, failures{}
	p.noteMu.Lock()
	p.nfree = append(p.nfree, sn)
	p.noteMu.Unlock()
	p.copied(n, f)
}

// copied sends n once every copy of its submission is done, or completes
// it when a copy failed (f).
func (p *peer) copied(n *driver.Note, f failures) {
	err := f.trans
	if err == nil && f.hard != nil {
		err = fmt.Errorf("%w: a slice of its submission failed: %w", errNoteRefused, f.hard)
	}
	if err != nil {
		n.Done(err)
		return
	}
	p.noteMu.Lock()
	p.sendNoteLocked(n)
}

// copyNote copies a submission of at most copyChunk slices in the
// calling goroutine and sends its note: when every copy succeeded and
// the ring has a slot at once, it publishes the note before it completes
// the slices, and completes both in one step (driver.DoneAllNote);
// otherwise it completes the slices and then sends or fails the note as
// copied does.
func (p *peer) copyNote(ss []*driver.Slice, res []result, n *driver.Note) {
	c0 := cost.Now()
	ok := copyRun(ss, res, false)
	c0 = cost.Move.Since(c0)
	if ok {
		p.noteMu.Lock()
		if ok, w := p.publishNowLocked(n); ok {
			driver.DoneAllNote(ss, n)
			cost.Complete.Since(c0)
			p.wake(w)
			return
		}
		p.noteMu.Unlock()
		driver.DoneAll(ss)
		cost.Complete.Since(c0)
		p.copied(n, failures{})
		return
	}
	var f failures
	for i, s := range ss {
		if err := res[i].err; err != nil {
			f.add(err)
		}
		s.Done(res[i].n, res[i].err)
	}
	clear(res[:len(ss)])
	cost.Complete.Since(c0)
	p.copied(n, f)
}

// publishNowLocked publishes n in the ring if the peer is up, no note
// waits and a slot is free; then it releases noteMu, and the caller
// completes n as delivered and then wakes the target's reader (wake with
// w). Otherwise noteMu stays held.
func (p *peer) publishNowLocked(n *driver.Note) (ok bool, w uint32) {
	if p.dead.Load() || p.ring == nil || len(p.waiting) > 0 || !p.roomLocked() {
		return false, 0
	}
	w = p.publishLocked(n)
	p.holdWake(w)
	p.noteMu.Unlock()
	return true, w
}

// sendNoteLocked publishes n in the ring and completes it, or leaves it
// waiting for a slot (then ROOM or the expiry timer completes it).
// noteMu is held on entry and released.
func (p *peer) sendNoteLocked(n *driver.Note) {
	ok, w := p.publishNowLocked(n)
	if !ok && p.awaitSlotLocked() {
		ok, w = p.publishNowLocked(n)
	}
	if ok {
		n.Done(nil)
		p.wake(w)
		return
	}
	if p.dead.Load() || p.ring == nil {
		p.noteMu.Unlock()
		n.Done(errGone)
		return
	}
	p.waiting = append(p.waiting, waitNote{n, time.Now().Add(p.t.cfg.IOTimeout / 2)})
	if len(p.waiting) == 1 {
		if p.expiry == nil {
			p.expiry = time.AfterFunc(p.t.cfg.IOTimeout/2, p.expireNotes)
		} else {
			p.expiry.Reset(p.t.cfg.IOTimeout / 2)
		}
	}
	p.flushNotes()
}

// slotSpin is how long a note that finds the ring full watches it for a
// free slot while the target's reader is awake, before it waits for
// ROOM: an awake reader frees a slot within microseconds, while ROOM
// costs a message each way, and wake-ups, per note (a stream of notes
// faster than the target takes them would pay that for every one).
const slotSpin = 50 * time.Microsecond

// awaitSlotLocked watches, for at most slotSpin, for the target to free a
// slot when the ring is full, no note waits and the target's reader is
// awake; it reports whether it watched (then the caller tries again).
// noteMu is held on entry and on return, and released while it watches.
func (p *peer) awaitSlotLocked() bool {
	r := p.ring
	if r == nil || len(p.waiting) > 0 || r.sleep.Load() != 0 {
		return false
	}
	tail := p.tail
	// users keeps the control memory mapped while noteMu is not held
	// (teardown waits for it after marking the peer dead).
	p.users.Add(1)
	p.noteMu.Unlock()
	t0 := time.Now()
	for spins := 1; !p.dead.Load() && r.tail.Load() == tail && r.sleep.Load() == 0; spins++ {
		if spins%32 == 0 && time.Since(t0) > slotSpin {
			break
		}
		runtime.Gosched()
	}
	p.users.Add(-1)
	p.noteMu.Lock()
	return true
}

// roomLocked reports whether the ring has a free slot. noteMu is held.
// It reads the target's tail only when the tail it last read leaves no
// slot: the target writes tail after every note, so reading it each time
// would fetch that cache line from the target's core on every note.
func (p *peer) roomLocked() bool {
	if p.head-p.tail < noteSlots {
		return true
	}
	p.tail = p.ring.tail.Load()
	return p.head-p.tail < noteSlots
}

// publishLocked writes n into the next slot and publishes it; it reports
// how the target's reader sleeps (clearSleep: 0 when it is awake), and
// the caller wakes it (holdWake, then wake once noteMu is released).
// noteMu is held.
func (p *peer) publishLocked(n *driver.Note) (wake uint32) {
	s := &p.ring.slots[p.head%noteSlots]
	s.id, s.bytes = n.ID, n.Bytes
	s.nameLen, s.msgLen = uint32(len(n.Name)), uint32(len(n.Msg))
	k := copy(s.data[:], n.Name)
	copy(s.data[k:], n.Msg)
	p.head++
	p.ring.head.Store(p.head)
	return p.ring.clearSleep()
}

// holdWake keeps the control memory mapped (p.users) until wake, for a
// wake on the ring's futex; noteMu is held.
func (p *peer) holdWake(w uint32) {
	if w == sleepFutex {
		p.users.Add(1)
	}
}

// wake wakes the target's reader as it slept (w is clearSleep's answer,
// held by holdWake): a futex wake is one short system call, made on the
// calling goroutine once it has completed the note, since the completion
// need not wait for it and handing it to the bell goroutine would cost
// more; BELL goes through the bell goroutine.
func (p *peer) wake(w uint32) {
	switch w {
	case sleepFutex:
		unix.FutexWake(&p.ring.sleep, 1)
		p.users.Add(-1)
	case sleepSocket:
		p.ringBell()
	}
}

// wakeReader wakes the target's reader if it sleeps on the ring's futex,
// so that it reads the socket: fetch calls it after a MAPREQ.
func (p *peer) wakeReader() {
	p.noteMu.Lock()
	if !p.dead.Load() && p.ring != nil && p.ring.sleep.Load() == sleepFutex && p.ring.sleep.CompareAndSwap(sleepFutex, 0) {
		unix.FutexWake(&p.ring.sleep, 1)
	}
	p.noteMu.Unlock()
}

// flushNotes publishes the waiting notes that have a slot now and
// completes them; noteMu is held on entry and released.
func (p *peer) flushNotes() {
	for {
		var sent [noteSlots]*driver.Note
		k, wake, again := 0, uint32(0), false
		for len(p.waiting) > 0 && p.roomLocked() {
			if k == len(sent) {
				again = true
				break
			}
			n := p.waiting[0].n
			if w := p.publishLocked(n); w != 0 {
				wake = w
			}
			sent[k] = n
			k++
			m := copy(p.waiting, p.waiting[1:])
			p.waiting[m] = waitNote{}
			p.waiting = p.waiting[:m]
		}
		switch {
		case again:
		case len(p.waiting) == 0:
			p.ring.want.Store(0)
			if p.expiry != nil {
				p.expiry.Stop()
			}
		default:
			// ROOM cleared want: set it again, then look once more
			// (a slot freed in between brought no ROOM).
			p.ring.want.Store(1)
			again = p.roomLocked()
		}
		p.holdWake(wake)
		p.noteMu.Unlock()
		for _, n := range sent[:k] {
			n.Done(nil)
		}
		p.wake(wake)
		if !again {
			return
		}
		p.noteMu.Lock()
		if p.dead.Load() {
			p.noteMu.Unlock()
			return
		}
	}
}

// ringBell wakes the target's reader: it asks the peer's bell
// goroutine to, so the system call (and the wake-up it makes) is off the
// completing batch's way.
func (p *peer) ringBell() {
	select {
	case p.bells <- struct{}{}:
	default: // one is on its way
	}
}

// ringer sends BELL for each ringBell until the peer goes down.
func (p *peer) ringer() {
	for {
		select {
		case <-p.bells:
			// A failed send needs no answer: the reader sees the
			// connection end.
			uds.Send(p.c, p.bell, nil)
		case <-p.gone:
			return
		}
	}
}

// roomFreed answers ROOM (the reader calls it).
func (p *peer) roomFreed() {
	p.noteMu.Lock()
	if p.dead.Load() {
		p.noteMu.Unlock()
		return
	}
	p.flushNotes()
}

// expireNotes fails the notes that waited for a slot past their
// deadline with ErrNotifyFull: nothing of them was sent.
func (p *peer) expireNotes() {
	p.noteMu.Lock()
	now := time.Now()
	k := 0
	for k < len(p.waiting) && !now.Before(p.waiting[k].dl) {
		k++
	}
	expired := make([]*driver.Note, k) // a failure: it may allocate
	for i := range k {
		expired[i] = p.waiting[i].n
	}
	m := copy(p.waiting, p.waiting[k:])
	clear(p.waiting[m:])
	p.waiting = p.waiting[:m]
	if m > 0 {
		p.expiry.Reset(p.waiting[0].dl.Sub(now))
	} else {
		p.ring.want.Store(0)
	}
	p.noteMu.Unlock()
	for _, n := range expired {
		n.Done(errNotifyFull)
	}
}

// noteLost logs a note the target took from the ring but did not
// deliver (NOTELOST): its batch has succeeded.
func (p *peer) noteLost(id uint64, st uint16) {
	p.t.notesLost.Add(1)
	why := "the target is closing"
	if st == noteStale {
		why = "the target has seen a newer engine under this one's name (a restart, or two engines with one name)"
	}
	p.t.lost.Warn("shm: a notification whose batch succeeded was not delivered", "segment", p.name, "note", id, "reason", why)
}

// failNotes fails the notes waiting for a slot (the connection ended).
// Notes already in the ring are the target's.
func (p *peer) failNotes() {
	p.noteMu.Lock()
	ns := p.waiting
	p.waiting = nil
	if p.expiry != nil {
		p.expiry.Stop()
	}
	p.noteMu.Unlock()
	for _, w := range ns {
		w.n.Done(errGone)
	}
}

// submitNotify is driver.Notifier.SubmitNotify.
func (t *Transport) submitNotify(ss []*driver.Slice, n *driver.Note) {
	p, _ := n.Peer.(*peer)
	switch {
	case p == nil:
		doneAll(ss, errForeign)
		n.Done(errForeign)
		return
	case n.Remote != p.notifyDesc.Load():
		if !remoteNotifies(n.Remote) {
			doneAll(ss, errNoNotifyRemote)
			n.Done(errNoNotifyRemote)
			return
		}
		p.notifyDesc.Store(n.Remote)
	}
	if len(ss) == 0 {
		p.noteMu.Lock()
		p.sendNoteLocked(n)
		return
	}
	t.submit(ss, p, n)
}

func doneAll(ss []*driver.Slice, err error) {
	for _, s := range ss {
		s.Done(0, err)
	}
}

// ---- target side ----

func appendNoteLost(dst []byte, id uint64, st uint16) []byte {
	var e wire.Enc
	e.U64(id)
	e.U16(st)
	return proto.Append(dst, msgNoteLost, 0, e.B)
}

func parseNoteLost(p []byte) (id uint64, st uint16, err error) {
	d := wire.NewDec(p)
	id, st = d.U64(), d.U16()
	return id, st, d.Finish()
}

// takeNotes hands the notes the initiator published in the ring to the
// engine's inbox, in order, waiting while the inbox has no room, and
// frees their slots; it reports whether it took any. The ring is the
// initiator's to write: a slot is copied before it is read, and a head
// beyond the ring's slots or a slot beyond the bounds ends the
// connection. Only the reader calls it.
func (sc *serverConn) takeNotes() (took bool, err error) {
	r := sc.ring
	for {
		head := r.head.Load()
		if head == sc.tail {
			return took, nil
		}
		if head-sc.tail > noteSlots {
			return took, fmt.Errorf("%w: note ring head %d with %d taken: beyond its %d slots", ErrProtocol, head, sc.tail, noteSlots)
		}
		for sc.tail != head {
			s := &r.slots[sc.tail%noteSlots]
			id, bytes, nl, ml := s.id, s.bytes, s.nameLen, s.msgLen
			if nl > driver.MaxNotifyName || ml > driver.MaxNotifyMsg {
				return took, fmt.Errorf("%w: note of %d+%d bytes in the ring, beyond %d+%d", ErrProtocol, nl, ml, driver.MaxNotifyName, driver.MaxNotifyMsg)
			}
			if sc.noteBuf == nil {
				sc.noteBuf = make([]byte, driver.MaxNotifyName+driver.MaxNotifyMsg)
			}
			b := sc.noteBuf[:nl+ml]
			copy(b, s.data[:])
			d := driver.Delivery{From: sc.from, ID: id, Bytes: bytes, Name: b[:nl], Msg: b[nl:]}
			st := sc.deliver(&d)
			sc.tail++
			r.tail.Store(sc.tail)
			took = true
			if st != noteOK {
				sc.send(appendNoteLost(sc.noteOut[:0], id, st))
			}
			if r.want.Load() != 0 && r.want.CompareAndSwap(1, 0) {
				sc.send(proto.Append(sc.noteOut[:0], msgNoteRoom, 0, nil))
			}
		}
	}
}

// deliver hands one note to the inbox, waiting for room until the
// transport closes, and returns its NOTELOST status (noteOK: delivered,
// or a copy already was).
func (sc *serverConn) deliver(d *driver.Delivery) uint16 {
	t := sc.t
	ib := t.host.Inbox()
	if ib == nil {
		return noteNo
	}
	err := ib.Deliver(driver.NoWait, d)
	if errors.Is(err, driver.ErrNotifyFull) {
		err = ib.Deliver(t.ctx, d)
	}
	switch {
	case err == nil:
		return noteOK
	case errors.Is(err, driver.ErrPeerReset):
		return noteStale
	}
	if !t.closed.Load() {
		t.log.Warn("shm: notification not delivered", "pid", sc.cred.PID, "from", sc.from.Name, "err", err)
	}
	return noteNo
}

// send writes one message to the initiator; a failure is left to the
// reader, which sees the connection end.
func (sc *serverConn) send(msg []byte) {
	sc.noteOut = msg
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.dead.Load() {
		return
	}
	sc.c.SetWriteDeadline(time.Now().Add(sc.t.cfg.IOTimeout))
	uds.Send(sc.c, msg, nil)
}

// lingerNotes watches the ring for d, and at least polls times (a reader
// that was not running meanwhile has not watched; the application's
// goroutine, readied by the note, runs meanwhile), and reports whether a
// note came.
func (sc *serverConn) lingerNotes(d time.Duration, polls int) bool {
	t0 := time.Now()
	for i := 0; i < polls || time.Since(t0) < d; i++ {
		if sc.ring.head.Load() != sc.tail {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// watchFor is how long, and at least how many times, the reader watches
// the ring after a note: noteLinger while notes come less than spinGap
// apart on average, so that the next finds it awake; otherwise a few
// polls only, since it would watch in vain, and the futex's wake-up costs
// the host less than a watch that holds a core the initiator's copiers
// may need.
func (sc *serverConn) watchFor() (time.Duration, int) {
	if sc.gap >= spinGap {
		return 0, napPolls
	}
	return noteLinger, lingerPolls
}

const (
	spinGap     = noteLinger
	lingerPolls = 200
	napPolls    = 2
)

// nap sleeps on the ring's futex until a publisher (or the initiator
// after a MAPREQ, or the target closing) wakes it, for at most d, and
// reports whether it was woken; otherwise the caller sleeps on the
// socket. An initiator that knows no futex leaves its notes unannounced
// meanwhile: they wait for d at most.
func (sc *serverConn) nap(d time.Duration) bool {
	r := sc.ring
	r.sleep.Store(sleepFutex)
	if r.head.Load() != sc.tail || sc.dead.Load() {
		r.sleep.Store(0)
		return true
	}
	sc.slot.Wait()
	unix.FutexWait(&r.sleep, sleepFutex, d)
	sc.slot.Work()
	return r.sleep.Load() != sleepFutex
}

// wakeNap ends the reader's nap: the connection goes away. It wakes
// whatever the word holds: the initiator writes it too.
func (sc *serverConn) wakeNap() {
	sc.mu.Lock()
	if r := sc.ring; r != nil {
		r.sleep.CompareAndSwap(sleepFutex, 0)
		unix.FutexWake(&r.sleep, 1)
	}
	sc.mu.Unlock()
}

// unmapRing unmaps the reader's view of the ring as it exits.
func (sc *serverConn) unmapRing() {
	sc.mu.Lock()
	sc.ringMem.Unmap()
	sc.ring = nil
	sc.mu.Unlock()
}
