package tcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// Notifications (driver.Notifier). A submission's slices go over one or
// more lanes in contiguous runs; each run is followed on its lane by a
// mark frame (op 4): the note's ID (header addr), the number of lanes the
// submission used, and how many data frames immediately before it on the
// connection were its run. The target serves a connection's frames in
// order, so when a mark arrives its run has been applied; it counts the
// marks of a note and hands the note to the engine's Inbox when the last
// one is in and every run was applied without a failure. One mark (the
// first lane's) carries the name and message. A note alone, or one resent
// after a broken connection once its data has completed, is one mark of
// kind "final", delivered at once. Marks are answered like data frames
// (in order, batched), so the initiator needs no extra round trip.
//
// Mark payload, little-endian:
//
//	off len field
//	  0   1 kind     0 mark, 1 final
//	  1   1 flags    bit 0 body (name and message follow), bit 1 abort
//	                 (a slice of the run was cancelled and not sent: the
//	                 note must not be delivered)
//	  2   2 lanes    marks of this note, 1..markMaxLanes (1 for final)
//	  4   4 frames   data frames of the run, immediately before this one
//	  8   8 bytes    the submission's byte count
//	 16   2 name     name length, <= driver.MaxNotifyName
//	 18   2 msg      message length, <= driver.MaxNotifyMsg
//	 20   4 zero
//	 24     name, then message (body only; else both lengths are 0)
//
// The reply's status: 0 counted or delivered; statusNotifyFull when the
// target's queue stayed full; statusStaleEpoch when the initiator's
// incarnation was replaced by a newer one; statusNotDelivered when a run
// failed or was aborted; statusBadRequest for a malformed mark.
const (
	opMark op = 4

	markHdrLen   = 24
	markMaxLen   = markHdrLen + driver.MaxNotifyName + driver.MaxNotifyMsg
	markMaxLanes = 1 << 10

	markKindMark  = 0
	markKindFinal = 1
	markFlagBody  = 1
	markFlagAbort = 2
)

var (
	// ErrNotifyUnsupported: the target's tcp transport does not carry
	// notifications (an older version). Nothing was sent.
	ErrNotifyUnsupported = fmt.Errorf("tcp: target does not carry notifications: %w", engine.ErrNotifyUnsupported)

	errNotifyFull     = fmt.Errorf("tcp: target refused the notification: %w", driver.ErrNotifyFull)
	errNotDelivered   = errors.New("tcp: target did not deliver the notification: a slice of its submission failed there or was not sent")
	errSliceCanceled  = fmt.Errorf("tcp: not sent: %w", driver.ErrCanceled)
	errNoteForeign    = fmt.Errorf("tcp: notification for a foreign peer: %w", engine.ErrInvalidRequest)
	errMarkMalformed  = errors.New("tcp: malformed mark")
	errMarkBadLength  = errors.New("tcp: mark length out of bounds")
	errNoNotifyRemote = fmt.Errorf("%w (its descriptor's tcp part lacks notify)", ErrNotifyUnsupported)
)

func remoteNotifies(d *segment.Descriptor) bool {
	if d == nil {
		return false
	}
	pr, ok := d.Protocol(segment.ProtoTCP)
	return ok && pr.TCP != nil && pr.TCP.Notify
}

// mark is one mark frame of a note on one lane.
type mark struct {
	tn     *tnote
	frames int
	abort  bool   // set by the writer: a slice of the run was not sent
	buf    []byte // the encoded payload (the abort bit is set in place)
}

// tnote is the initiator's state of one note in flight: its marks.
type tnote struct {
	p     *peer
	n     *driver.Note
	left  atomic.Int32 // marks without an outcome
	mu    sync.Mutex
	hard  error // first failure that says the note was not delivered
	trans error // first failure that leaves it unknown
	marks []mark
}

