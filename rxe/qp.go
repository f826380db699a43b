package rxe

import (
	"fmt"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/uverbs"
)

type qp struct {
	k      uverbs.Kernel
	req    uverbs.QPCaps
	typ    uverbs.QPType
	sqReg  *dma.Region
	rqReg  *dma.Region
	sq     sendQueue
	rq     recvQueue
	kickMR *dma.Region // the pre-built POST_SEND command (stable memory for its response pointer)
	kickFD int
	kick   []byte // the POST_SEND command in kickMR
}

func (q *qp) Request() (uverbs.QPCaps, []byte, int) {
	return q.req, nil, len(ucmd.Bytes(&uapi.RxeCreateQPResp{}))
}

func (q *qp) Created(c uverbs.QPCreated, out []byte) (err error) {
	var resp uapi.RxeCreateQPResp
	copy(ucmd.Bytes(&resp), out)
	defer func() {
		if err != nil {
			q.Destroyed()
		}
	}()
	var sr, rr ring
	if q.sqReg, sr, err = mapQueue(q.k, &resp.SQMI); err != nil {
		return fmt.Errorf("send queue: %w", err)
	}
	if q.rqReg, rr, err = mapQueue(q.k, &resp.RQMI); err != nil {
		return fmt.Errorf("receive queue: %w", err)
	}
	q.sq = newSendQueue(sr, c.Caps)
	q.sq.ud = q.typ == uverbs.QPTypeUD
	q.rq = recvQueue{r: rr, prod: rr.producer(), maxSGE: int(c.Caps.MaxRecvSGE)}
	if rr.elem < recvWQEHeader+sgeSize*q.rq.maxSGE {
		return fmt.Errorf("rxe: receive slot of %d bytes cannot hold %d SGEs", rr.elem, q.rq.maxSGE)
	}
	if q.kickMR, err = dma.Alloc(64); err != nil {
		return err
	}
	cmd, err := encodeKick(q.kickMR.Bytes(), uint32(c.Handle))
	if err != nil {
		return err
	}
	q.kickFD, q.kick = q.k.FD(), cmd
	return nil
}

func newSendQueue(r ring, caps uverbs.QPCaps) sendQueue {
	room := r.elem - sendWQEHeader
	q := sendQueue{r: r, prod: r.producer(), maxSGE: int(caps.MaxSendSGE), maxInline: int(caps.MaxInlineData)}
	// Never trust caps beyond what a slot can hold.
	if q.maxSGE*sgeSize > room {
		q.maxSGE = room / sgeSize
	}
	if q.maxInline > room {
		q.maxInline = room
	}
	return q
}

// encodeKick builds, in b (mmap'd, so the embedded response pointer stays
// valid), the POST_SEND write() with wr_count 0 that makes rxe process the
// send queue: ib_uverbs_cmd_hdr{28, in_words 8, out_words 1} +
// ib_uverbs_post_send{response, qp_handle, 0, 0, wqe_size 56}; the 4-byte
// response lands at b[32:]. It returns the 32 command bytes.
func encodeKick(b []byte, qpHandle uint32) ([]byte, error) {
	if len(b) < 36 {
		return nil, fmt.Errorf("rxe: kick buffer of %d bytes", len(b))
	}
	hdr := dma.View[uapi.CmdHdr](b, 0)
	*hdr = uapi.CmdHdr{Command: uapi.CmdPostSend, InWords: 8, OutWords: 1} // 32 request bytes, 4 response bytes
	ps := dma.View[uapi.PostSend](b, 8)
	*ps = uapi.PostSend{Response: dma.Addr(b) + 32, QPHandle: qpHandle, WQESize: uapi.SendWRSize}
	return b[:32], nil
}

func (q *qp) PostSend(wrs []uverbs.SendWR) (int, error) {
	n, payload, err := q.sq.post(wrs)
	if n > 0 {
		// The kick runs rxe's requester in this thread (6.1 kernels) or
		// just schedules it (later ones): CPU work, never a sleep. Posts
		// of up to a few slices take it as a quick write that keeps the
		// P. Announced as a syscall, a kick that outlasts sysmon's 20 us
		// tick while no other P is idle (two rails' owners each in a
		// kick, on two CPUs) has its P handed away and must win one
		// back, and sysmon, having retaken a P, wakes again 20 us later:
		// owners posting 64 KiB slices back to back paid for both in
		// every post, with the CPUs already busy in the kernel.
		// Larger posts go through the scheduler, so no P is held for
		// long.
		kick := ucmd.RawWrite
		if payload <= quickKickBytes {
			kick = ucmd.QuickWrite
		}
		if kerr := kick(q.kickFD, q.kick); kerr != nil {
			return n, kerr
		}
	}
	return n, err
}

// quickKickBytes bounds the payload a post may carry and still be kicked
// with ucmd.QuickWrite: four of package rdma's default 64 KiB slices. (A
// READ's request carries no payload, so its kick is always quick, though
// on 6.1 the responder's reply runs inline too.)
const quickKickBytes = 256 << 10

func (q *qp) PostRecv(wrs []uverbs.RecvWR) (int, error) { return q.rq.post(wrs) }

// StateChanged resynchronizes the producer indices after a move to RESET:
// the kernel may keep or reset the shared indices, so re-read what it
// published rather than trusting our copies.
func (q *qp) StateChanged(s uverbs.QPState) {
	if s == uverbs.QPStateReset {
		q.sq.prod = q.sq.r.producer()
		q.rq.prod = q.rq.r.producer()
	}
}

func (q *qp) Destroyed() error {
	e1 := q.sqReg.Unmap()
	e2 := q.rqReg.Unmap()
	e3 := q.kickMR.Unmap()
	for _, e := range []error{e1, e2, e3} {
		if e != nil {
			return e
		}
	}
	return nil
}
