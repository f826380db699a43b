//go:build amd64 || arm64

package mlx5

import (
	"encoding/binary"
	"math/bits"
	"testing"

	"github.com/rdmago/te/internal/dma"
)

// A simulated HCA: it consumes the send and receive queues the way the
// device does (doorbell records, WQE formats) and writes CQE64 entries with
// the right owner bit into the mmap'd CQ buffer.

// fakeCQE describes one completion as the HCA would write it.
type fakeCQE struct {
	opcode     uint8 // CQE opcode (op_own >> 4)
	se         bool
	owner      uint8
	wqeCounter uint16
	sop        uint8 // requester: the send WQE opcode
	qpn        uint32
	uidx       uint32
	byteCnt    uint32
	imm        uint32
	flagsRQPN  uint32
	slid       uint16
	mlPath     uint8
	timestamp  uint64
	syndrome   uint8 // error CQEs
	vendorErr  uint8
}

// put writes the CQE into b[0:64]; op_own goes last, as the HCA makes the
// entry valid only once the rest is in place.
func (c *fakeCQE) put(b []byte) {
	_ = b[63]
	clear(b[:63])
	b[cqeMLPath] = c.mlPath
	be.PutUint16(b[cqeSLID:], c.slid)
	be.PutUint32(b[cqeFlagsRQPN:], c.flagsRQPN)
	be.PutUint32(b[cqeSRQNUIdx:], c.uidx)
	be.PutUint32(b[cqeImmInvalPKey:], c.imm)
	be.PutUint32(b[cqeByteCnt:], c.byteCnt)
	if c.opcode == cqeReqErr || c.opcode == cqeRespErr {
		b[cqeVendorErrSynd] = c.vendorErr
		b[cqeSyndrome] = c.syndrome
	} else {
		be.PutUint64(b[cqeTimestamp:], c.timestamp)
	}
	be.PutUint32(b[cqeSopDropQPN:], uint32(c.sop)<<24|c.qpn&0xffffff)
	be.PutUint16(b[cqeWQECounter:], c.wqeCounter)
	op := c.opcode<<4 | c.owner&1
	if c.se {
		op |= 2
	}
	b[cqeOpOwn] = op
}

// simHCA plays the device for one loopback RC QP and its CQ: it follows
// the doorbell records, parses the WQEs the way the HCA does, delivers
// SENDs into the QP's own receive queue, and writes CQEs with the owner
// bit of its pass over the CQ. It only touches the mmap'd rings, records
// and the UAR stand-in, never the Go-side queue state.
type simHCA struct {
	t                testing.TB
	sq, rq           []byte // the QP's work queues
	sqCnt, rqCnt     uint32
	rqShift          uint
	qpRec            []byte // QP doorbell record (recv, send)
	cq               []byte
	cqCnt            uint32
	cqRec            []byte // CQ doorbell record (set_ci, arm)
	qpn, uidx        uint32
	sqPI, rqCI, cqPI uint32 // WQEBBs consumed, receives consumed, CQEs produced
	wqes, cqes       int
}

func newSimHCA(t testing.TB, q *qpRings, qpRec []byte, cq *cqRing, cqRec []byte, uidx uint32) *simHCA {
	return &simHCA{
		t: t, sq: q.sq.buf, rq: q.rq.buf, sqCnt: q.sq.cnt, rqCnt: q.rq.cnt, rqShift: q.rq.shift,
		qpRec: qpRec, cq: cq.buf, cqCnt: cq.cnt, cqRec: cqRec, qpn: q.sq.qpn, uidx: uidx,
	}
}

// record reads a big-endian doorbell-record word.
func record(b []byte, off int) uint32 { return bits.ReverseBytes32(dma.LoadAcquire32(b, off)) }