func (p *peer) getNote() *tnote {
	p.nmu.Lock()
	defer p.nmu.Unlock()
	if k := len(p.nfree); k > 0 {
		tn := p.nfree[k-1]
		p.nfree = p.nfree[:k-1]
		return tn
	}
	tn := &tnote{p: p, marks: make([]mark, len(p.lanes))}
	for i := range tn.marks {
		tn.marks[i].tn = tn
	}
	return tn
}

func (p *peer) putNote(tn *tnote) {
	tn.n, tn.hard, tn.trans = nil, nil, nil
	p.nmu.Lock()
	p.nfree = append(p.nfree, tn)
	p.nmu.Unlock()
}

// encode fills m's payload for note n.
func (m *mark) encode(n *driver.Note, kind byte, lanes, frames int, body bool) {
	m.frames, m.abort = frames, false
	b := m.buf[:0]
	if cap(b) < markHdrLen {
		b = make([]byte, 0, markHdrLen+64)
	}
	b = b[:markHdrLen]
	clear(b)
	b[0] = kind
	binary.LittleEndian.PutUint16(b[2:], uint16(lanes))
	binary.LittleEndian.PutUint32(b[4:], uint32(frames))
	binary.LittleEndian.PutUint64(b[8:], n.Bytes)
	if body {
		b[1] = markFlagBody
		binary.LittleEndian.PutUint16(b[16:], uint16(len(n.Name)))
		binary.LittleEndian.PutUint16(b[18:], uint16(len(n.Msg)))
		b = append(b, n.Name...)
		b = append(b, n.Msg...)
	}
	m.buf = b
}

// setAbort marks the payload as aborted (the writer found a cancelled
// slice in the run).
func (m *mark) setAbort() {
	m.abort = true
	m.buf[1] |= markFlagAbort
}

// done records one mark's outcome; the last one completes the note.
func (m *mark) done(err error) {
	tn := m.tn
	if err != nil {
		tn.mu.Lock()
		if errors.Is(err, driver.ErrTransient) {
			if tn.trans == nil {
				tn.trans = err
			}
		} else if tn.hard == nil {
			tn.hard = err
		}
		tn.mu.Unlock()
	}
	if tn.left.Add(-1) != 0 {
		return
	}
	// A broken connection leaves the note unknown: the engine resends
	// it alone once the data is in place, whatever else was refused.
	err = tn.trans
	if err == nil {
		err = tn.hard
	}
	n := tn.n
	tn.p.putNote(tn)
	n.Done(err)
}

// submitNotify is driver.Notifier.SubmitNotify.
func (t *Transport) submitNotify(ss []*driver.Slice, n *driver.Note) {
	p, _ := n.Peer.(*peer)
	switch {
	case p == nil:
		doneAll(ss, errNoteForeign)
		n.Done(errNoteForeign)
		return
	case !remoteNotifies(n.Remote):
		doneAll(ss, errNoNotifyRemote)
		n.Done(errNoNotifyRemote)
		return
	}
	for _, s := range ss {
		if s.Peer != n.Peer {
			doneAll(ss, errNoteForeign)
			n.Done(errNoteForeign)
			return
		}
	}
	p.submitNotify(ss, n)
}

// resends counts notes resent alone after a broken connection (tests).
var resends atomic.Int64

func (p *peer) submitNotify(ss []*driver.Slice, n *driver.Note) {
	tn := p.getNote()
	tn.n = n
	if len(ss) == 0 {
		if n.Attempt() > 0 {
			resends.Add(1)
		}
		l := p.lanes[int(p.rr.Add(1))%len(p.lanes)]
		if n.Attempt() > 0 {
			l = p.freshLane()
		}
		m := &tn.marks[0]
		m.encode(n, markKindFinal, 1, 0, true)
		tn.left.Store(1)
		l.enqueue(nil, m)
		return
	}
	var total int
	for _, s := range ss {
		total += len(s.Local)
	}
	k := min(len(p.lanes), max(1, total/laneShare), len(ss), markMaxLanes)
	per := (len(ss) + k - 1) / k
	k = (len(ss) + per - 1) / per // runs actually used
	tn.left.Store(int32(k))
	start := int(p.rr.Add(1))
	for i := 0; len(ss) > 0; i++ {
		r := min(per, len(ss))
		m := &tn.marks[i]
		m.encode(n, markKindMark, k, r, i == 0)
		p.lanes[(start+i)%len(p.lanes)].enqueue(ss[:r], m)
		ss = ss[r:]
	}
}

