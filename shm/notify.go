package shm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// Notifications (driver.Notifier). The initiator copies a submission's
// slices itself, so it knows when every byte is in the target's memory:
// once the last copy of the submission is done (on whichever goroutine
// did it), it sends the note over the control socket, and the target
// hands it to its engine's Inbox and answers. The socket's send and
// receive order the copies before the target's reads of that memory.
//
//	initiator → target  NOTE     u64 id | u64 bytes | bytes name | bytes msg
//	target → initiator  NOTEACK  u64 id | u16 status
//
// A NOTE is sent only when every copy succeeded; one of them failing
// (or cancelled before it started) completes the note without sending it.
const (
	msgNote    wire.Type = 11 // 10 is the handshake's verdict
	msgNoteAck wire.Type = 12

	noteMaxLen = 8 + 8 + 2 + driver.MaxNotifyName + 2 + driver.MaxNotifyMsg
)

// NOTEACK statuses.
const (
	noteOK    = 0
	noteFull  = 1 // the queue stayed full
	noteStale = 2 // the sender's incarnation was replaced
	noteNo    = 3 // not delivered (bad note, target closing)
)

var (
	// ErrNotifyUnsupported: the target's shm transport does not carry
	// notifications (an older version). Nothing was copied.
	ErrNotifyUnsupported = fmt.Errorf("shm: target does not carry notifications: %w", engine.ErrNotifyUnsupported)

	errNoNotifyRemote = fmt.Errorf("%w (its descriptor's shm part lacks notify)", ErrNotifyUnsupported)
	errNotifyFull     = fmt.Errorf("shm: target refused the notification: %w", driver.ErrNotifyFull)
	errNoteStale      = fmt.Errorf("shm: target refused the notification: %w", driver.ErrPeerReset)
	errNoteRefused    = errors.New("shm: target did not deliver the notification")
	errSliceCanceled  = fmt.Errorf("shm: not copied: %w", driver.ErrCanceled)
)

func remoteNotifies(d *segment.Descriptor) bool {
	if d == nil {
		return false
	}
	pr, ok := d.Protocol(segment.ProtoSHM)
	return ok && pr.SHM != nil && pr.SHM.Notify
}

