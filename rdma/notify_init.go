package rdma

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/uverbs"
)

// maxNoteAttempts bounds how often one notification is sent again after
// its endpoint broke under it.
const maxNoteAttempts = 4

// outNote is a notification on its way to a target. Its owner (the
// engine's side of the transport) reuses it: nothing is allocated per
// notification.
type outNote struct {
	p     *peer
	name  string
	msg   []byte
	bytes uint64
	// seq is the engine's note ID, kept across resends, so the target
	// drops a copy it has accepted.
	seq     uint64
	attempt int
	// note is the engine's note (nil in tests that send alone).
	note *driver.Note
	// tr is the tracker the note belongs to (nil in tests that send
	// alone); marks is how many copies the target waits for.
	tr    *noteTrack
	marks uint32
	// since is when the note started waiting for a credit (rail clock).
	since time.Duration
	// done is called once with the outcome, on a rail owner or on the
	// sender's goroutine when it fails at once.
	done func(n *outNote, err error)
}

func (n *outNote) finish(err error) { n.done(n, err) }

func (n *outNote) canceled() bool { return n.note != nil && n.note.Canceled() }

// sendNote routes a notification to an endpoint of its peer and hands it
// to that rail's owner. Its submission's slices have all completed, so
// any QP to the peer orders it after their data.
func (t *Transport) sendNote(n *outNote) {
	p := n.p
	if len(n.name) > driver.MaxNotifyName || len(n.msg) > driver.MaxNotifyMsg {
		n.finish(fmt.Errorf("%w: name of %d bytes (at most %d), message of %d (at most %d)", errNoteTooLarge, len(n.name), driver.MaxNotifyName, len(n.msg), driver.MaxNotifyMsg))
		return
	}
	if n.canceled() {
		n.finish(fmt.Errorf("rdma: notification not sent: %w", driver.ErrCanceled))
		return
	}
	n.marks = 1
	if t.closed.Load() {
		n.finish(fmt.Errorf("rdma: %w", driver.ErrClosed))
		return
	}
	if p.closed.Load() {
		n.finish(fmt.Errorf("rdma: peer %s closed: %w", p.name, driver.ErrPeerReset))
		return
	}
	if p.mc != nil {
		t.mcSendNote(n)
		return
	}
	r := t.pickRail(0, p.usable(len(t.rails)), 0, n.attempt)
	if r == nil {
		n.finish(fmt.Errorf("rdma: no rail is up (%d rails)", len(t.rails)))
		return
	}
	ep, err := p.endpoint(r, remoteRail(r.idx, p.nRemote))
	if err != nil {
		n.finish(err)
		return
	}
	ep.busy.Add(1)
	r.enqueue(item{kind: itemNote, note: n, ep: ep})
}

// pickNoteQP returns a QP of ep with a notification credit and a free
// send slot.
func (ep *endpoint) pickNoteQP() *qpState {
	for _, q := range ep.qps {
		if q.notes > 0 && q.credits > 0 {
			return q
		}
	}
	return nil
}

// postNote adds n's SEND to the doorbell chain; false when ep has no
// credit for it (or the rail no slot or buffer).
func (r *rail) postNote(ep *endpoint, n *outNote) bool {
	if r.free < 0 {
		return false
	}
	q := ep.pickNoteQP()
	if q == nil {
		return false
	}
	if r.spool == nil {
		r.spool = newBufPool(r, r.t.cfg.NotifyBuffers)
	}
	bi := r.spool.get()
	if bi < 0 {
		return false
	}
	b := &r.spool.bufs[bi]
	ln, err := putNote(b.b, n.seq, n.bytes, n.marks, n.name, n.msg)
	if err != nil {
		// sendNote checked the bounds; nothing else fails.
		r.spool.put(bi)
		ep.busy.Add(-1)
		n.finish(err)
		return true
	}
	r.queueSend(ep, q, n, false, bi, ln)
	return true
}

