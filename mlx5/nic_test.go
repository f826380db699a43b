//go:build amd64 || arm64

package mlx5

import (
	"math/bits"
	"testing"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/mlx5sim"
)

// The simulated HCA of the ring tests is internal/mlx5sim's Loopback; fakeCQE
// describes completions tests place on a CQ themselves.

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

// simHCA is internal/mlx5sim's loopback HCA on a rig's rings (one RC QP
// connected to itself and its CQ: it follows the doorbell records, parses
// the WQEs the way the HCA does, delivers SENDs into the QP's own receive
// queue, and writes CQEs with the owner bit of its pass over the CQ; it
// only touches the mmap'd rings and records, never the Go-side queue
// state), reporting what a device would refuse as test errors.
type simHCA struct {
	t testing.TB
	*mlx5sim.Loopback
}

func newSimHCA(t testing.TB, q *qpRings, qpRec []byte, cq *cqRing, cqRec []byte, uidx uint32) *simHCA {
	return &simHCA{t: t, Loopback: mlx5sim.NewLoopback(mlx5sim.LoopbackConfig{
		SQ: q.sq.buf, RQ: q.rq.buf, RQShift: uint32(q.rq.shift), QPRecord: qpRec,
		CQ: cq.buf, CQRecord: cqRec, QPN: q.sq.qpn, UIdx: uidx})}
}

// record reads a big-endian doorbell-record word.
func record(b []byte, off int) uint32 { return bits.ReverseBytes32(dma.LoadAcquire32(b, off)) }

// step processes every WQE the doorbell record announces; it returns false
// if it could not finish because the CQ is full.
func (h *simHCA) step() bool {
	ok, err := h.Step()
	if err != nil {
		h.t.Errorf("HCA: %v", err)
	}
	return ok
}

// emit writes c at the producer index with this pass's owner bit.
func (h *simHCA) emit(c *fakeCQE) {
	var b [cqeSize]byte
	c.put(b[:])
	if err := h.Emit(&b); err != nil {
		h.t.Errorf("HCA: %v", err)
	}
}
