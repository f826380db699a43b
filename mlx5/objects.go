package mlx5

import (
	"errors"
	"fmt"

	"github.com/rdmago/te/internal/dma"
	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/uverbs"
)

// CQ is an mlx5 completion queue: a user-allocated ring of CQE64 entries
// the HCA writes, polled by owner bit, armed through the UAR.
type CQ struct {
	uverbs.UnimplementedDriverCQ // future DriverCQ methods: ErrNotSupported
	ctx                          *Context
	ring                         cqRing
	mem                          *dma.Region
	rec                          []byte
	req                          abi.CreateCQ
	done                         bool
}

// NewCQ allocates the CQE ring (initialised INVALID) and its doorbell record.
func (c *Context) NewCQ(cfg uverbs.DriverCQConfig) (uverbs.DriverCQ, error) {
	if cfg.Entries <= 0 || cfg.Entries > maxUIdx {
		return nil, fmt.Errorf("mlx5: CQ of %d entries: %w", cfg.Entries, uverbs.ErrInvalidWR)
	}
	n, err := cqEntries(uint32(cfg.Entries), cfg.Limits.MaxCQE)
	if err != nil {
		return nil, err
	}
	mem, rec, err := c.allocQueue(int(n) * cqeSize)
	if err != nil {
		return nil, err
	}
	cq := &CQ{ctx: c, mem: mem, rec: rec}
	buf := mem.Bytes()
	initInvalid(buf)
	cq.ring = cqRing{buf: buf, cnt: n, setCI: word32(rec, cqRecSetCI*4), armRec: word32(rec, cqRecArm*4)}
	cq.req = abi.CreateCQ{BufAddr: dma.Addr(buf), DBAddr: dma.Addr(rec), CQESize: cqeSize}
	if c.dyn {
		cq.req.Flags = abi.CQFlagUARPageIndex
		cq.req.UARPageIndex = uint16(c.cqUAR.pageID)
	}
	return cq, nil
}

// allocQueue maps size bytes for a queue the HCA reads or writes and takes
// a doorbell record for it; on failure it holds neither.
func (c *Context) allocQueue(size int) (*dma.Region, []byte, error) {
	mem, err := dma.Alloc(size)
	if err != nil {
		return nil, nil, err
	}
	rec, err := c.dbs.get()
	if err != nil {
		_ = mem.Unmap()
		return nil, nil, err
	}
	return mem, rec, nil
}

// Request: the core asks for cqe = entries-1 (the kernel rounds cqe+1 up
// to a power of two, which must be the ring we allocated).
func (cq *CQ) Request() (uint32, []byte, int) {
	return cq.ring.cnt - 1, abi.Bytes(&cq.req), abi.SizeCreateCQResp
}

func (cq *CQ) Created(h uverbs.Handle, cqe uint32, out []byte) error {
	var resp abi.CreateCQResp
	copy(abi.Bytes(&resp), out)
	if cqe+1 != cq.ring.cnt {
		return fmt.Errorf("mlx5: kernel made a CQ of %d entries for a ring of %d: %w", cqe+1, cq.ring.cnt, uverbs.ErrNotSupported)
	}
	page := cq.ctx.cqArmPage()
	if page == nil {
		return errClosed
	}
	cq.ring.cqn = resp.CQN
	cq.ring.armReg = word64(page, cqDoorbellOffset)
	return nil
}

// Poll does not allocate.
func (cq *CQ) Poll(wc []uverbs.WC) (int, error) { return cq.ring.poll(wc, &cq.ctx.qps) }

// Clean drops the unpolled completions of qp (an mlx5 QP of this context)
// after the kernel reset or destroyed it, so that none is matched to work
// posted later; the core holds the CQ's owner guard (uverbs.CQCleaner).
func (cq *CQ) Clean(qp uverbs.DriverQP) {
	if q, ok := qp.(*QP); ok && cq.ring.buf != nil && !cq.done {
		cq.ring.clean(q.r.uidx)
	}
}