// queueSend chains the SEND of note buffer bi (ln bytes) on q, taking a
// slot, a credit and a note allowance; mark says it is one of a
// submission's markers. The caller checked that all three are free.
func (r *rail) queueSend(ep *endpoint, q *qpState, n *outNote, mark bool, bi int32, ln int) {
	if r.chainQ != q || len(r.wrs) == maxChain {
		r.flushChain()
		r.chainQ = q
	}
	idx := r.free
	sl := &r.slots[idx]
	r.free = sl.next
	sl.note, sl.mark, sl.q, sl.buf, sl.posted = n, mark, q, bi, r.clock
	sl.gen = (sl.gen + 1) & genMask
	q.credits--
	q.notes--
	ep.inflight++
	ep.posted.Add(1)
	r.inflight++
	b := &r.spool.bufs[bi]
	k := len(r.wrs)
	r.sges[k] = uverbs.SGE{Addr: b.addr, Length: uint32(ln), LKey: uverbs.LKey(b.lkey)}
	r.wrs = append(r.wrs, uverbs.SendWR{ID: uint64(sl.gen)<<32 | uint64(uint32(idx)), Opcode: uverbs.WRSend,
		Flags: uverbs.SendSignaled, SGL: r.sges[k : k+1 : k+1]})
}

// noteSent handles the completion of a notification's SEND: on success
// the target has it (RC acknowledged it).
func (r *rail) noteSent(idx int32, sl *slot, wc *uverbs.WC) {
	n, q, bi, mark := sl.note, sl.q, sl.buf, sl.mark
	ep := q.ep
	r.release(idx, sl)
	r.spool.put(bi)
	if mark {
		ep.busy.Add(-1)
		if wc.Status == uverbs.WCSuccess {
			n.tr.sliceDone(nil)
		} else {
			err := r.noteError(wc, ep)
			r.breakEP(ep, err)
			n.tr.sliceDone(err)
		}
	} else if wc.Status == uverbs.WCSuccess {
		ep.busy.Add(-1)
		n.finish(nil)
	} else {
		err := r.noteError(wc, ep)
		r.breakEP(ep, err)
		r.noteFailed(ep, n, err)
	}
	if ep.state.Load() >= epBroken && ep.inflight == 0 {
		r.teardown(ep)
	}
}

// noteError is a failed SEND's error: transient (sent again on a fresh
// endpoint) unless the endpoint was closed under it.
func (r *rail) noteError(wc *uverbs.WC, ep *endpoint) error {
	if ep.state.Load() == epClosed {
		return ep.failure()
	}
	if wc.Status == uverbs.WCWRFlushErr && ep.state.Load() == epBroken {
		return ep.failure()
	}
	r.checkPort()
	return fmt.Errorf("rdma: notification SEND on %s to %s rail %d: %s: %w", r.name, ep.p.name, ep.rrail, wc.Status, driver.ErrTransient)
}

// noteFailed takes n off ep after err: a transient failure sends it
// again (with its sequence number: the target drops a copy it already
// delivered), up to maxNoteAttempts; anything else ends it.
func (r *rail) noteFailed(ep *endpoint, n *outNote, err error) {
	ep.busy.Add(-1)
	if errors.Is(err, driver.ErrTransient) && n.attempt+1 < maxNoteAttempts {
		n.attempt++
		r.t.sendNote(n)
		return
	}
	n.finish(err)
}

// credited adds notification credits to one of ep's QPs and sends what
// waited for them.
func (r *rail) credited(ep *endpoint, c credit) {
	if int(c.qp) >= len(ep.qps) || ep.state.Load() != epReady {
		return
	}
	ep.qps[c.qp].notes += int(c.num)
	if len(ep.notes) > 0 || len(ep.waiting) > 0 {
		r.drain(ep)
	}
}

// creditsFor hands credit entries from p's target to the rails' owners.
func (p *peer) creditsFor(cs []credit) {
	for _, c := range cs {
		for i := range p.eps {
			if ep := p.eps[i].Load(); ep != nil && ep.id == c.ep {
				ep.r.enqueue(item{kind: itemCredit, ep: ep, cred: c})
				break
			}
		}
	}
}

// noteTrack is a submission with a notification: the count of its
// slices still to complete and the first failure; once the count reaches
// zero, the notification goes out (or, after a failure, ends with it).
// Trackers are reused (Transport.tracks): none is allocated per
// submission once warm.
type noteTrack struct {
	t       *Transport
	out     outNote
	pending atomic.Int64
	mu      sync.Mutex
	err     error
	// note receives the notification's outcome (end instead, in tests);
	// the tracker is free again before either is called.
	note *driver.Note
	end  func(err error)
	// marked: the note goes as markers behind the data on the endpoints
	// in eps, collected while collect is set (Submit routing them).
	marked  bool
	collect bool
	overrun bool
	eps     [maxMarkEPs]*endpoint
	neps    int
}

// maxMarkEPs bounds the endpoints one marked submission uses; beyond it
// the note goes after the data instead.
const maxMarkEPs = 16

