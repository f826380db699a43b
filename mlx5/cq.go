package mlx5

import (
	"math/bits"
	"sync/atomic"

	"github.com/rdmago/te/uverbs"
)

// cqRing is the consumer side of a completion queue: cnt CQE64 entries
// that the HCA writes, each valid when its opcode is not INVALID and its
// owner bit equals the parity of the consumer's pass over the ring.
type cqRing struct {
	buf []byte // cnt * 64 bytes
	cnt uint32 // entries, a power of two
	ci  uint32 // free-running consumer index
	cqn uint32
	// armSN is the 2-bit arm sequence, bumped per consumed completion
	// event. Atomic: the event is consumed by whoever reads the channel
	// (rdma: the rail's event goroutine) while the owner arms.
	armSN atomic.Uint32

	setCI  *uint32 // doorbell record word 0
	armRec *uint32 // doorbell record word 1
	armReg *uint64 // UAR + MLX5_CQ_DOORBELL
}

// initInvalid fills every entry with an INVALID opcode and owner 0 so that
// nothing is mistaken for a completion before the HCA writes it.
func initInvalid(buf []byte) {
	clear(buf)
	for off := 0; off < len(buf); off += cqeSize {
		buf[off+cqeOpOwn] = cqeInvalidOpOwn
	}
}

// next returns the next valid CQE, or nil. A valid CQE is consumed.
func (c *cqRing) next() []byte {
	off := int(c.ci&(c.cnt-1)) * cqeSize
	cqe := c.buf[off : off+cqeSize : off+cqeSize]
	// An acquire load of the last word (wqe_counter, signature, op_own):
	// no later read of the CQE can be satisfied before it. That is all
	// x86-64 needs for device writes to cacheable memory (Linux's dma_rmb
	// is a compiler barrier there); rdma-core's LFENCE costs ~10 ns per
	// CQE on current AMD and Intel parts and orders nothing more here.
	if !c.current(uint8(loadAcquire32(cqe, cqeWQECounter)>>24), c.ci) {
		return nil
	}
	fromDeviceBarrier() // arm64: DMB OSHLD; x86-64: nothing (see above)
	c.ci++
	return cqe
}

// current reports whether op_own byte op makes the entry at free-running
// index i a CQE of the HCA's current pass: its opcode is not INVALID and
// its owner bit equals the parity of the pass.
func (c *cqRing) current(op uint8, i uint32) bool {
	return op>>4 != cqeInvalid && (op&1 != 0) == (i&c.cnt != 0)
}

// valid reports whether the entry at free-running index i holds a CQE of
// the current pass (the same acquire load as next).
func (c *cqRing) valid(i uint32) bool {
	off := int(i&(c.cnt-1)) * cqeSize
	return c.current(uint8(loadAcquire32(c.buf, off+cqeWQECounter)>>24), i)
}

// updateCI publishes the consumer index so the HCA can reuse entries.
func (c *cqRing) updateCI() {
	storeRecord(c.setCI, bits.ReverseBytes32(c.ci&0xffffff))
}

// arm requests an event for the next (or next solicited) completion:
// arm record, SFENCE, one 64-bit store to the CQ doorbell, SFENCE.
func (c *cqRing) arm(solicitedOnly bool) {
	cmd := uint32(cqDBReqNot)
	if solicitedOnly {
		cmd = cqDBReqNotSol
	}
	v := (c.armSN.Load()&3)<<28 | cmd | c.ci&0xffffff
	ringDoorbell(c.armRec, bits.ReverseBytes32(v), c.armReg, bits.ReverseBytes64(uint64(v)<<32|uint64(c.cqn)))
}

// qpLookup maps a CQE's user index to its QP rings. It returns nil for
// an index that was never used, and retired for a destroyed QP.
type qpLookup interface {
	lookup(uidx uint32) *qpRings
}

// poll decodes up to len(wcs) completions; QPs are found by user index
// (CQE version 1). A CQE of a destroyed QP is dropped. A CQE naming a user
// index this context never gave out cannot be attributed to a work
// request: it is consumed and ends the poll with ErrStrayCompletion.
func (c *cqRing) poll(wcs []WC, qps qpLookup) (int, error) {
	n := 0
	consumed := false
	var err error
	for n < len(wcs) {
		cqe := c.next()
		if cqe == nil {
			break
		}
		consumed = true
		op := cqe[cqeOpOwn] >> 4
		if op == cqeResizeCQ {
			continue
		}
		qp := qps.lookup(be.Uint32(cqe[cqeSRQNUIdx:]) & 0xffffff)
		if qp == retired {
			continue
		}
		if qp == nil {
			err = uverbs.ErrStrayCompletion
			break
		}
		if decodeCQE(cqe, op, qp, &wcs[n]) {
			n++
		}
	}
	if consumed {
		c.updateCI()
	}
	return n, err
}

// clean discards the unpolled CQEs of user index uidx (a QP that was reset
// or destroyed), keeping the others in order. It finds the producer end,
// then walks back to the consumer index, sliding each kept entry forward
// over the discarded ones (each slot keeps its own owner bit), and
// finally advances the consumer index past the freed slots. The HCA
// writes no CQE for a QP in RESET, and the slots rewritten lie between
// the consumer index and the last valid entry, which it does not touch.
func (c *cqRing) clean(uidx uint32) {
	pi := c.ci
	for pi-c.ci < c.cnt && c.valid(pi) {
		pi++
	}
	fromDeviceBarrier()
	freed := uint32(0)
	for i := pi; i != c.ci; {
		i--
		off := int(i&(c.cnt-1)) * cqeSize
		cqe := c.buf[off : off+cqeSize : off+cqeSize]
		if cqe[cqeOpOwn]>>4 != cqeResizeCQ && be.Uint32(cqe[cqeSRQNUIdx:])&0xffffff == uidx {
			freed++
			continue
		}
		if freed == 0 {
			continue
		}
		doff := int((i+freed)&(c.cnt-1)) * cqeSize
		dst := c.buf[doff : doff+cqeSize : doff+cqeSize]
		owner := dst[cqeOpOwn] & 1
		copy(dst, cqe)
		dst[cqeOpOwn] = dst[cqeOpOwn]&^1 | owner
	}
	if freed > 0 {
		c.ci += freed
		c.updateCI()
	}
}

