package mlx5sim

import "encoding/binary"

// The mlx5 hardware formats the simulated HCA reads and writes, stated
// here independently of package mlx5 (from the ConnectX PRM), so that a
// mistake in the provider's constants is not mirrored by its simulator.
// Multi-byte WQE and CQE fields are big-endian.

var be = binary.BigEndian

// Send WQE opcodes.
const (
	opRDMAWrite    = 0x08
	opRDMAWriteImm = 0x09
	opSend         = 0x0a
	opSendImm      = 0x0b
	opRDMARead     = 0x10
	opAtomicCS     = 0x11
	opAtomicFA     = 0x12
)

const (
	wqebb       = 64         // send WQE basic block
	dsSize      = 16         // a WQE is counted in 16-byte units
	inlineBit   = 0x80000000 // data segment byte_count: inline data follows
	invalidLKey = 0x100      // receive scatter list terminator
	fmCQUpdate  = 0x08       // ctrl fm_ce_se: generate a CQE
	fmSolicited = 0x02       // ctrl fm_ce_se: solicited event
)

// CQE64 field offsets.
const (
	cqeSize       = 64
	cqeFlagsRQPN  = 24
	cqeUIdx       = 32
	cqeImm        = 36
	cqeByteCnt    = 44
	cqeSyndrome   = 55
	cqeSopDropQPN = 56
	cqeWQECounter = 60
	cqeOpOwn      = 63
)

// CQE opcodes.
const (
	cqeReq         = 0
	cqeRespWrImm   = 1
	cqeRespSend    = 2
	cqeRespSendImm = 3
	cqeReqErr      = 13
	cqeRespErr     = 14
)

// Error syndromes.
const (
	syndLocalLength      = 0x01
	syndLocalProt        = 0x04
	syndFlush            = 0x05
	syndRemoteInvalReq   = 0x12
	syndRemoteAccess     = 0x13
	syndRetryExceeded    = 0x15
	syndRNRRetryExceeded = 0x16
)

// Doorbell records (big-endian words) and the UAR.
const (
	qpRecRecv      = 0 // receive producer counter
	qpRecSend      = 4 // send producer counter, in WQEBBs
	cqRecSetCI     = 0 // consumer index
	cqRecArm       = 4 // arm word: sn<<28 | cmd<<24 | ci
	uarCQDoorbell  = 0x20
	armSolicited   = 1 << 24
	bfregIndex     = 1 // the library bfreg every QP rings: UAR page 0, shared
	uarPages       = 4
	bfRegSize      = 512
	totalBFRegs    = 16
	pageSizeStatic = 4096
)

// IB access flags of an MR.
const (
	accessLocalWrite   = 1
	accessRemoteWrite  = 2
	accessRemoteRead   = 4
	accessRemoteAtomic = 8
)

// QP states (enum ib_qp_state).
const (
	stateReset = 0
	stateInit  = 1
	stateRTR   = 2
	stateRTS   = 3
	stateErr   = 6
)