// item is a queued or in-flight frame of a lane: a slice or a mark.
type item struct {
	s *driver.Slice
	m *mark
}

func doneItems(its []item, err error) {
	for _, it := range its {
		if it.s != nil {
			it.s.Done(0, err)
		} else if it.m != nil {
			it.m.done(err)
		}
	}
}

// dropCanceled completes the cancelled slices of a batch about to be
// written (they are not sent) and aborts the marks whose runs lost one.
// A run and its mark are queued together, so they are in one batch.
func dropCanceled(batch []item) {
	streak := 0 // data frames sent in a row before the current item
	for i := range batch {
		it := &batch[i]
		switch {
		case it.s != nil && it.s.Canceled():
			s := it.s
			it.s = nil
			streak = 0
			s.Done(0, errSliceCanceled)
		case it.s != nil:
			streak++
		case it.m != nil && it.m.frames > streak:
			it.m.setAbort()
		}
	}
}

// ---- target side ----

// markInfo is a decoded mark payload.
type markInfo struct {
	kind   byte
	flags  byte
	lanes  int
	frames uint64
	bytes  uint64
	name   []byte
	msg    []byte
}

// decodeMark parses a mark payload. It does not allocate; name and msg
// alias b.
func decodeMark(b []byte) (markInfo, error) {
	if len(b) < markHdrLen || len(b) > markMaxLen {
		return markInfo{}, errMarkBadLength
	}
	mi := markInfo{
		kind:   b[0],
		flags:  b[1],
		lanes:  int(binary.LittleEndian.Uint16(b[2:])),
		frames: uint64(binary.LittleEndian.Uint32(b[4:])),
		bytes:  binary.LittleEndian.Uint64(b[8:]),
	}
	nl, ml := int(binary.LittleEndian.Uint16(b[16:])), int(binary.LittleEndian.Uint16(b[18:]))
	switch {
	case mi.kind > markKindFinal, mi.flags&^(markFlagBody|markFlagAbort) != 0,
		binary.LittleEndian.Uint32(b[20:]) != 0,
		mi.lanes < 1 || mi.lanes > markMaxLanes,
		mi.kind == markKindFinal && (mi.lanes != 1 || mi.frames != 0 || mi.flags&markFlagBody == 0),
		nl > driver.MaxNotifyName || ml > driver.MaxNotifyMsg,
		mi.flags&markFlagBody == 0 && (nl != 0 || ml != 0),
		markHdrLen+nl+ml != len(b):
		return markInfo{}, errMarkMalformed
	}
	mi.name = b[markHdrLen : markHdrLen+nl]
	mi.msg = b[markHdrLen+nl:]
	return mi, nil
}

// pendingNote is a note of several marks, some of which have arrived.
type pendingNote struct {
	lanes int
	got   int
	bad   bool
	body  bool
	bytes uint64
	name  []byte
	msg   []byte
}

// maxPendingNotes bounds the notes one sender has partly marked: marks
// lost with a broken connection leave a note incomplete (its resend
// delivers it), and the oldest such one makes room.
const maxPendingNotes = 1024

type noteKey struct {
	from driver.Sender
	id   uint64
}

// noteTable holds the target's partly marked notes, by sender.
type noteTable struct {
	mu      sync.Mutex
	notes   map[noteKey]*pendingNote
	senders map[driver.Sender]int // pending notes per sender
}

