package uverbs

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// QPConfig describes a queue pair.
type QPConfig struct {
	Type      QPType // default RC
	SendCQ    *CQ    // required
	RecvCQ    *CQ    // required (may equal SendCQ)
	Caps      QPCaps // requested sizes; the kernel may grant more (see QP.Caps)
	SignalAll bool   // every send completes with a CQE, regardless of SendSignaled
}

// QP is a queue pair. PostSend and PostRecv each belong to one owner
// goroutine at a time (concurrent use returns ErrConcurrent); control
// methods (Modify, Query, Close) are safe for concurrent use.
type QP struct {
	pd     *PD
	drv    DriverQP
	handle Handle
	qpn    QPN
	uh     uint64
	typ    QPType
	caps   QPCaps
	sendCQ *CQ
	recvCQ *CQ

	state    atomic.Uint32 // QPState, as last set by Modify (or ERR after a fatal event)
	sendBusy atomic.Bool
	recvBusy atomic.Bool
	dead     atomic.Bool

	mu     sync.Mutex // serializes Modify and Close
	closed bool
}

// CreateQP creates a queue pair in the RESET state.
func (pd *PD) CreateQP(cfg QPConfig) (_ *QP, err error) {
	if cfg.Type == 0 {
		cfg.Type = QPTypeRC
	}
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, fmt.Errorf("uverbs: create_qp: send and receive CQs are required: %w", ucmd.EINVAL)
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, ErrClosed
	}
	c := pd.ctx
	for _, cq := range []*CQ{cfg.SendCQ, cfg.RecvCQ} {
		if cq.ctx != c {
			return nil, fmt.Errorf("uverbs: create_qp: CQ of another context: %w", ucmd.EINVAL)
		}
	}
	cfg.SendCQ.mu.Lock()
	scqClosed := cfg.SendCQ.closed
	cfg.SendCQ.mu.Unlock()
	cfg.RecvCQ.mu.Lock()
	rcqClosed := cfg.RecvCQ.closed
	cfg.RecvCQ.mu.Unlock()
	if scqClosed || rcqClosed {
		return nil, fmt.Errorf("uverbs: create_qp: CQ: %w", ErrClosed)
	}
	c.mu.Lock()
	if err := c.checkOpen(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	uh := c.userHandle()
	c.mu.Unlock()

	drv, err := c.drv.NewQP(DriverQPConfig{Type: cfg.Type, Caps: cfg.Caps, SendCQ: cfg.SendCQ.drv, RecvCQ: cfg.RecvCQ.drv, SignalAll: cfg.SignalAll})
	if err != nil {
		return nil, fmt.Errorf("uverbs: create_qp on %s: %w", c.dev.Name, err)
	}
	defer func() {
		if err != nil {
			drv.Destroyed()
		}
	}()
	caps, in, outLen := drv.Request()
	req := uapi.CreateQP{
		UserHandle: uh, PDHandle: uint32(pd.handle),
		SendCQHandle: uint32(cfg.SendCQ.handle), RecvCQHandle: uint32(cfg.RecvCQ.handle),
		MaxSendWR: caps.MaxSendWR, MaxRecvWR: caps.MaxRecvWR, MaxSendSGE: caps.MaxSendSGE,
		MaxRecvSGE: caps.MaxRecvSGE, MaxInlineData: caps.MaxInlineData, QPType: uint8(cfg.Type),
	}
	if cfg.SignalAll {
		req.SQSigAll = 1
	}
	var r uapi.CreateQPResp
	out := make([]byte, outLen)
	if err := c.file.Write(uapi.CmdCreateQP, ucmd.Bytes(&req), in, ucmd.Bytes(&r), out); err != nil {
		return nil, opErr(fmt.Sprintf("create_qp(%+v)", caps), c.dev.Name, err)
	}
	qp := &QP{
		pd: pd, drv: drv, handle: Handle(r.QPHandle), qpn: QPN(r.QPN), uh: uh, typ: cfg.Type,
		caps: QPCaps{MaxSendWR: r.MaxSendWR, MaxRecvWR: r.MaxRecvWR, MaxSendSGE: r.MaxSendSGE,
			MaxRecvSGE: r.MaxRecvSGE, MaxInlineData: r.MaxInlineData},
		sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ,
	}
	if err = drv.Created(QPCreated{Handle: qp.handle, QPN: qp.qpn, Caps: qp.caps}, out); err != nil {
		c.destroyQP(qp.handle)
		return nil, fmt.Errorf("uverbs: create_qp on %s: %w", c.dev.Name, err)
	}
	pd.nqps++
	for _, cq := range []*CQ{cfg.SendCQ, cfg.RecvCQ} {
		cq.mu.Lock()
		cq.nqps++
		cq.mu.Unlock()
	}
	c.mu.Lock()
	c.qps[uh] = qp
	c.mu.Unlock()
	track(qp, fmt.Sprintf("QP %#x on %s", uint32(qp.qpn), c.dev.Name))
	return qp, nil
}