// Arm writes the arm record and rings the CQ doorbell; mlx5 needs no
// kernel call to request a completion event.
func (cq *CQ) Arm(solicitedOnly bool) error {
	if cq.ring.armReg == nil {
		return errClosed
	}
	cq.ring.arm(solicitedOnly)
	return nil
}

// EventConsumed advances the 2-bit arm sequence number, which the HCA
// uses to tell a new arm request from a repeated one.
func (cq *CQ) EventConsumed() { cq.ring.armSN.Add(1) }

// Destroyed releases the ring and the record after the kernel object is
// gone (the HCA no longer writes them).
func (cq *CQ) Destroyed() error {
	if cq.done {
		return nil
	}
	cq.done = true
	cq.ring.armReg = nil
	cq.ctx.dbs.put(cq.rec)
	return cq.mem.Unmap()
}

// QP is an mlx5 RC queue pair: one user buffer holding the receive queue
// then the send queue, a doorbell record, and a send doorbell register.
type QP struct {
	uverbs.UnimplementedDriverQP // future DriverQP methods: ErrNotSupported
	ctx                          *Context
	r                            qpRings
	mem                          *dma.Region
	rec                          []byte
	uar                          *dynUAR // the QP's own doorbell page (Options.DynamicUAR)
	caps                         uverbs.QPCaps
	req                          abi.CreateQP
	done                         bool
}

// NewQP sizes and allocates the work queues. Only RC is supported.
func (c *Context) NewQP(cfg uverbs.DriverQPConfig) (uverbs.DriverQP, error) {
	if cfg.Type != uverbs.QPTypeRC {
		return nil, fmt.Errorf("mlx5: QP type %d: %w", cfg.Type, ErrNotSupported)
	}
	sl, err := sqSize(cfg.Caps.MaxSendWR, cfg.Caps.MaxSendSGE, cfg.Caps.MaxInlineData, uint32(c.resp.MaxSQDescSz), c.resp.MaxSendWQEBB)
	if err != nil {
		return nil, err
	}
	rl, err := rqSize(cfg.Caps.MaxRecvWR, cfg.Caps.MaxRecvSGE, uint32(c.resp.MaxRQDescSz), c.resp.MaxRecvWR)
	if err != nil {
		return nil, err
	}
	uidx, err := c.allocUIdx()
	if err != nil {
		return nil, err
	}
	rqBytes := int(rl.cnt) << rl.shift
	mem, rec, err := c.allocQueue(rqBytes + int(sl.cnt)*sendWQEBB)
	if err != nil {
		return nil, err
	}
	q := &QP{ctx: c, mem: mem, rec: rec}
	q.r.init(mem.Bytes(), sl, rl, rec, cfg.SignalAll)
	q.r.uidx = uidx
	q.caps = uverbs.QPCaps{
		MaxSendWR: sl.maxPost, MaxSendSGE: uint32(sl.maxGS), MaxInlineData: uint32(sl.maxInline),
		MaxRecvWR: rl.cnt, MaxRecvSGE: uint32(rl.maxGS),
	}
	q.req = abi.CreateQP{
		BufAddr: dma.Addr(mem.Bytes()), DBAddr: dma.Addr(rec),
		SQWQECount: sl.cnt, RQWQECount: rl.cnt, RQWQEShift: uint32(rl.shift),
		UIdx: uidx, // no SCATTER_CQE: every payload lands in the posted buffers
	}
	if c.dyn {
		typ := uint64(abi.UARAllocTypeBF)
		if c.resp.BFRegSize == 0 {
			typ = abi.UARAllocTypeNC // no write-combining: doorbells only
		}
		q.uar, err = c.allocUAR(typ)
		if err != nil && typ == abi.UARAllocTypeBF {
			// The kernel refuses BlueFlame pages where the platform has
			// no write-combining: fall back to doorbells only.
			q.uar, err = c.allocUAR(abi.UARAllocTypeNC)
		}
		if err != nil {
			q.Destroyed()
			return nil, err
		}
		q.req.Flags |= abi.QPFlagUARPageIndex
		q.req.BFRegIndex = q.uar.pageID
	}
	return q, nil
}

