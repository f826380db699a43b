//go:build amd64 || arm64

package mlx5

import (
	"errors"
	"testing"

	"github.com/rdmago/te/uverbs"
)

// FuzzPollCQE feeds arbitrary CQE bytes (written by a device we do not
// control) through the poller: it must never panic, must consume exactly
// the entries whose owner bit and opcode make them valid, and must report unknown QPs as errors
// (ErrStrayCompletion, never a completion).
func FuzzPollCQE(f *testing.F) {
	for _, c := range cqeCases() {
		var b [cqeSize]byte
		c.put(b[:])
		f.Add(b[:])
	}
	f.Add(make([]byte, cqeSize))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < cqeSize {
			return
		}
		buf := mapped(t, 4*cqeSize)
		initInvalid(buf)
		copy(buf, data[:cqeSize])
		qp := &qpRings{uidx: 1}
		qp.sq = sendQueue{cnt: 8, maxPost: 8, wrid: make([]uint64, 8), wqeHead: make([]uint32, 8)}
		qp.sq.head = 3 // three WQEs and two receives outstanding
		qp.sq.pub.Store(3)
		qp.rq = recvQueue{cnt: 4, wrid: make([]uint64, 4), head: 2}
		qp.rq.pub.Store(2)
		cq := &cqRing{buf: buf, cnt: 4, setCI: word32(mapped(t, 64), 0)}
		var wc [4]uverbs.WC
		n, err := cq.poll(wc[:], singleQP{qp})
		op := data[cqeOpOwn]
		valid := op>>4 != cqeInvalid && op&1 == 0
		if !valid && (n != 0 || cq.ci != 0) {
			t.Fatalf("consumed an invalid entry (op_own %#x): n %d ci %d", op, n, cq.ci)
		}
		if valid && cq.ci != 1 {
			t.Fatalf("valid entry (op_own %#x) not consumed: ci %d", op, cq.ci)
		}
		if n > 1 {
			t.Fatalf("%d completions from one entry", n)
		}
		unknown := be.Uint32(data[cqeSRQNUIdx:])&0xffffff != 1
		if n == 1 && unknown {
			t.Fatalf("completion for an unknown user index: %+v", wc[0])
		}
		stray := valid && op>>4 != cqeResizeCQ && unknown
		if stray != (err != nil) || (err != nil && !errors.Is(err, uverbs.ErrStrayCompletion)) {
			t.Fatalf("op_own %#x user index %#x: error %v", op, be.Uint32(data[cqeSRQNUIdx:])&0xffffff, err)
		}
	})
}