func (c *Context) destroyQP(h Handle) error {
	req := uapi.DestroyQP{QPHandle: uint32(h)}
	var r uapi.DestroyQPResp
	return c.destroyObject(uapi.ObjectQP, uapi.MethodQPDestroy, uapi.AttrDestroyQPHandle, uapi.AttrDestroyQPResp, h,
		uapi.CmdDestroyQP, ucmd.Bytes(&req), ucmd.Bytes(&r))
}

// QPN is the queue pair number.
func (qp *QP) QPN() QPN { return qp.qpn }

// Handle returns the kernel handle.
func (qp *QP) Handle() Handle { return qp.handle }

// Caps are the sizes granted by the kernel.
func (qp *QP) Caps() QPCaps { return qp.caps }

// State is the state last set through Modify (ERR after a fatal async event).
// Query asks the kernel.
func (qp *QP) State() QPState { return QPState(qp.state.Load()) }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// Close destroys the QP. Work requests still queued produce no completions.
// Idempotent.
func (qp *QP) Close() error {
	if qp == nil {
		return nil
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return nil
	}
	qp.dead.Store(true)
	for !qp.sendBusy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	for !qp.recvBusy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	c := qp.pd.ctx
	if err := c.destroyQP(qp.handle); err != nil && !errors.Is(err, ErrClosed) {
		qp.dead.Store(false)
		qp.sendBusy.Store(false)
		qp.recvBusy.Store(false)
		return opErr("destroy_qp", c.dev.Name, err)
	}
	qp.closed = true
	qp.cleanCQs()
	derr := qp.drv.Destroyed()
	c.mu.Lock()
	delete(c.qps, qp.uh)
	c.mu.Unlock()
	for _, cq := range []*CQ{qp.sendCQ, qp.recvCQ} {
		cq.mu.Lock()
		cq.nqps--
		cq.mu.Unlock()
	}
	qp.pd.mu.Lock()
	qp.pd.nqps--
	qp.pd.mu.Unlock()
	untrack(qp)
	return derr
}

// cleanCQs lets a provider that implements CQCleaner drop the QP's
// unpolled completions from each of its CQs (once when both are the same),
// under that CQ's owner guard: it waits out a Poll in progress on the
// owner goroutine, which then sees the cleaned ring.
func (qp *QP) cleanCQs() {
	cqs := [2]*CQ{qp.sendCQ, qp.recvCQ}
	for i, cq := range cqs {
		if cq == nil || (i == 1 && cq == cqs[0]) {
			continue
		}
		cl, ok := cq.drv.(CQCleaner)
		if !ok {
			continue
		}
		for !cq.busy.CompareAndSwap(false, true) {
			runtime.Gosched()
		}
		cl.Clean(qp.drv)
		cq.busy.Store(false)
	}
}

// PostSend posts send work requests in order. It returns how many were
// posted; on error wrs[n] is the first one not posted. It fails with
// ErrQPState unless the QP is in RTS (or SQD/SQE/ERR, where posted requests
// complete with WCWRFlushErr). It does not allocate. When the provider
// must tell the kernel (the rxe doorbell) and that fails, the WRs stay
// posted, n counts them, and err is the kernel's syscall.Errno, unwrapped.
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	if !qp.sendBusy.CompareAndSwap(false, true) {
		if qp.dead.Load() {
			return 0, ErrClosed
		}
		return 0, ErrConcurrent
	}
	defer qp.sendBusy.Store(false)
	if qp.dead.Load() {
		return 0, ErrClosed
	}
	switch QPState(qp.state.Load()) {
	case QPStateRTS, QPStateSQD, QPStateSQE, QPStateErr:
	default:
		return 0, ErrQPState
	}
	return qp.drv.PostSend(wrs)
}

// PostRecv posts receive work requests (any state but RESET). Same contract
// as PostSend.
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	if !qp.recvBusy.CompareAndSwap(false, true) {
		if qp.dead.Load() {
			return 0, ErrClosed
		}
		return 0, ErrConcurrent
	}
	defer qp.recvBusy.Store(false)
	if qp.dead.Load() {
		return 0, ErrClosed
	}
	if QPState(qp.state.Load()) == QPStateReset {
		return 0, ErrQPState
	}
	return qp.drv.PostRecv(wrs)
}
