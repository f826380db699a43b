package mlx5sim

import "fmt"

// Loopback plays the HCA for one RC QP connected to itself and one CQ,
// over rings a provider's unit test built without a kernel (package
// mlx5's ring tests): it follows the QP's doorbell records, checks each
// WQE's index and QPN, delivers SENDs and WRITEs with immediate into the
// QP's own receive queue, and writes CQE64s with the owner bit of its pass
// over the CQ. It completes work by length only: no key is checked and no
// memory outside the rings is read or written (atomics complete too).
// Unlike Fabric it runs only when Step is called, on the caller's
// goroutine.
type Loopback struct {
	q qp
	c cq
	n Counters
}

// LoopbackConfig describes the rings a Loopback runs.
type LoopbackConfig struct {
	SQ, RQ   []byte // the send queue (WQEBBs) and receive queue
	RQShift  uint32 // log2 of a receive WQE's size
	QPRecord []byte // the QP's doorbell record (receive, send counters)
	CQ       []byte // the CQE64 ring, a power of two entries
	CQRecord []byte // the CQ's doorbell record (consumer index, arm)
	QPN      uint32
	UIdx     uint32 // the QP's user index, as its CQEs carry it
}

// NewLoopback returns the HCA for the rings of cfg.
func NewLoopback(cfg LoopbackConfig) *Loopback {
	l := &Loopback{}
	l.q = qp{sq: cfg.SQ, rq: cfg.RQ, sqCnt: uint32(len(cfg.SQ) / wqebb), rqShift: cfg.RQShift,
		rec: cfg.QPRecord, qpn: cfg.QPN, uidx: cfg.UIdx, scq: &l.c, rcq: &l.c, state: stateRTS}
	if len(cfg.RQ) > 0 {
		l.q.rqCnt = uint32(len(cfg.RQ) >> cfg.RQShift)
	}
	l.c = cq{buf: cfg.CQ, cnt: uint32(len(cfg.CQ) / cqeSize), rec: cfg.CQRecord, chW: -1, n: &l.n}
	return l
}

// Counters returns the WQEs executed and CQEs written so far.
func (l *Loopback) Counters() Counters { return l.n }

// CQProducer is the CQ's free-running producer index.
func (l *Loopback) CQProducer() uint32 { return l.c.pi }

// SetCQProducer moves the producer index (a test starting near a wrap).
func (l *Loopback) SetCQProducer(pi uint32) { l.c.pi = pi }

// Reset restarts both work queues from zero, as the HCA does when the QP
// goes through RESET.
func (l *Loopback) Reset() { l.q.sqPI, l.q.rqCI = 0, 0 }

// Emit writes cqe at the producer index with this pass's owner bit (a
// test placing completions of its own); it fails when the CQ is full.
func (l *Loopback) Emit(cqe *[cqeSize]byte) error {
	if !l.c.room(1) {
		return fmt.Errorf("mlx5sim: CQ overrun at producer index %d", l.c.pi)
	}
	l.c.emit(cqe, false)
	return nil
}

// Step processes every WQE the send doorbell record announces. It returns
// false when it stopped early because the CQ had no room for the next
// WQE's completions. err reports what a device would refuse: a WQE whose
// index or QPN is not the QP's, a SEND with no receive posted.
func (l *Loopback) Step() (ok bool, err error) {
	q := &l.q
	pi := record(q.rec, qpRecSend) & 0xffff
	for uint16(q.sqPI) != uint16(pi) {
		if !l.c.room(2) {
			return false, err
		}
		ctrl := int(q.sqPI&(q.sqCnt-1)) * wqebb
		w0, w1 := be.Uint32(q.sq[ctrl:]), be.Uint32(q.sq[ctrl+4:])
		if idx := (w0 >> 8) & 0xffff; idx != q.sqPI&0xffff && err == nil {
			err = fmt.Errorf("mlx5sim: WQE at %d carries index %d", q.sqPI, idx)
		}
		if w1>>8 != q.qpn && err == nil {
			err = fmt.Errorf("mlx5sim: WQE QPN %#x, want %#x", w1>>8, q.qpn)
		}
		op, ds := uint8(w0), int(w1&0x3f)
		fm := q.sq[ctrl+11]
		imm := be.Uint32(q.sq[ctrl+12:])
		length := l.payload(ctrl, op, ds)
		if op == opSend || op == opSendImm || op == opRDMAWriteImm {
			if e := l.deliver(op, length, imm); e != nil && err == nil {
				err = e
			}
		}
		if fm&fmCQUpdate != 0 {
			var e [cqeSize]byte
			fillCQE(&e, cqeReq, q, uint16(q.sqPI))
			e[cqeSopDropQPN] = op
			if op == opRDMARead {
				be.PutUint32(e[cqeByteCnt:], length)
			}
			l.c.emit(&e, false)
		}
		q.sqPI += uint32(ds*dsSize+wqebb-1) / wqebb
		l.n.WQEs++
	}
	return true, err
}

// payload sums the data segments (or the inline length) of a WQE,
// following segments across the end of the send queue.
func (l *Loopback) payload(ctrl int, op uint8, ds int) uint32 {
	q := &l.q
	p := ctrl + dsSize
	n := ds - 1
	switch op {
	case opRDMAWrite, opRDMAWriteImm, opRDMARead:
		p, n = p+dsSize, n-1
	case opAtomicCS, opAtomicFA:
		p, n = p+2*dsSize, n-2
	}
	if n <= 0 {
		return 0
	}
	if hdr := be.Uint32(q.segment(p)); hdr&inlineBit != 0 {
		return hdr &^ inlineBit
	}
	var sum uint32
	for i := range n {
		sum += be.Uint32(q.segment(p + i*dsSize))
	}
	return sum
}

// deliver consumes the oldest posted receive of the (loopback) QP.
func (l *Loopback) deliver(op uint8, length, imm uint32) error {
	q := &l.q
	if uint16(q.rqCI) == uint16(record(q.rec, qpRecRecv)) {
		return fmt.Errorf("mlx5sim: SEND with no receive posted (RNR)")
	}
	slot := int(q.rqCI&(q.rqCnt-1)) << q.rqShift
	var room uint32
	for p := slot; p < slot+1<<q.rqShift; p += dsSize {
		if be.Uint32(q.rq[p+4:]) == invalidLKey {
			break
		}
		room += be.Uint32(q.rq[p:])
	}
	q.rqCI++
	var e [cqeSize]byte
	switch {
	case length > room && op != opRDMAWriteImm: // WRITE data goes to remote memory
		fillCQE(&e, cqeRespErr, q, 0)
		e[cqeSyndrome] = syndLocalLength
	default:
		opc := uint8(cqeRespSend)
		switch op {
		case opSendImm:
			opc = cqeRespSendImm
		case opRDMAWriteImm:
			opc = cqeRespWrImm
		}
		fillCQE(&e, opc, q, 0)
		be.PutUint32(e[cqeByteCnt:], length)
		be.PutUint32(e[cqeFlagsRQPN:], 2<<28|q.qpn&0xffffff)
		if op != opSend {
			be.PutUint32(e[cqeImm:], imm)
		}
	}
	l.c.emit(&e, false)
	return nil
}
