package rdma

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/wire"

	"github.com/rdmago/te/uverbs"
)

// drainTimeout bounds the wait for a target QP's receives to complete
// before it is destroyed; drainQuiet ends it when none completes for
// that long.
const (
	drainTimeout = 100 * time.Millisecond
	drainQuiet   = time.Millisecond
)

// maxPartial bounds the notes a session counts markers of at once.
const maxPartial = 1 << 16

// credit is one QP's receives reposted since the last credit frame.
type credit struct {
	ep  uint32
	qp  uint8
	num uint16
}

// giveCredit queues one credit for the initiator of s and wakes its
// writer; it never blocks (the rail owner calls it).
func (s *session) giveCredit(ep uint32, qp uint8) {
	s.credMu.Lock()
	merged := false
	for i := range s.creds {
		if c := &s.creds[i]; c.ep == ep && c.qp == qp && c.num < 0xffff {
			c.num++
			merged = true
			break
		}
	}
	if !merged {
		s.creds = append(s.creds, credit{ep, qp, 1})
	}
	s.credMu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// writeCredits sends s's queued credits on its control connection until
// the session ends. Its buffers are reused: a credit costs no allocation.
func (t *Transport) writeCredits(s *session) {
	defer t.wg.Done()
	var batch []credit
	var enc wire.Enc
	var frame []byte
	for {
		select {
		case <-s.kick:
		case <-s.done:
			return
		}
		s.credMu.Lock()
		batch, s.creds = s.creds, batch[:0]
		s.credMu.Unlock()
		for k := 0; k < len(batch); {
			n := min(len(batch)-k, maxCreditsPerMsg)
			enc.B = putCredits(enc.B[:0], batch[k:k+n])
			frame = hsProto.Append(frame[:0], hsCredit, 0, enc.B)
			s.wmu.Lock()
			s.conn.SetWriteDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
			_, err := s.conn.Write(frame)
			s.wmu.Unlock()
			if err != nil {
				s.conn.Close()
				return
			}
			k += n
		}
	}
}

// postRecvs posts up to n receive buffers on q and returns how many it
// posted. Rail owner only.
func (r *rail) postRecvs(q *tgtQP, n int) int {
	if r.rpool == nil {
		r.rpool = newBufPool(r, r.t.cfg.NotifyBuffers)
	}
	k := 0
	for ; k < n && r.rposted < r.recvBudget; k++ {
		if !r.postRecv(q, -1) {
			break
		}
	}
	return k
}

// postRecv posts buffer i (-1: a free one) on q.
func (r *rail) postRecv(q *tgtQP, i int32) bool {
	if i < 0 {
		if i = r.rpool.get(); i < 0 {
			return false
		}
	}
	b := &r.rpool.bufs[i]
	b.q, b.held = q, false
	r.rsge[0] = uverbs.SGE{Addr: b.addr, Length: uint32(len(b.b)), LKey: uverbs.LKey(b.lkey)}
	r.rwr[0] = uverbs.RecvWR{ID: wrRecv | uint64(b.gen)<<32 | uint64(uint32(i)), SGL: r.rsge[:]}
	if _, err := q.qp.PostRecv(r.rwr[:]); err != nil {
		if !errors.Is(err, uverbs.ErrClosed) {
			r.log.Warn("rdma: post receive", "qpn", uint32(q.qp.QPN()), "err", err)
		}
		r.rpool.put(i)
		return false
	}
	q.posted++
	r.rposted++
	return true
}

// closeTargetQP destroys q and frees the buffers posted on it (the QP is
// gone: the device no longer writes them, and a completion that still
// names one is stale by its generation). Rail owner only.
func (r *rail) closeTargetQP(q *tgtQP) {
	if q.closed {
		return
	}
	// Receives that completed before the destroy must be seen first: a
	// destroy cleans the QP's completions out of the CQ, and the sender
	// already counts those notifications as received. In the error
	// state every posted receive completes (flushed, if nothing came).
	// A device that does not flush a QP's receives on the error state
	// (older rxe) shows nothing more: the wait ends after drainQuiet
	// without a completion of q; one that does finishes within
	// drainTimeout.
	q.closing = true
	if q.posted > 0 && q.qp.ToErr() == nil {
		start := time.Now()
		last, seen := start, q.posted
		for q.posted > 0 {
			if r.poll() == 0 {
				runtime.Gosched()
			}
			now := time.Now()
			if q.posted < seen {
				last, seen = now, q.posted
			}
			if now.Sub(last) > drainQuiet || now.Sub(start) > drainTimeout {
				break
			}
		}
	}
	q.closed = true
	if err := q.qp.Close(); err != nil {
		r.log.Warn("rdma: destroy QP", "qpn", uint32(q.qp.QPN()), "err", err)
	}
	if q.posted == 0 || r.rpool == nil {
		return
	}
	for i := range r.rpool.bufs {
		if b := &r.rpool.bufs[i]; b.q == q && !b.held {
			r.rpool.put(int32(i))
		}
	}
	r.rposted -= q.posted
	q.posted = 0
}

// received handles a receive completion: the buffer, with its
// notification, goes to the session's deliverer, which hands it back
// (itemRecycle) once the sink took it; only then is it posted again and
// its credit returned. A target whose sink is full so holds the
// sender's credits: back-pressure on that sender alone.
func (r *rail) received(wc *uverbs.WC) {
	i, gen := int32(uint32(wc.ID)), uint32(wc.ID>>32)&genMask
	if r.rpool == nil || int(i) >= len(r.rpool.bufs) || r.rpool.bufs[i].gen != gen || r.rpool.bufs[i].q == nil {
		return // its QP was destroyed and the buffer freed
	}
	b := &r.rpool.bufs[i]
	q := b.q
	q.posted--
	r.rposted--
	if wc.Status != uverbs.WCSuccess || q.closed {
		if wc.Status != uverbs.WCWRFlushErr {
			r.log.Warn("rdma: receive failed", "qpn", uint32(q.qp.QPN()), "status", wc.Status.String())
		}
		r.rpool.put(i)
		return
	}
	b.held = true
	ref := noteRef{r: r, buf: i, n: int(wc.ByteLen), b: b.b}
	if r.t.deliverNow(r, q.sess, &ref) {
		r.recycle(i)
		return
	}
	q.sess.queueNote(ref)
}

// deliverNow hands a received notification to the inbox from the rail's
// owner when the session's deliverer has nothing queued or in hand (so
// the order of arrival holds) and the inbox has room now; false leaves
// it to the deliverer, which waits for room. It saves the notification
// two goroutine hand-offs on its way.
func (t *Transport) deliverNow(r *rail, s *session, ref *noteRef) bool {
	s.credMu.Lock()
	busy := len(s.notes) > 0 || s.delivering
	s.credMu.Unlock()
	if busy || t.ctx.Err() != nil {
		return false
	}
	d := &r.delivery
	d.From = driver.Sender{Name: s.initiator, Epoch: s.epoch, Seq: s.seq}
	done, err := t.offer(s, d, ref, driver.NoWait)
	d.Name, d.Msg = nil, nil
	return done || !errors.Is(err, driver.ErrNotifyFull)
}

// noteRef is a received notification on its way to the sink: buffer buf
// of r's pool, n bytes long. b is the buffer's memory, which the
// deliverer alone reads until it hands the buffer back.
type noteRef struct {
	r   *rail
	buf int32
	n   int
	b   []byte
	// counted: its marker was counted already (offer).
	counted bool
}

// queueNote hands a received notification to s's deliverer; it never
// blocks (the queue is bounded by the receives s's QPs hold).
func (s *session) queueNote(ref noteRef) {
	s.credMu.Lock()
	s.notes = append(s.notes, ref)
	s.credMu.Unlock()
	select {
	case s.noteKick <- struct{}{}:
	default:
	}
}

// deliverNotes hands s's received notifications to the engine's inbox,
// in the order they came, until the session has ended and none is left:
// the target has taken custody of each (the initiator saw its SEND
// complete), so one received before the connection ended is still
// delivered. The inbox blocks while it has no room; only the transport's
// Close abandons what is left.
func (t *Transport) deliverNotes(s *session) {
	defer t.wg.Done()
	var batch []noteRef
	d := driver.Delivery{From: driver.Sender{Name: s.initiator, Epoch: s.epoch, Seq: s.seq}}
	for {
		s.credMu.Lock()
		batch, s.notes = s.notes, batch[:0]
		s.delivering = len(batch) > 0
		s.credMu.Unlock()
		for k := range batch {
			ref := &batch[k]
			if t.ctx.Err() == nil {
				t.offer(s, &d, ref, t.ctx)
			}
			ref.r.enqueue(item{kind: itemRecycle, buf: ref.buf})
			batch[k] = noteRef{}
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-s.noteKick:
		case <-s.done:
			s.credMu.Lock()
			left := len(s.notes)
			s.credMu.Unlock()
			if left == 0 {
				return
			}
		}
	}
}

// offer decodes one received notification into d and hands it to the
// inbox (waiting for room until ctx ends), which drops a repeat and one
// from a restarted sender. A note sent as markers (one behind the data on
// each QP) goes once the last of them is in: each was ordered after its
// QP's data. done: nothing is left to do for it (delivered or dropped).
func (t *Transport) offer(s *session, d *driver.Delivery, ref *noteRef, ctx context.Context) (done bool, err error) {
	var marks uint32
	d.ID, d.Bytes, marks, d.Name, d.Msg, err = parseNote(ref.b[:min(ref.n, len(ref.b))])
	if err != nil {
		t.log.Warn("rdma: notification dropped", "initiator", s.initiator, "err", err)
		return true, nil
	}
	if marks > 1 && !ref.counted {
		ref.counted = true
		s.credMu.Lock()
		n := s.partial[d.ID] + 1
		if n < marks {
			if s.partial == nil || len(s.partial) >= maxPartial {
				// Only failed submissions leave markers that never
				// complete; forget them.
				s.partial = map[uint64]uint32{}
			}
			s.partial[d.ID] = n
		} else {
			delete(s.partial, d.ID)
		}
		s.credMu.Unlock()
		if n < marks {
			return true, nil
		}
	}
	err = t.host.Inbox().Deliver(ctx, d)
	d.Name, d.Msg = nil, nil
	switch {
	case err == nil, t.ctx.Err() != nil:
	case errors.Is(err, driver.ErrNotifyFull) && ctx != t.ctx:
		return false, err
	case errors.Is(err, driver.ErrPeerReset):
		t.log.Debug("rdma: notification from a restarted sender dropped", "initiator", s.initiator, "epoch", s.epoch)
	default:
		t.log.Warn("rdma: notification not delivered", "initiator", s.initiator, "err", err)
	}
	return true, err
}

// recycle reposts a delivered receive buffer on its QP and returns the
// credit; a QP that is gone (or refuses) frees it.
func (r *rail) recycle(i int32) {
	b := &r.rpool.bufs[i]
	q := b.q
	if q == nil || q.closing || q.closed || q.sess.ended.Load() {
		r.rpool.put(i)
		return
	}
	if r.postRecv(q, i) {
		q.sess.giveCredit(q.epID, q.idx)
	}
}