// snote is the initiator's state of one note whose slices are being
// copied.
type snote struct {
	p     *peer
	n     *driver.Note
	mu    sync.Mutex
	hard  error // a copy failed: not delivered
	trans error // a copy failed transiently: the engine resends the note
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

// record notes one copy's failure.
func (sn *snote) record(err error) {
	if err == nil {
		return
	}
	sn.mu.Lock()
	if errors.Is(err, driver.ErrTransient) {
		if sn.trans == nil {
			sn.trans = err
		}
	} else if sn.hard == nil {
		sn.hard = err
	}
	sn.mu.Unlock()
}

// copied runs once every copy of the note's submission is done: it sends
// the note, or completes it when a copy failed.
func (sn *snote) copied() {
	p, n := sn.p, sn.n
	err := sn.trans
	if err == nil && sn.hard != nil {
		err = fmt.Errorf("%w: a slice of its submission failed: %w", errNoteRefused, sn.hard)
	}
	sn.n, sn.hard, sn.trans = nil, nil, nil
	p.noteMu.Lock()
	p.nfree = append(p.nfree, sn)
	p.noteMu.Unlock()
	if err != nil {
		n.Done(err)
		return
	}
	p.sendNote(n)
}

// sendNote writes NOTE and leaves n to the reader, which completes it on
// NOTEACK (or fails it when the connection ends).
func (p *peer) sendNote(n *driver.Note) {
	p.noteMu.Lock()
	if p.dead.Load() {
		p.noteMu.Unlock()
		n.Done(errGone)
		return
	}
	p.noteOut, p.noteEnc = appendNote(p.noteOut[:0], p.noteEnc[:0], n.ID, n.Bytes, n.Name, n.Msg)
	p.pending = append(p.pending, n)
	p.c.SetWriteDeadline(time.Now().Add(p.t.cfg.IOTimeout))
	err := uds.Send(p.c, p.noteOut, nil)
	if err != nil {
		p.pending = p.pending[:len(p.pending)-1]
	}
	p.noteMu.Unlock()
	if err != nil {
		n.Done(fmt.Errorf("shm: send notification: %v: %w", err, errGone))
	}
}

// acked completes the note the target answered.
func (p *peer) acked(id uint64, st uint16) error {
	p.noteMu.Lock()
	var n *driver.Note
	for i, q := range p.pending {
		if q.ID == id {
			n = q
			p.pending = append(p.pending[:i], p.pending[i+1:]...)
			break
		}
	}
	p.noteMu.Unlock()
	if n == nil {
		return fmt.Errorf("%w: shm: NOTEACK for note %d, which is not pending", wire.ErrFrame, id)
	}
	var err error
	switch st {
	case noteOK:
	case noteFull:
		err = errNotifyFull
	case noteStale:
		err = errNoteStale
	default:
		err = errNoteRefused
	}
	n.Done(err)
	return nil
}

// failNotes fails the notes awaiting an answer (the connection ended).
func (p *peer) failNotes() {
	p.noteMu.Lock()
	ns := p.pending
	p.pending = nil
	p.noteMu.Unlock()
	for _, n := range ns {
		n.Done(errGone)
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
	case !remoteNotifies(n.Remote):
		doneAll(ss, errNoNotifyRemote)
		n.Done(errNoNotifyRemote)
		return
	}
	sn := p.getNote(n)
	if len(ss) == 0 {
		sn.copied()
		return
	}
	t.submit(ss, sn)
}

func doneAll(ss []*driver.Slice, err error) {
	for _, s := range ss {
		s.Done(0, err)
	}
}

// ---- target side ----

// appendNote encodes NOTE onto dst, with scratch for the payload; it
// returns both for reuse.
func appendNote(dst, scratch []byte, id, bytes uint64, name string, msg []byte) (out, payload []byte) {
	e := wire.Enc{B: scratch}
	e.U64(id)
	e.U64(bytes)
	e.U16(uint16(len(name)))
	e.B = append(e.B, name...)
	e.Bytes(msg)
	return proto.Append(dst, msgNote, 0, e.B), e.B
}

func appendNoteAck(dst []byte, id uint64, st uint16) []byte {
	var e wire.Enc
	e.U64(id)
	e.U16(st)
	return proto.Append(dst, msgNoteAck, 0, e.B)
}

func parseNoteAck(p []byte) (id uint64, st uint16, err error) {
	d := wire.NewDec(p)
	id, st = d.U64(), d.U16()
	return id, st, d.Finish()
}

func parseNote(p []byte) (d driver.Delivery, err error) {
	dec := wire.NewDec(p)
	d.ID, d.Bytes = dec.U64(), dec.U64()
	d.Name = dec.Bytes(driver.MaxNotifyName)
	d.Msg = dec.Bytes(driver.MaxNotifyMsg)
	return d, dec.Finish()
}

// note hands a NOTE to the engine, waiting at most half the I/O timeout
// for room, and answers it.
func (sc *serverConn) note(pl []byte) error {
	t := sc.t
	d, err := parseNote(pl)
	if err != nil {
		return err
	}
	d.From = sc.from
	st := uint16(noteNo)
	if ib := t.host.Inbox(); ib != nil {
		err := ib.Deliver(driver.NoWait, &d)
		if errors.Is(err, driver.ErrNotifyFull) {
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.IOTimeout/2)
			sc.slot.Wait()
			err = ib.Deliver(ctx, &d)
			sc.slot.Work()
			cancel()
		}
		switch {
		case err == nil:
			st = noteOK
		case errors.Is(err, driver.ErrNotifyFull):
			st = noteFull
		case errors.Is(err, driver.ErrPeerReset):
			st = noteStale
		}
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.out = appendNoteAck(sc.out[:0], d.ID, st)
	sc.c.SetWriteDeadline(time.Now().Add(t.cfg.IOTimeout))
	return uds.Send(sc.c, sc.out, nil)
}
