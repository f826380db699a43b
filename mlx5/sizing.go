package mlx5

import (
	"fmt"
	"github.com/rdmago/te/uverbs"
	"math/bits"
)

// Size of the largest segment prefix an RC WQE of this provider needs:
// control + remote address + atomic segments. rdma-core reserves room for
// memory-window binds (192 bytes); this provider posts no MW/UMR WQEs, so a
// one-SGE WQE fits one WQEBB.
const rcOverhead = 16 + 16 + 16

func roundUpPow2(v uint32) uint32 {
	if v <= 1 {
		return 1
	}
	return 1 << bits.Len32(v-1)
}

// sqLayout is the send queue geometry for a QP.
type sqLayout struct {
	wqeSize   uint32 // bytes reserved per work request (multiple of 64)
	cnt       uint32 // WQEBBs (power of two): mlx5_ib_create_qp.sq_wqe_count
	maxPost   uint32 // outstanding work requests
	maxInline int
	maxGS     int
}

// sqSize computes the send queue the way rdma-core's mlx5 provider does
// (mlx5_calc_send_wqe, mlx5_calc_sq_size), with rcOverhead as overhead.
func sqSize(maxWR, maxSGE, maxInline uint32, maxDesc, maxWQEBB uint32) (sqLayout, error) {
	if maxWR == 0 {
		return sqLayout{}, fmt.Errorf("mlx5: send queue of 0 work requests: %w", uverbs.ErrInvalidWR)
	}
	if maxSGE > (maxDesc-rcOverhead)/segSize {
		return sqLayout{}, fmt.Errorf("mlx5: %d send SGEs exceed the %d-byte WQE limit: %w", maxSGE, maxDesc, uverbs.ErrInvalidWR)
	}
	size := uint32(rcOverhead) + maxSGE*segSize
	if maxInline > 0 {
		inl := rcOverhead + (4+maxInline+segSize-1)/segSize*segSize
		size = max(size, inl)
	}
	size = (size + sendWQEBB - 1) / sendWQEBB * sendWQEBB
	if size > maxDesc {
		return sqLayout{}, fmt.Errorf("mlx5: send WQE of %d bytes exceeds the device's %d: %w", size, maxDesc, uverbs.ErrInvalidWR)
	}
	if maxWR > 0x7fffffff/maxDesc {
		return sqLayout{}, fmt.Errorf("mlx5: %d send work requests: %w", maxWR, uverbs.ErrInvalidWR)
	}
	wq := roundUpPow2(maxWR * size)
	l := sqLayout{
		wqeSize:   size,
		cnt:       wq / sendWQEBB,
		maxPost:   wq / size,
		maxInline: int(size - rcOverhead - 4),
		maxGS:     int(maxSGE),
	}
	if l.cnt > maxWQEBB {
		return sqLayout{}, fmt.Errorf("mlx5: send queue of %d WQEBBs exceeds the device's %d: %w", l.cnt, maxWQEBB, uverbs.ErrInvalidWR)
	}
	return l, nil
}

// rqLayout is the receive queue geometry for a QP.
type rqLayout struct {
	cnt   uint32 // slots: mlx5_ib_create_qp.rq_wqe_count
	shift uint   // log2 slot size: rq_wqe_shift
	maxGS int
}

// rqSize computes the receive queue as rdma-core does (mlx5_calc_rcv_wqe,
// mlx5_calc_rq_size) for a QP without receive WQE signatures.
func rqSize(maxWR, maxSGE uint32, maxDesc, maxRecvWR uint32) (rqLayout, error) {
	if maxWR == 0 {
		return rqLayout{}, nil
	}
	if maxWR > maxRecvWR {
		return rqLayout{}, fmt.Errorf("mlx5: %d receive work requests exceed the device's %d: %w", maxWR, maxRecvWR, uverbs.ErrInvalidWR)
	}
	size := max(maxSGE, 1) * segSize
	if size > maxDesc {
		return rqLayout{}, fmt.Errorf("mlx5: %d receive SGEs exceed the %d-byte WQE limit: %w", maxSGE, maxDesc, uverbs.ErrInvalidWR)
	}
	size = roundUpPow2(size)
	wq := max(roundUpPow2(maxWR)*size, sendWQEBB)
	return rqLayout{
		cnt:   wq / size,
		shift: uint(bits.TrailingZeros32(size)),
		maxGS: int(size / segSize),
	}, nil
}

// cqEntries returns the number of CQE slots for a CQ that must hold want
// completions: a power of two of at least want+1. The CREATE_CQ command
// carries cqe = entries-1 (the kernel rounds cqe+1 up to a power of two).
func cqEntries(want, maxCQE uint32) (uint32, error) {
	if want == 0 || want > 1<<24-1 {
		return 0, fmt.Errorf("mlx5: CQ of %d entries: %w", want, uverbs.ErrInvalidWR)
	}
	n := roundUpPow2(want + 1)
	if maxCQE > 0 && n-1 > maxCQE {
		return 0, fmt.Errorf("mlx5: CQ of %d entries exceeds the device's %d: %w", n, maxCQE, uverbs.ErrInvalidWR)
	}
	return n, nil
}
