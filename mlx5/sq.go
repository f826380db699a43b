package mlx5

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

var be = binary.BigEndian

// sendQueue is the producer side of an RC QP's send queue: a ring of
// 64-byte WQE basic blocks (WQEBBs) in a buffer the HCA reads.
//
// The posting goroutine and the goroutine polling the CQ may differ (the
// uverbs contract is one owner per queue, not per QP), so what they share
// is synchronized: the poster publishes head with a release store after
// writing the wrid/wqeHead entries and before ringing; the poller loads it
// (acquire) before reading those entries and publishes tail, which the
// poster reads for its full check.
type sendQueue struct {
	buf       []byte        // the SQ part of the QP buffer: cnt * 64 bytes
	cnt       uint32        // WQEBBs, a power of two
	curPost   uint32        // free-running producer counter in WQEBBs
	head      uint32        // work requests posted (poster only)
	pub       atomic.Uint32 // head as published to the poller
	tail      atomic.Uint32 // work requests completed (advanced by CQEs)
	maxPost   uint32        // outstanding work requests the ring can hold
	maxGS     int
	maxInline int
	qpn       uint32
	sigAll    uint8 // ctrlCQUpdate when every WQE generates a CQE

	wrid    []uint64 // per first WQEBB of a WQE: its work request ID
	wqeHead []uint32 // per first WQEBB: head when it was posted

	// The last WQE built, for the doorbell.
	lastCtrl   int
	lastDS     uint32
	lastInline bool
	lastW0     uint32 // opmod_idx_opcode (host order)
	lastW1     uint32 // qpn_ds (host order)
}

func putDataSeg(b []byte, length, lkey uint32, addr uint64) {
	_ = b[15]
	be.PutUint32(b[0:], length)
	be.PutUint32(b[4:], lkey)
	be.PutUint64(b[8:], addr)
}

func putRaddrSeg(b []byte, raddr uint64, rkey uint32) {
	_ = b[15]
	be.PutUint64(b[0:], raddr)
	be.PutUint32(b[8:], rkey)
	be.PutUint32(b[12:], 0)
}

// build writes one WQE for wr at the producer position without ringing
// the doorbell. On error nothing is consumed.
func (sq *sendQueue) build(wr *SendWR) error {
	if sq.head-sq.tail.Load() >= sq.maxPost {
		return errSendQueueFull
	}
	if len(wr.SGL) > sq.maxGS {
		return errTooManySGE
	}
	inline := wr.Flags&uverbs.SendInline != 0
	var opcode uint8
	var imm uint32
	switch wr.Opcode {
	case uverbs.WRSend:
		opcode = opcodeSend
	case uverbs.WRSendWithImm:
		opcode, imm = opcodeSendImm, wr.Imm
	case uverbs.WRRDMAWrite:
		opcode = opcodeRDMAWrite
	case uverbs.WRRDMAWriteWithImm:
		opcode, imm = opcodeRDMAWriteImm, wr.Imm
	case uverbs.WRRDMARead:
		opcode = opcodeRDMARead
		if inline {
			return errInvalidWR // nothing to inline: READ has no outgoing payload
		}
	case uverbs.WRAtomicCmpAndSwp, uverbs.WRAtomicFetchAndAdd:
		// One 8-byte local buffer, an 8-byte aligned remote word.
		if inline || len(wr.SGL) != 1 || wr.SGL[0].Length != atomicSize || wr.RemoteAddr%atomicSize != 0 {
			return errInvalidWR
		}
		opcode = opcodeAtomicCS
		if wr.Opcode == uverbs.WRAtomicFetchAndAdd {
			opcode = opcodeAtomicFA
		}
	default:
		return errInvalidWR
	}
	inlineLen := 0
	if inline {
		for i := range wr.SGL {
			inlineLen += int(wr.SGL[i].Length)
		}
		if inlineLen > sq.maxInline {
			return errInlineTooLong
		}
	}

	b := sq.buf
	idx := sq.curPost & (sq.cnt - 1)
	ctrl := int(idx) << sendWQEShift
	p := ctrl + segSize // never at the end: ctrl starts a 64-byte block
	ds := uint32(1)

	switch opcode {
	case opcodeRDMAWrite, opcodeRDMAWriteImm, opcodeRDMARead:
		putRaddrSeg(b[p:p+segSize], wr.RemoteAddr, uint32(wr.RKey))
		p += segSize
		ds++
	case opcodeAtomicCS, opcodeAtomicFA:
		putRaddrSeg(b[p:p+segSize], wr.RemoteAddr, uint32(wr.RKey))
		p += segSize
		a := b[p : p+segSize]
		if opcode == opcodeAtomicCS {
			be.PutUint64(a[0:], wr.Swap)
			be.PutUint64(a[8:], wr.CompareAdd)
		} else {
			// FETCH_ADD: the addend; the compare half is ignored and, as
			// in rdma-core, left untouched.
			be.PutUint64(a[0:], wr.CompareAdd)
		}
		p += segSize
		ds += 2
		s := &wr.SGL[0]
		putDataSeg(b[p:p+segSize], atomicSize, uint32(s.LKey), s.Addr)
		ds++
		goto ctrlSeg
	}

	if inline {
		if inlineLen > 0 {
			// The payload follows the 4-byte header and may wrap to the
			// start of the send queue, even in the middle of an SGE.
			q := p + 4
			for i := range wr.SGL {
				src := dma.At(wr.SGL[i].Addr, int(wr.SGL[i].Length))
				c := copy(b[q:], src)
				q += c
				if c < len(src) {
					q = copy(b, src[c:])
				}
			}
			be.PutUint32(b[p:], uint32(inlineLen)|inlineSeg)
			ds += uint32(inlineLen+4+segSize-1) / segSize
		}
	} else {
		for i := range wr.SGL {
			s := &wr.SGL[i]
			if s.Length == 0 {
				continue
			}
			if p == len(b) {
				p = 0
			}
			putDataSeg(b[p:p+segSize], s.Length, uint32(s.LKey), s.Addr)
			p += segSize
			ds++
		}
	}

ctrlSeg:
	fm := sq.sigAll
	if wr.Flags&uverbs.SendSignaled != 0 {
		fm |= ctrlCQUpdate
	}
	if wr.Flags&uverbs.SendSolicited != 0 {
		fm |= ctrlSolicited
	}
	if wr.Flags&uverbs.SendFence != 0 {
		fm |= ctrlFence
	}
	w0 := (sq.curPost&0xffff)<<8 | uint32(opcode)
	w1 := sq.qpn<<8 | ds
	c := b[ctrl : ctrl+segSize]
	be.PutUint32(c[ctrlOpmodIdxOpcode:], w0)
	be.PutUint32(c[ctrlQPNDS:], w1)
	be.PutUint32(c[ctrlSignature:], uint32(fm)) // signature, stream id = 0
	be.PutUint32(c[ctrlImm:], imm)

	sq.wrid[idx] = wr.ID
	sq.wqeHead[idx] = sq.head
	sq.head++
	sq.lastCtrl, sq.lastDS, sq.lastInline = ctrl, ds, inline
	sq.lastW0, sq.lastW1 = w0, w1
	sq.curPost += (ds*segSize + sendWQEBB - 1) / sendWQEBB
	return nil
}

