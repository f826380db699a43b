package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// Notify is a notification a submission carries to its target: a name and
// an opaque message, at most MaxNotifyName and MaxNotifyMsg bytes.
type Notify struct {
	Name string
	Msg  []byte
}

// Bounds of a notification.
const (
	MaxNotifyName = driver.MaxNotifyName
	MaxNotifyMsg  = driver.MaxNotifyMsg
)

var (
	// ErrNotifyUnsupported: the transport that carries the submission
	// does not carry notifications. Nothing was started.
	ErrNotifyUnsupported = fmt.Errorf("engine: transport carries no notifications (use another transport, Request.Transport): %w", ErrNotSupported)
	// ErrNotifyFull: the target's queue for this sender stayed full
	// (its application does not drain Notifications); the data of the
	// submission may have landed.
	ErrNotifyFull = driver.ErrNotifyFull
	// ErrCanceled: the task (or notification) was cancelled (Cancel)
	// before it started.
	ErrCanceled = driver.ErrCanceled
	// errNoteNotSent: the notification's submission failed or was
	// cancelled, so the notification was not delivered.
	errNoteNotSent = errors.New("engine: notification not delivered: its submission failed or was cancelled")
)

// note is the engine's side of a driver.Note.
type note struct {
	driver.Note
	b     *batch
	tr    driver.Notifier // nil: the local segment, delivered here
	hold  task            // a note alone: its segment and transport counts
	alone bool
	msg   []byte // Note.Msg's storage, reused

	// wait counts the submission's finished tasks and the note's first
	// outcome up to need (the tasks plus one, written before dispatch);
	// the last of them settles the note, which then counts the batch
	// down for all of them (its tasks do not: one atomic add per
	// submission, not one per task and one for the note).
	wait   atomic.Int64
	need   int64
	bad    atomic.Bool // a task of the submission failed or was cancelled
	resend atomic.Bool // the first outcome was transient
	first  error       // the first outcome, read once wait is need
	err    error       // the final outcome, read once the batch is done
}

// Canceled implements the engine side of driver.Note.Canceled.
func (n *note) Canceled() bool { return n.b.canceled.Load() }

// CompleteNote is the transport's outcome of one sending of the note.
func (n *note) CompleteNote(err error) {
	if n.Attempt() > 0 {
		n.final(err)
		return
	}
	e := n.b.e
	if err != nil && errors.Is(err, ErrTransient) && n.Attempt() < e.cfg.Retries && !e.closed.Load() {
		n.resend.Store(true)
	} else {
		n.first = err
	}
	n.steps(1)
}

// CompleteAllNote completes ss (bound to the engine's completers) and the
// note's first sending as a success in one step (driver.DoneAllNote).
func (n *note) CompleteAllNote(ss []*driver.Slice) {
	if n.Attempt() > 0 {
		// A resend goes alone; should a transport pass slices with one,
		// count them apart.
		completeAll(ss, nil)
		n.final(nil)
		return
	}
	n.first = nil
	completeAll(ss, n)
}

// steps counts k of the note's waits; the last settles it. Steps that
// find all the others counted are the last without counting themselves
// (wait only grows, and the steps add up to need): a note sent after its
// tasks finished (shm's) costs one atomic add, not two.
func (n *note) steps(k int64) {
	// need is read before the add: once it has counted, the last step
	// may settle the note, and its batch be freed and reused.
	need := n.need
	if n.wait.Load() == need-k || n.wait.Add(k) == need {
		n.settle()
	}
}

// settle resends the note alone once its data is known to be in place,
// or ends it.
func (n *note) settle() {
	if !n.resend.Load() {
		n.final(n.first)
		return
	}
	if n.bad.Load() || n.Canceled() || n.b.e.closed.Load() {
		n.final(errNoteNotSent)
		return
	}
	n.Bind(n, n.Attempt()+1)
	n.tr.SubmitNotify(nil, &n.Note)
}

// final ends the note and counts it and its submission's tasks down in
// its batch.
func (n *note) final(err error) {
	if err != nil && n.bad.Load() {
		err = fmt.Errorf("%w: %w", errNoteNotSent, err)
	}
	n.err = err
	if n.alone {
		n.hold.release()
	}
	n.b.done(n.need)
}

// SubmitNotify is Submit followed by a notification: the target receives
// n (Notifications) only after every request of this submission has landed
// in its memory, with the submission's byte count. All requests must go to
// one segment over one transport, and that transport must carry
// notifications (otherwise ErrNotifyUnsupported, before
// anything starts). If a request fails (or is cancelled, Cancel), the
// target gets no notification for the submission: failures are not
// notified. When a connection breaks after the data and the note were
// sent, the note is sent again once the data has been retried, and the
// target drops a copy it already has: it is delivered once.
//
// The notification's outcome is part of the batch: Wait returns nil only
// when every task completed and the target has custody of the
// notification (it is queued there, or its transport holds it until the
// queue has room: shm and rdma; docs/notify.md); it fails with
// ErrNotifyFull when the target's queue for this sender stayed full. n.Msg is copied; the caller may reuse it when SubmitNotify
// returns. On the steady-state path it does not allocate.
func (e *Engine) SubmitNotify(id BatchID, reqs []Request, n Notify) error {
	if len(reqs) == 0 {
		return fmt.Errorf("%w: submit: a notification needs requests (Notify sends one alone)", ErrInvalidRequest)
	}
	return e.submit(id, reqs, &n, reqs[0].Target)
}

