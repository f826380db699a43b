package rxe

import (
	"math/bits"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/uverbs"
)

// Layout constants of the WQEs (checked against the headers in internal/uapi).
const (
	sendWQEHeader = 208 // offsetof(struct rxe_send_wqe, dma.sge)
	recvWQEHeader = 40  // offsetof(struct rxe_recv_wqe, dma.sge)
	sgeSize       = 16
)

// pollRing consumes up to len(wc) CQEs: load-acquire the kernel's producer
// index, copy each entry, then store-release our consumer index so the
// kernel may reuse the slots.
func pollRing(r *ring, cons *uint32, wc []uverbs.WC) int {
	if len(wc) == 0 {
		return 0
	}
	prod := r.producer()
	c := *cons
	n := 0
	for c != prod && n < len(wc) {
		decodeWC(dma.View[uapi.WC](r.b, r.slot(c)), &wc[n])
		c = (c + 1) & r.mask
		n++
	}
	if n > 0 {
		*cons = c
		r.publishConsumer(c)
	}
	return n
}

// decodeWC maps an rxe CQE (struct ib_uverbs_wc with kernel flag bits) to
// the public WC. Unknown statuses become WCGeneralErr.
func decodeWC(k *uapi.WC, w *uverbs.WC) {
	st := k.Status
	if st > uint32(uverbs.WCGeneralErr) {
		st = uint32(uverbs.WCGeneralErr)
	}
	flags := uverbs.WCFlags(k.WCFlags & 0xf)
	imm := k.Ex
	if flags&uverbs.WCFlagWithImm != 0 {
		imm = bits.ReverseBytes32(imm) // imm_data is big-endian on the wire and in the CQE
	}
	*w = uverbs.WC{
		ID: k.WRID, Status: uverbs.WCStatus(st), Opcode: uverbs.WCOpcode(k.Opcode), Flags: flags,
		ByteLen: k.ByteLen, Imm: imm, QPN: uverbs.QPN(k.QPNum), SrcQP: uverbs.QPN(k.SrcQP),
		VendorErr: k.VendorErr, PKeyIndex: k.PKeyIndex, SLID: k.SLID, SL: k.SL,
		DLIDPathBits: k.DLIDPathBits, PortNum: k.PortNum,
	}
}

// sendQueue is the producer side of an rxe SQ.
type sendQueue struct {
	r         ring
	prod      uint32
	maxSGE    int
	maxInline int
	ud        bool // UD: SEND/SEND_WITH_IMM to wr.AH, no RDMA or atomics
}

// post writes wrs into the ring and returns how many it wrote and the
// payload bytes they send (a READ's request sends none): a measure of the
// work the kick that follows does. The producer index is published once,
// after the last WQE (a release store, so the kernel sees every WQE body
// before the index that covers it). It does not kick the kernel.
func (q *sendQueue) post(wrs []uverbs.SendWR) (n int, payload uint64, err error) {
	n = len(wrs)
	for i := range wrs {
		var b uint64
		if b, err = q.postOne(&wrs[i]); err != nil {
			n = i
			break
		}
		payload += b
	}
	if n > 0 {
		q.r.publishProducer(q.prod)
	}
	return n, payload, err
}