// init lays out the receive queue at the start of buf and the send queue
// after it, the way the HCA addresses a QP buffer.
func (r *qpRings) init(buf []byte, sl sqLayout, rl rqLayout, rec []byte, sigAll bool) {
	rqBytes := int(rl.cnt) << rl.shift
	sqEnd := rqBytes + int(sl.cnt)*sendWQEBB
	rq, sq := &r.rq, &r.sq
	rq.buf, rq.cnt, rq.shift, rq.maxGS, rq.wrid = buf[:rqBytes:rqBytes], rl.cnt, rl.shift, rl.maxGS, make([]uint64, rl.cnt)
	sq.buf, sq.cnt, sq.maxPost, sq.maxGS, sq.maxInline = buf[rqBytes:sqEnd:sqEnd], sl.cnt, sl.maxPost, sl.maxGS, sl.maxInline
	sq.wrid, sq.wqeHead = make([]uint64, sl.cnt), make([]uint32, sl.cnt)
	if sigAll {
		sq.sigAll = ctrlCQUpdate
	}
	r.recvRec = word32(rec, qpRecRecv*4)
	r.sendRec = word32(rec, qpRecSend*4)
}

func (q *QP) Request() (uverbs.QPCaps, []byte, int) {
	return q.caps, abi.Bytes(&q.req), abi.SizeCreateQPResp
}

// Created learns the QPN and the bfreg the kernel assigned, and makes the
// QP findable by its user index.
func (q *QP) Created(c uverbs.QPCreated, out []byte) error {
	var resp abi.CreateQPResp
	copy(abi.Bytes(&resp), out)
	if q.uar != nil {
		q.r.db = q.uar.bfreg(q.ctx.resp.BFRegSize)
	} else {
		db, err := q.ctx.bfreg(resp.BFRegIndex)
		if err != nil {
			return err
		}
		q.r.db = db
	}
	q.r.sq.qpn = uint32(c.QPN)
	q.ctx.mu.Lock()
	q.ctx.qps.set(q.r.uidx, &q.r)
	q.ctx.mu.Unlock()
	return nil
}

// PostSend builds WQEs for wrs and rings the doorbell once. It does not
// allocate.
func (q *QP) PostSend(wrs []uverbs.SendWR) (int, error) { return q.r.postSend(wrs) }

// PostRecv fills receive WQEs and publishes them. It does not allocate.
func (q *QP) PostRecv(wrs []uverbs.RecvWR) (int, error) { return q.r.postRecv(wrs) }

// StateChanged resets the rings after a transition to RESET, as the HCA
// restarts both queues from zero.
func (q *QP) StateChanged(s uverbs.QPState) {
	if s != uverbs.QPStateReset {
		return
	}
	q.r.sq.curPost, q.r.sq.head, q.r.rq.head = 0, 0, 0
	q.r.sq.tail.Store(0)
	q.r.sq.pub.Store(0)
	q.r.rq.tail.Store(0)
	q.r.rq.pub.Store(0)
	storeRecord(q.r.sendRec, 0)
	storeRecord(q.r.recvRec, 0)
}

// Destroyed retires the user index and frees the buffers once the kernel
// destroyed the QP (or creation failed).
func (q *QP) Destroyed() error {
	if q.done {
		return nil
	}
	q.done = true
	q.ctx.mu.Lock()
	if q.ctx.qps.lookup(q.r.uidx) != nil {
		q.ctx.qps.set(q.r.uidx, retired)
	}
	q.ctx.mu.Unlock()
	q.ctx.dbs.put(q.rec)
	var err error
	if q.uar != nil {
		err = q.ctx.freeUAR(q.uar)
	}
	return errors.Join(err, q.mem.Unmap())
}
