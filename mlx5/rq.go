package mlx5

import (
	"math/bits"
	"sync/atomic"
)

// recvQueue is the producer side of an RC QP's receive queue: slots of
// 1<<shift bytes, each a list of data segments, terminated by an invalid
// lkey when shorter than the slot.
//
// As for the send queue, head is published to the poller with a release
// store and tail back to the poster.
type recvQueue struct {
	buf   []byte // the RQ part of the QP buffer: cnt << shift bytes
	cnt   uint32 // slots, a power of two
	shift uint
	head  uint32        // receives posted (poster only)
	pub   atomic.Uint32 // head as published to the poller
	tail  atomic.Uint32 // receives completed
	maxGS int
	wrid  []uint64
}

func (rq *recvQueue) build(wr *RecvWR) error {
	if rq.head-rq.tail.Load() >= rq.cnt {
		return errRecvQueueFull
	}
	if len(wr.SGL) > rq.maxGS {
		return errTooManySGE
	}
	slot := rq.head & (rq.cnt - 1)
	off := int(slot) << rq.shift
	j := 0
	for i := range wr.SGL {
		s := &wr.SGL[i]
		if s.Length == 0 {
			continue
		}
		p := off + j*segSize
		putDataSeg(rq.buf[p:p+segSize], s.Length, uint32(s.LKey), s.Addr)
		j++
	}
	if j < rq.maxGS {
		p := off + j*segSize
		putDataSeg(rq.buf[p:p+segSize], 0, invalidLKey, 0)
	}
	rq.wrid[slot] = wr.ID
	rq.head++
	return nil
}

// ring publishes the producer counter to the poller and in the doorbell
// record; receives need no MMIO doorbell.
func (rq *recvQueue) ring(rec *uint32) {
	rq.pub.Store(rq.head)
	storeRecord(rec, bits.ReverseBytes32(rq.head&0xffff))
}

// complete retires the oldest receive (RC receives complete in order).
func (rq *recvQueue) complete() uint64 {
	rq.pub.Load() // acquire: wrid entries were written before it was stored
	t := rq.tail.Load()
	id := rq.wrid[t&(rq.cnt-1)]
	rq.tail.Store(t + 1)
	return id
}

// idle reports whether no posted receive is outstanding (poller side).
func (rq *recvQueue) idle() bool { return rq.pub.Load() == rq.tail.Load() }