// postOne writes one WQE and returns the payload bytes it sends.
func (q *sendQueue) postOne(wr *uverbs.SendWR) (uint64, error) {
	if wr.Opcode > uverbs.WRAtomicFetchAndAdd {
		return 0, uverbs.ErrInvalidWR
	}
	inline := wr.Flags&uverbs.SendInline != 0
	if inline && (wr.Opcode == uverbs.WRRDMARead || wr.Opcode >= uverbs.WRAtomicCmpAndSwp) {
		return 0, uverbs.ErrInvalidWR
	}
	var total uint64
	for i := range wr.SGL {
		total += uint64(wr.SGL[i].Length)
	}
	if total > 1<<31 {
		return 0, uverbs.ErrInvalidWR // beyond any message size a device accepts
	}
	if inline {
		if total > uint64(q.maxInline) {
			return 0, uverbs.ErrInlineTooLarge
		}
	} else if len(wr.SGL) > q.maxSGE {
		return 0, uverbs.ErrTooManySGE
	}
	var ahNum uint32
	if q.ud {
		if wr.Opcode != uverbs.WRSend && wr.Opcode != uverbs.WRSendWithImm || wr.AH == nil {
			return 0, uverbs.ErrInvalidWR
		}
		a, ok := wr.AH.Driver().(*ah)
		if !ok {
			return 0, uverbs.ErrInvalidWR
		}
		ahNum = a.num
	}
	atomic := wr.Opcode == uverbs.WRAtomicCmpAndSwp || wr.Opcode == uverbs.WRAtomicFetchAndAdd
	if atomic && (len(wr.SGL) != 1 || wr.SGL[0].Length < 8 || wr.RemoteAddr&7 != 0) {
		return 0, uverbs.ErrInvalidWR
	}
	next := (q.prod + 1) & q.r.mask
	if next == q.r.consumer() {
		return 0, uverbs.ErrQueueFull
	}
	off := q.r.slot(q.prod)
	w := dma.View[uapi.RxeSendWQE](q.r.b, off)
	*w = uapi.RxeSendWQE{} // also clears the union and kernel-owned fields
	w.WR.WRID = wr.ID
	w.WR.Opcode = uint32(wr.Opcode)
	w.WR.SendFlags = uint32(wr.Flags)
	switch wr.Opcode {
	case uverbs.WRSendWithImm, uverbs.WRRDMAWriteWithImm:
		w.WR.Ex = bits.ReverseBytes32(wr.Imm) // __be32 imm_data
	}
	if q.ud {
		// wr.ud: remote_qpn@24, remote_qkey@28, pkey_index@32 (0), ah_num@36.
		w.WR.RemoteAddr = uint64(wr.RemoteQKey)<<32 | uint64(wr.RemoteQPN&0xffffff)
		w.WR.CompareAdd = uint64(ahNum) << 32
	}
	switch wr.Opcode {
	case uverbs.WRRDMAWrite, uverbs.WRRDMAWriteWithImm, uverbs.WRRDMARead:
		w.WR.RemoteAddr = wr.RemoteAddr
		w.WR.CompareAdd = uint64(wr.RKey) // wr.rdma.rkey shares offset 32 (rdma.reserved stays 0)
		w.IOVA = wr.RemoteAddr
	case uverbs.WRAtomicCmpAndSwp, uverbs.WRAtomicFetchAndAdd:
		w.WR.RemoteAddr = wr.RemoteAddr
		w.WR.CompareAdd = wr.CompareAdd
		w.WR.Swap = wr.Swap
		w.WR.AtomicRKey = uint32(wr.RKey)
		w.IOVA = wr.RemoteAddr
	}
	payload := q.r.b[off+sendWQEHeader : off+q.r.elem]
	if inline {
		p := 0
		for i := range wr.SGL {
			p += copy(payload[p:], dma.At(wr.SGL[i].Addr, int(wr.SGL[i].Length)))
		}
		w.DMA.NumSGE = 0
	} else {
		for i := range wr.SGL {
			s := dma.View[uapi.RxeSGE](payload, i*sgeSize)
			s.Addr, s.Length, s.LKey = wr.SGL[i].Addr, wr.SGL[i].Length, uint32(wr.SGL[i].LKey)
		}
		w.DMA.NumSGE = uint32(len(wr.SGL))
	}
	w.DMA.Length = uint32(total)
	w.DMA.Resid = uint32(total)
	w.State = uapi.RxeWQEStatePosted
	q.prod = next // published by post
	if wr.Opcode == uverbs.WRRDMARead {
		return 0, nil // the bytes come back from the peer
	}
	return total, nil
}

// recvQueue is the producer side of an rxe RQ.
type recvQueue struct {
	r      ring
	prod   uint32
	maxSGE int
}

func (q *recvQueue) post(wrs []uverbs.RecvWR) (n int, err error) {
	defer func() {
		if n > 0 {
			q.r.publishProducer(q.prod) // once per batch, after every WQE body
		}
	}()
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > q.maxSGE {
			return i, uverbs.ErrTooManySGE
		}
		next := (q.prod + 1) & q.r.mask
		if next == q.r.consumer() {
			return i, uverbs.ErrQueueFull
		}
		off := q.r.slot(q.prod)
		w := dma.View[uapi.RxeRecvWQE](q.r.b, off)
		*w = uapi.RxeRecvWQE{}
		w.WRID = wr.ID
		var total uint64
		payload := q.r.b[off+recvWQEHeader : off+q.r.elem]
		for j := range wr.SGL {
			s := dma.View[uapi.RxeSGE](payload, j*sgeSize)
			s.Addr, s.Length, s.LKey = wr.SGL[j].Addr, wr.SGL[j].Length, uint32(wr.SGL[j].LKey)
			total += uint64(wr.SGL[j].Length)
		}
		if total > 1<<31 {
			return i, uverbs.ErrInvalidWR
		}
		w.DMA.Length = uint32(total)
		w.DMA.Resid = uint32(total)
		w.DMA.NumSGE = uint32(len(wr.SGL))
		q.prod = next
	}
	return len(wrs), nil
}
