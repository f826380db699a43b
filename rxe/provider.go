package rxe

import (
	"fmt"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/uverbs"
)

type provider struct{}

// Provider returns the rxe provider.
func Provider() uverbs.Provider { return provider{} }

func (provider) Name() string                       { return "rxe" }
func (provider) DriverID() uverbs.DriverID          { return uverbs.DriverRXE }
func (provider) ContextRequest() (in []byte, n int) { return nil, 0 }
func (provider) NewContext(k uverbs.Kernel, _ []byte) (uverbs.DriverContext, error) {
	return &rxeContext{k: k}, nil
}

type rxeContext struct {
	k uverbs.Kernel
}

func (c *rxeContext) Close() error { return nil }

func (c *rxeContext) NewCQ(cfg uverbs.DriverCQConfig) (uverbs.DriverCQ, error) {
	return &cq{k: c.k, want: cfg.Entries}, nil
}

func (c *rxeContext) NewQP(cfg uverbs.DriverQPConfig) (uverbs.DriverQP, error) {
	switch cfg.Type {
	case uverbs.QPTypeRC, uverbs.QPTypeUC, uverbs.QPTypeUD:
	default:
		return nil, fmt.Errorf("rxe: QP type %d: %w", cfg.Type, uverbs.ErrNotSupported)
	}
	return &qp{k: c.k, req: cfg.Caps, typ: cfg.Type}, nil
}

func mapQueue(k uverbs.Kernel, mi *uapi.RxeMmapInfo) (*dma.Region, ring, error) {
	if mi.Size == 0 {
		return nil, ring{}, fmt.Errorf("rxe: kernel returned an empty queue mapping")
	}
	reg, err := dma.MapShared(k.FD(), int64(mi.Offset), int(mi.Size))
	if err != nil {
		return nil, ring{}, fmt.Errorf("rxe: map queue: %w", err)
	}
	r, err := newRing(reg.Bytes())
	if err != nil {
		reg.Unmap()
		return nil, ring{}, err
	}
	return reg, r, nil
}

// ---- CQ ---------------------------------------------------------------------

type cq struct {
	k      uverbs.Kernel
	want   int
	handle uverbs.Handle
	reg    *dma.Region
	r      ring
	cons   uint32 // our consumer index (we own it)
	// arm is Arm's request, kept here because a local would escape
	// through the Kernel interface: arming is on the completion path.
	arm uapi.ReqNotifyCQ
}

func (q *cq) Request() (uint32, []byte, int) {
	return uint32(q.want), nil, len(ucmd.Bytes(&uapi.RxeCreateCQResp{}))
}

func (q *cq) Created(h uverbs.Handle, _ uint32, out []byte) error {
	var resp uapi.RxeCreateCQResp
	copy(ucmd.Bytes(&resp), out)
	reg, r, err := mapQueue(q.k, &resp.MI)
	if err != nil {
		return err
	}
	q.handle, q.reg, q.r = h, reg, r
	q.cons = r.consumer()
	return nil
}

func (q *cq) Poll(wc []uverbs.WC) (int, error) { return pollRing(&q.r, &q.cons, wc), nil }

func (q *cq) Arm(solicitedOnly bool) error {
	q.arm = uapi.ReqNotifyCQ{CQHandle: uint32(q.handle)}
	if solicitedOnly {
		q.arm.SolicitedOnly = 1
	}
	return q.k.Write(uapi.CmdReqNotifyCQ, ucmd.Bytes(&q.arm), nil, nil, nil)
}

func (q *cq) EventConsumed() {}

func (q *cq) Destroyed() error { return q.reg.Unmap() }

// RCDefaults: Soft-RoCE's ACK timeout is 2^18 * 4.096 µs (~1.07 s), not
// hardware's ~67 ms. A timeout that fires while ACKs are only late (a guest
// stalled for more than 67 ms: qemu without KVM, a busy host, the first run
// after boot) starts a retransmission while the completer is still taking
// those ACKs, and Linux 6.1's rxe races there: req_retry reads the
// completer's PSN and send-queue head while they move, replays the wrong
// WQE and sends a packet out of opcode sequence, which the responder NAKs
// as an invalid request. Lost packets are still recovered at once through
// the responder's PSN-sequence NAK; only a lost tail waits for the timeout.
// With 6 retries a peer that stopped answering is given up after ~7.5 s.
func (provider) RCDefaults() uverbs.RCDefaults {
	return uverbs.RCDefaults{Timeout: 18, RetryCnt: 6,
		Why: "rxe: a late-ACK retransmission races the completer (6.1), so the ACK timeout is ~1.07 s"}
}