// doorbellValue is the 64-bit value of a regular doorbell: the first 8
// bytes of the last WQE's control segment as they lie in memory, as one
// little-endian word for a single MOVQ.
func (sq *sendQueue) doorbellValue() uint64 {
	return uint64(bits.ReverseBytes32(sq.lastW0)) | uint64(bits.ReverseBytes32(sq.lastW1))<<32
}

// ring tells the HCA about WQEs built since the last ring: doorbell record,
// then a regular doorbell or, for a single small inline WQE on a
// BlueFlame register, a copy of the whole WQE.
func (sq *sendQueue) ring(rec *uint32, db *bfreg, nreq int) {
	recVal := bits.ReverseBytes32(sq.curPost & 0xffff)
	if db.shared {
		db.mu.Lock()
	}
	reg := db.reg[db.half]
	if nreq == 1 && db.bfHalf > 0 && sq.lastInline && sq.lastDS > 1 && sq.lastDS*segSize <= db.bfHalf {
		words := int((sq.lastDS*segSize+sendWQEBB-1)/sendWQEBB) * (sendWQEBB / 8)
		first := min(words, (len(sq.buf)-sq.lastCtrl)/8)
		ringBlueFlame(rec, recVal, reg, word64(sq.buf, sq.lastCtrl), uintptr(first), word64(sq.buf, 0), uintptr(words-first))
	} else {
		ringDoorbell(rec, recVal, reg, sq.doorbellValue())
	}
	if db.bfHalf > 0 {
		db.half ^= 1
	}
	if db.shared {
		db.mu.Unlock()
	}
}

// complete retires the WQE whose first WQEBB has the given 16-bit counter
// and every earlier one (unsignaled WQEs complete silently), returning its
// work request ID.
func (sq *sendQueue) complete(wqeCounter uint16) uint64 {
	sq.pub.Load() // acquire: the entries below were written before it was stored
	idx := uint32(wqeCounter) & (sq.cnt - 1)
	id := sq.wrid[idx] // before tail moves: then the poster may reuse the slot
	sq.tail.Store(sq.wqeHead[idx] + 1)
	return id
}

// idle reports whether nothing posted is outstanding (poller side).
func (sq *sendQueue) idle() bool { return sq.pub.Load() == sq.tail.Load() }