// step processes every WQE the doorbell record announces; it returns false
// if it could not finish because the CQ is full.
func (h *simHCA) step() bool {
	pi := record(h.qpRec, qpRecSend*4) & 0xffff
	for uint16(h.sqPI) != uint16(pi) {
		if !h.cqRoom(2) {
			return false
		}
		ctrl := int(h.sqPI&(h.sqCnt-1)) * sendWQEBB
		w0 := be.Uint32(h.sq[ctrl:])
		w1 := be.Uint32(h.sq[ctrl+4:])
		if idx := (w0 >> 8) & 0xffff; idx != h.sqPI&0xffff {
			h.t.Errorf("HCA: WQE at %d carries index %d", h.sqPI, idx)
		}
		if w1>>8 != h.qpn {
			h.t.Errorf("HCA: WQE QPN %#x, want %#x", w1>>8, h.qpn)
		}
		op, ds := uint8(w0), int(w1&0x3f)
		fm := h.sq[ctrl+ctrlFmCeSe]
		imm := be.Uint32(h.sq[ctrl+ctrlImm:])
		length := h.payload(ctrl, op, ds)
		if op == opcodeSend || op == opcodeSendImm || op == opcodeRDMAWriteImm {
			h.deliver(op, length, imm)
		}
		if fm&ctrlCQUpdate != 0 {
			c := fakeCQE{opcode: cqeReq, sop: op, qpn: h.qpn, uidx: h.uidx, wqeCounter: uint16(h.sqPI)}
			if op == opcodeRDMARead {
				c.byteCnt = length
			}
			h.emit(&c)
		}
		h.sqPI += uint32(ds*segSize+sendWQEBB-1) / sendWQEBB
		h.wqes++
	}
	return true
}

// payload sums the data segments (or the inline length) of a WQE,
// following segments across the end of the send queue.
func (h *simHCA) payload(ctrl int, op uint8, ds int) uint32 {
	p := ctrl + segSize
	n := ds - 1
	switch op {
	case opcodeRDMAWrite, opcodeRDMAWriteImm, opcodeRDMARead:
		p, n = p+segSize, n-1
	case opcodeAtomicCS, opcodeAtomicFA:
		p, n = p+2*segSize, n-2
	}
	if n == 0 {
		return 0
	}
	if hdr := be.Uint32(h.sq[p:]); hdr&inlineSeg != 0 {
		return hdr &^ inlineSeg
	}
	var sum uint32
	for range n {
		if p == len(h.sq) {
			p = 0
		}
		sum += be.Uint32(h.sq[p:])
		p += segSize
	}
	return sum
}

// deliver consumes the oldest posted receive of the (loopback) QP.
func (h *simHCA) deliver(op uint8, length, imm uint32) {
	if uint16(h.rqCI) == uint16(record(h.qpRec, qpRecRecv*4)) {
		h.t.Errorf("HCA: SEND with no receive posted (RNR)")
		return
	}
	slot := int(h.rqCI&(h.rqCnt-1)) << h.rqShift
	var room uint32
	for p := slot; p < slot+1<<h.rqShift; p += segSize {
		if be.Uint32(h.rq[p+4:]) == invalidLKey {
			break
		}
		room += be.Uint32(h.rq[p:])
	}
	h.rqCI++
	c := fakeCQE{opcode: cqeRespSend, qpn: h.qpn, uidx: h.uidx, byteCnt: length, flagsRQPN: 2<<28 | h.qpn}
	switch {
	case length > room && op != opcodeRDMAWriteImm: // WRITE data goes to remote memory
		c = fakeCQE{opcode: cqeRespErr, qpn: h.qpn, uidx: h.uidx, syndrome: syndLocalLengthErr}
	case op == opcodeSendImm:
		c.opcode, c.imm = cqeRespSendImm, imm
	case op == opcodeRDMAWriteImm:
		c.opcode, c.imm = cqeRespWrImm, imm
	}
	h.emit(&c)
}

func (h *simHCA) cqRoom(n uint32) bool {
	ci := record(h.cqRec, cqRecSetCI*4) & 0xffffff
	return (h.cqPI-ci)&0xffffff+n <= h.cqCnt
}

// emit writes a CQE at the producer index with this pass's owner bit.
func (h *simHCA) emit(c *fakeCQE) {
	if !h.cqRoom(1) {
		h.t.Errorf("HCA: CQ overrun at producer index %d", h.cqPI)
		return
	}
	c.owner = 0
	if h.cqPI&h.cqCnt != 0 {
		c.owner = 1
	}
	off := int(h.cqPI&(h.cqCnt-1)) * cqeSize
	var tmp [cqeSize]byte
	c.put(tmp[:])
	copy(h.cq[off:off+60], tmp[:60])
	// The last word (wqe_counter, signature, op_own) goes last, in one
	// ordered store, as the HCA validates an entry.
	dma.StoreRelease32(h.cq, off+60, binary.LittleEndian.Uint32(tmp[60:]))
	h.cqPI++
	h.cqes++
}