// addEP records an endpoint the submission's slices go to.
func (tr *noteTrack) addEP(ep *endpoint) {
	for _, e := range tr.eps[:tr.neps] {
		if e == ep {
			return
		}
	}
	if tr.neps == len(tr.eps) {
		tr.overrun = true
		return
	}
	tr.eps[tr.neps] = ep
	tr.neps++
}

// sliceDone counts one slice of the submission as complete.
func (tr *noteTrack) sliceDone(err error) {
	if err != nil {
		tr.mu.Lock()
		if tr.err == nil {
			tr.err = err
		}
		tr.mu.Unlock()
	}
	if tr.pending.Add(-1) != 0 {
		return
	}
	tr.mu.Lock()
	err = tr.err
	tr.mu.Unlock()
	if err != nil {
		// The target must not hear of a submission whose data did not
		// all land; a transient failure's slice is retried by the engine,
		// which then resends the notification alone.
		tr.out.finish(fmt.Errorf("rdma: notification not sent: a slice of its submission failed: %w", err))
		return
	}
	if tr.marked {
		// Every marker was acknowledged: the target has them all.
		tr.out.finish(nil)
		return
	}
	tr.t.sendNote(&tr.out)
}

// SubmitNotify implements driver.Notifier: ss start at once; the
// notification follows as a SEND once every one of them has completed
// (so its data is in the target's memory, whichever rails and QPs it
// went over), on any endpoint to the target.
//
// n.Done(nil) means the target's NIC acknowledged the SEND: the target
// holds it in a receive buffer and hands it to its inbox as soon as
// there is room (waiting, with the sender's credit held, while there is
// none), even if the connection ends meanwhile; it is dropped only when
// the sender has restarted or the target closes. Waiting for the inbox's
// answer would add a trip back over the control connection to every
// notification's completion.
func (d drv) SubmitNotify(ss []*driver.Slice, n *driver.Note) {
	p, ok := n.Peer.(*peer)
	if !ok {
		d.t.submitSlices(ss, nil)
		n.Done(fmt.Errorf("rdma: notification with a foreign peer %T", n.Peer))
		return
	}
	tr := d.t.getTrack()
	tr.note = n
	tr.out.attempt = n.Attempt()
	tr.out.note = n
	if d.t.cfg.NotifyMarkers && n.Attempt() == 0 && len(ss) > 0 {
		d.t.startMarked(tr, ss, p, n.ID, n.Name, n.Msg, n.Bytes)
		return
	}
	d.t.startNotify(tr, ss, p, n.ID, n.Name, n.Msg, n.Bytes)
}

var _ driver.Notifier = drv{}

// noteDone is the tracker's outNote.done.
func (tr *noteTrack) noteDone(_ *outNote, err error) {
	note, end := tr.note, tr.end
	tr.note, tr.end, tr.err = nil, nil, nil
	tr.marked, tr.collect, tr.overrun = false, false, false
	clear(tr.eps[:tr.neps])
	tr.neps = 0
	tr.out = outNote{done: tr.out.done, tr: tr}
	tr.t.putTrack(tr)
	if note != nil {
		note.Done(err)
	} else {
		end(err)
	}
}

// getTrack returns a free tracker.
func (t *Transport) getTrack() *noteTrack {
	t.trackMu.Lock()
	if n := len(t.tracks); n > 0 {
		tr := t.tracks[n-1]
		t.tracks[n-1] = nil
		t.tracks = t.tracks[:n-1]
		t.trackMu.Unlock()
		return tr
	}
	t.trackMu.Unlock()
	tr := &noteTrack{t: t}
	tr.out.done, tr.out.tr = tr.noteDone, tr
	return tr
}

func (t *Transport) putTrack(tr *noteTrack) {
	t.trackMu.Lock()
	t.tracks = append(t.tracks, tr)
	t.trackMu.Unlock()
}

// startNotify starts ss and, once every one of them has completed,
// sends the notification (name, msg, bytes, id) to p; the tracker's note
// (or end) gets its outcome after every slice of ss was completed.
func (t *Transport) startNotify(tr *noteTrack, ss []*driver.Slice, p *peer, id uint64, name string, msg []byte, bytes uint64) {
	tr.out.p, tr.out.seq, tr.out.name, tr.out.msg, tr.out.bytes = p, id, name, msg, bytes
	// One count more than the slices until all are handed over, so the
	// notification cannot go out while Submit is still routing them.
	tr.pending.Store(int64(len(ss)) + 1)
	t.submitSlices(ss, tr)
	tr.sliceDone(nil)
}