// retired marks the user index of a destroyed QP.
var retired = new(qpRings)

// decodeCQE fills wc from a valid CQE of the given QP and retires the
// work request it completes. A CQE for a queue with nothing outstanding
// (left over from before the QP was reset) is dropped: it returns false.
func decodeCQE(cqe []byte, op uint8, qp *qpRings, wc *WC) bool {
	_ = cqe[cqeSize-1]
	switch op {
	case cqeReq, cqeReqErr:
		if qp.sq.idle() {
			return false
		}
	case cqeRespWrImm, cqeRespSend, cqeRespSendImm, cqeRespSendInv, cqeRespErr:
		if qp.rq.idle() {
			return false
		}
	}
	sop := be.Uint32(cqe[cqeSopDropQPN:])
	*wc = WC{QPN: uverbs.QPN(sop & 0xffffff)}
	switch op {
	case cqeReq:
		wc.ID = qp.sq.complete(be.Uint16(cqe[cqeWQECounter:]))
		switch uint8(sop >> 24) {
		case opcodeRDMAWriteImm:
			wc.Flags = uverbs.WCFlagWithImm
			wc.Opcode = uverbs.WCRDMAWrite
		case opcodeRDMAWrite:
			wc.Opcode = uverbs.WCRDMAWrite
		case opcodeSendImm:
			wc.Flags = uverbs.WCFlagWithImm
			wc.Opcode = uverbs.WCSend
		case opcodeSend:
			wc.Opcode = uverbs.WCSend
		case opcodeRDMARead:
			wc.Opcode = uverbs.WCRDMARead
			wc.ByteLen = be.Uint32(cqe[cqeByteCnt:])
		case opcodeAtomicCS:
			wc.Opcode = uverbs.WCCompSwap
			wc.ByteLen = atomicSize
		case opcodeAtomicFA:
			wc.Opcode = uverbs.WCFetchAdd
			wc.ByteLen = atomicSize
		}
	case cqeRespWrImm, cqeRespSend, cqeRespSendImm, cqeRespSendInv:
		wc.ID = qp.rq.complete()
		wc.ByteLen = be.Uint32(cqe[cqeByteCnt:])
		flagsRQPN := be.Uint32(cqe[cqeFlagsRQPN:])
		wc.SrcQP = uverbs.QPN(flagsRQPN & 0xffffff)
		wc.SL = uint8(flagsRQPN>>24) & 0xf
		wc.SLID = be.Uint16(cqe[cqeSLID:])
		wc.DLIDPathBits = cqe[cqeMLPath] & 0x7f
		if (flagsRQPN>>28)&3 != 0 {
			wc.Flags |= uverbs.WCFlagGRH
		}
		wc.Opcode = uverbs.WCRecv
		switch op {
		case cqeRespWrImm:
			wc.Opcode = uverbs.WCRecvRDMAWithImm
			wc.Flags |= uverbs.WCFlagWithImm
			wc.Imm = be.Uint32(cqe[cqeImmInvalPKey:])
		case cqeRespSendImm:
			wc.Flags |= uverbs.WCFlagWithImm
			wc.Imm = be.Uint32(cqe[cqeImmInvalPKey:])
		case cqeRespSendInv:
			wc.Flags |= uverbs.WCFlagWithInvalidate
			wc.Imm = be.Uint32(cqe[cqeImmInvalPKey:])
		}
	case cqeReqErr, cqeRespErr:
		wc.Status = syndromeStatus(cqe[cqeSyndrome])
		wc.VendorErr = uint32(cqe[cqeVendorErrSynd])
		if op == cqeReqErr {
			wc.ID = qp.sq.complete(be.Uint16(cqe[cqeWQECounter:]))
		} else {
			wc.ID = qp.rq.complete()
		}
	default:
		// An opcode an RC QP without scatter-to-CQE, SRQ or signature
		// offload never produces.
		wc.Status = uverbs.WCGeneralErr
	}
	return true
}

// syndromeStatus maps an error CQE syndrome to a completion status, as
// rdma-core's mlx5_handle_error_cqe does.
func syndromeStatus(s uint8) uverbs.WCStatus {
	switch s {
	case syndLocalLengthErr:
		return uverbs.WCLocLenErr
	case syndLocalQPOpErr:
		return uverbs.WCLocQPOpErr
	case syndLocalProtErr:
		return uverbs.WCLocProtErr
	case syndWRFlushErr:
		return uverbs.WCWRFlushErr
	case syndMWBindErr:
		return uverbs.WCMWBindErr
	case syndBadRespErr:
		return uverbs.WCBadRespErr
	case syndLocalAccessErr:
		return uverbs.WCLocAccessErr
	case syndRemoteInvalReqErr:
		return uverbs.WCRemInvReqErr
	case syndRemoteAccessErr:
		return uverbs.WCRemAccessErr
	case syndRemoteOpErr:
		return uverbs.WCRemOpErr
	case syndTransportRetryExc:
		return uverbs.WCRetryExcErr
	case syndRNRRetryExc:
		return uverbs.WCRNRRetryExcErr
	case syndRemoteAbortedErr:
		return uverbs.WCRemAbortErr
	}
	return uverbs.WCGeneralErr
}