// Notify sends n alone to the segment and waits until the target has
// custody of it, as SubmitNotify's Wait does (or ctx ends, or it fails:
// ErrNotifyFull, ErrNotifyUnsupported).
// It is ordered after nothing; use SubmitNotify to follow data.
func (e *Engine) Notify(ctx context.Context, seg SegmentID, n Notify) error {
	return e.transfer(ctx, nil, &n, seg)
}

// Cancel cancels the batch's submitted tasks that have not started: they
// end CANCELED (their error wraps ErrCanceled); tasks already in flight
// finish or fail, and are not retried. A submission of which a task was
// cancelled or failed delivers no notification. Further submissions to
// the batch fail with ErrCanceled; free it and allocate another. Which
// slices count as started is the transport's: tcp cancels slices still
// queued for its connections, shm the copies not yet begun.
func (e *Engine) Cancel(id BatchID) error {
	b := e.batches.get(id)
	if b == nil {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	b.canceled.Store(true)
	return nil
}

func checkNotify(n *Notify) error {
	if len(n.Name) > MaxNotifyName || len(n.Msg) > MaxNotifyMsg {
		return fmt.Errorf("%w: notification name of %d bytes (at most %d) or message of %d (at most %d)", ErrInvalidRequest, len(n.Name), MaxNotifyName, len(n.Msg), MaxNotifyMsg)
	}
	return nil
}

// prepareNote readies the batch's next note for the submission of
// b.tasks[base:base+count] (already resolved) to seg; for a note alone
// (count 0) it resolves seg itself.
func (e *Engine) prepareNote(b *batch, base, count int, n *Notify, seg SegmentID, ts *transportSet) (*note, error) {
	if b.nnotes == len(b.notes) {
		b.notes = append(b.notes, &note{b: b})
	}
	// The batch's notes after its first nnotes are as FreeBatch left
	// them (zero but for b and msg's storage): a failure below leaves
	// nt so again.
	nt := b.notes[b.nnotes]
	fail := func(err error) (*note, error) {
		if nt.alone {
			nt.hold.release()
		}
		*nt = note{b: b, msg: nt.msg[:0]}
		return nil, err
	}
	var slot int
	var t0 *task
	if count == 0 {
		nt.alone = true
		nt.hold = task{b: b, slot: -1}
		if seg != LocalSegment {
			if err := e.resolveSegment(&nt.hold, seg, ts); err != nil {
				return fail(err)
			}
		}
		t0 = &nt.hold
	} else {
		t0 = &b.tasks[base]
		for i := base + 1; i < base+count; i++ {
			if t := &b.tasks[i]; t.seg != t0.seg || t.slot != t0.slot {
				return fail(fmt.Errorf("%w: request %d: a notification follows requests to one segment over one transport", ErrInvalidRequest, i-base))
			}
		}
	}
	slot = t0.slot
	if t0.seg != nil {
		nr := ts.notifier[slot]
		if nr == nil {
			return fail(fmt.Errorf("%w: %s to %s", ErrNotifyUnsupported, ts.names[slot], t0.seg.name))
		}
		nt.tr = nr
		nt.Peer = t0.peer
		nt.Remote = t0.st.desc
	}
	nt.msg = append(nt.msg, n.Msg...)
	nt.ID = e.noteSeq.Add(1)
	nt.Name = n.Name
	nt.Msg = nt.msg
	for i := base; i < base+count; i++ {
		nt.Bytes += uint64(len(b.tasks[i].local))
	}
	nt.need = int64(count) + 1
	b.nnotes++
	return nt, nil
}

// resolveSegment fills t with a connected peer of seg (a note alone).
func (e *Engine) resolveSegment(t *task, seg SegmentID, ts *transportSet) error {
	s := e.segs.acquire(seg)
	if s == nil {
		return fmt.Errorf("%w: id %d", ErrSegmentNotFound, seg)
	}
	t.seg = s
	st := s.state.Load()
	if st.gone {
		return fmt.Errorf("%w: %s is gone", ErrSegmentNotFound, s.name)
	}
	slot, p, err := e.connect(e.ctx, s, st, ts, "", t)
	if err != nil {
		return err
	}
	t.st, t.slot, t.tname, t.peer = st, slot, ts.names[slot], p.p
	return nil
}

// sendNote starts a prepared note: after its slices were handed to the
// transport (SubmitNotify did both), or, for the local segment, after the
// copies.
func (e *Engine) sendLocalNote(nt *note) {
	nt.Bind(nt, 0)
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.MetadataTimeout)
	err := e.inbox.Deliver(ctx, &driver.Delivery{
		From: driver.Sender{Name: e.cfg.Name, Epoch: e.epoch},
		ID:   nt.ID, Name: []byte(nt.Name), Msg: nt.Msg, Bytes: nt.Bytes,
	})
	cancel()
	nt.Done(err)
}