// startMarked starts ss and queues the note's markers behind them on
// every endpoint they went to: one SEND per QP of each, which RC orders
// after the slices posted there before it; the target delivers the note
// once all markers are in, and the note completes here once every slice
// and marker has. A submission over more endpoints than maxMarkEPs (or
// none that routed) sends the note after its data instead.
func (t *Transport) startMarked(tr *noteTrack, ss []*driver.Slice, p *peer, id uint64, name string, msg []byte, bytes uint64) {
	tr.out.p, tr.out.seq, tr.out.name, tr.out.msg, tr.out.bytes = p, id, name, msg, bytes
	tr.pending.Store(int64(len(ss)) + 1)
	tr.collect = true
	t.submitSlices(ss, tr)
	tr.collect = false
	if tr.overrun || tr.neps == 0 || tr.out.canceled() {
		tr.sliceDone(nil)
		return
	}
	q := t.cfg.QPsPerPath
	tr.marked = true
	tr.out.marks = uint32(tr.neps * q)
	tr.pending.Add(int64(tr.neps * q))
	for _, ep := range tr.eps[:tr.neps] {
		ep.busy.Add(int64(q))
		ep.r.enqueue(item{kind: itemMark, ep: ep, note: &tr.out})
	}
	tr.sliceDone(nil)
}

// postMarks posts n's markers, one SEND on every QP of ep, in the
// doorbell chains; false (nothing posted) unless every QP has a send
// slot and a credit and the rail has slots and buffers for all.
func (r *rail) postMarks(ep *endpoint, n *outNote) bool {
	k := len(ep.qps)
	for _, q := range ep.qps {
		if q.credits <= 0 || q.notes <= 0 {
			return false
		}
	}
	free := 0
	for i := r.free; i >= 0 && free < k; i = r.slots[i].next {
		free++
	}
	if free < k {
		return false
	}
	if r.spool == nil {
		r.spool = newBufPool(r, r.t.cfg.NotifyBuffers)
	}
	var bufs [maxQPsPerMsg]int32
	for i := range k {
		if bufs[i] = r.spool.get(); bufs[i] < 0 {
			for _, b := range bufs[:i] {
				r.spool.put(b)
			}
			return false
		}
	}
	for i, q := range ep.qps {
		b := &r.spool.bufs[bufs[i]]
		ln, _ := putNote(b.b, n.seq, n.bytes, n.marks, n.name, n.msg)
		r.queueSend(ep, q, n, true, bufs[i], ln)
	}
	return true
}

// failMarks counts n's markers for ep as failed with err.
func (r *rail) failMarks(ep *endpoint, n *outNote, err error) {
	for range r.t.cfg.QPsPerPath {
		ep.busy.Add(-1)
		n.tr.sliceDone(err)
	}
}

// errNoteStalled: the target held every credit for longer than the
// rail's slice timeout (its application does not drain notifications).
var errNoteStalled = fmt.Errorf("rdma: notification not sent: the target took none for Config.SliceTimeout: %w", driver.ErrNotifyFull)

// expireNotes ends what waited too long on the blocked endpoints for a
// notification credit: a note (or a marker at the head of its endpoint's
// queue, which holds the slices behind it) not sent within the slice
// timeout fails with ErrNotifyFull, a cancelled one with ErrCanceled.
// Nothing of them was sent.
func (r *rail) expireNotes() {
	for _, ep := range r.blocked {
		k := 0
		for _, n := range ep.notes {
			switch {
			case n.canceled():
				r.noteFailed(ep, n, fmt.Errorf("rdma: notification not sent: %w", driver.ErrCanceled))
			case r.clock-n.since >= r.sliceTimeout:
				r.noteFailed(ep, n, errNoteStalled)
			default:
				ep.notes[k] = n
				k++
			}
		}
		clear(ep.notes[k:])
		ep.notes = ep.notes[:k]
		if len(ep.waiting) > 0 {
			if p := ep.waiting[0]; p.mark != nil && (p.mark.canceled() || r.clock-p.since >= r.sliceTimeout) {
				err := errNoteStalled
				if p.mark.canceled() {
					err = fmt.Errorf("rdma: notification not sent: %w", driver.ErrCanceled)
				}
				n := copy(ep.waiting, ep.waiting[1:])
				ep.waiting[n] = pend{}
				ep.waiting = ep.waiting[:n]
				r.failMarks(ep, p.mark, err)
			}
		}
	}
}