// arrive counts one mark of a multi-lane note; it returns the note when
// this was its last mark.
func (nt *noteTable) arrive(from driver.Sender, id uint64, mi *markInfo, bad bool) *pendingNote {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if nt.notes == nil {
		nt.notes = map[noteKey]*pendingNote{}
		nt.senders = map[driver.Sender]int{}
	}
	k := noteKey{from, id}
	pn := nt.notes[k]
	if pn == nil {
		if nt.senders[from] >= maxPendingNotes {
			nt.evictOldest(from)
		}
		pn = &pendingNote{lanes: mi.lanes}
		nt.notes[k] = pn
		nt.senders[from]++
	}
	pn.got++
	pn.bad = pn.bad || bad || mi.lanes != pn.lanes
	if mi.flags&markFlagBody != 0 && !pn.body {
		pn.body = true
		pn.bytes = mi.bytes
		pn.name = append([]byte(nil), mi.name...)
		pn.msg = append([]byte(nil), mi.msg...)
	}
	if pn.got < pn.lanes {
		return nil
	}
	nt.removeLocked(k)
	return pn
}

// forget drops a note's marks (its final copy arrived).
func (nt *noteTable) forget(from driver.Sender, id uint64) {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	if _, ok := nt.notes[noteKey{from, id}]; ok {
		nt.removeLocked(noteKey{from, id})
	}
}

func (nt *noteTable) removeLocked(k noteKey) {
	delete(nt.notes, k)
	if nt.senders[k.from]--; nt.senders[k.from] <= 0 {
		delete(nt.senders, k.from)
	}
}

// evictOldest drops from's note of the lowest ID (IDs grow per sender).
func (nt *noteTable) evictOldest(from driver.Sender) {
	var oldest noteKey
	found := false
	for k := range nt.notes {
		if k.from == from && (!found || k.id < oldest.id) {
			oldest, found = k, true
		}
	}
	if found {
		nt.removeLocked(oldest)
	}
}

// serveMark handles one mark: it decides whether the note is complete and
// clean, delivers it to the engine (waiting at most half the I/O timeout
// for room: the initiator's watchdog waits the whole of it), and returns
// the reply's status. served and lastBad describe the connection's data
// frames so far (lastBad: the number of the last failed one, from 1).
func (t *Transport) serveMark(sc *sconn, g *gather, from driver.Sender, id uint64, mi *markInfo, served, lastBad uint64) status {
	bad := mi.flags&markFlagAbort != 0 || mi.frames > served || lastBad > served-mi.frames
	d := driver.Delivery{From: from, ID: id}
	from.Seq = 0 // a note's lanes are the sender's connections: one key for all
	if mi.kind == markKindFinal || mi.lanes == 1 {
		if mi.kind == markKindFinal {
			t.notes.forget(from, id)
		}
		if bad || mi.flags&markFlagBody == 0 {
			return statusNotDelivered
		}
		d.Name, d.Msg, d.Bytes = mi.name, mi.msg, mi.bytes
	} else {
		pn := t.notes.arrive(from, id, mi, bad)
		if pn == nil {
			return statusOK
		}
		if pn.bad || !pn.body {
			return statusNotDelivered
		}
		d.Name, d.Msg, d.Bytes = pn.name, pn.msg, pn.bytes
	}
	ib := t.host.Inbox()
	if ib == nil {
		return statusNotDelivered
	}
	var err error
	if q, ok := ib.(driver.QuietInbox); ok {
		// The application is woken once the reply is written
		// (sconn.wake): its wake-up does not delay the initiator.
		err = q.DeliverQuiet(driver.NoWait, &d)
		if err == nil {
			sc.quiet = q
		}
	} else {
		err = ib.Deliver(driver.NoWait, &d)
	}
	if errors.Is(err, driver.ErrNotifyFull) {
		// Replies gathered so far go out first: the wait may be long.
		if ferr := t.flush(sc, g); ferr != nil {
			return statusNotDelivered
		}
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.IOTimeout/2)
		sc.wait()
		err = ib.Deliver(ctx, &d)
		sc.work()
		cancel()
	}
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, driver.ErrNotifyFull):
		return statusNotifyFull
	case errors.Is(err, driver.ErrPeerReset):
		return statusStaleEpoch
	}
	return statusNotDelivered
}
