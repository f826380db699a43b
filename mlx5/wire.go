package mlx5

// Hardware constants of the mlx5 work-queue and completion formats
// (ConnectX PRM; the names mirror rdma-core's mlx5dv.h). All multi-byte
// fields of WQEs and CQEs are big-endian.

// Send WQE opcodes (MLX5_OPCODE_*).
const (
	opcodeNop          = 0x00
	opcodeRDMAWrite    = 0x08
	opcodeRDMAWriteImm = 0x09
	opcodeSend         = 0x0a
	opcodeSendImm      = 0x0b
	opcodeRDMARead     = 0x10
	opcodeAtomicCS     = 0x11
	opcodeAtomicFA     = 0x12
)

// Control segment fm_ce_se bits (MLX5_WQE_CTRL_*).
const (
	ctrlCQUpdate  = 2 << 2 // generate a CQE for this WQE
	ctrlSolicited = 1 << 1
	ctrlFence     = 4 << 5
)

// Layout of the send queue.
const (
	sendWQEBB    = 64 // MLX5_SEND_WQE_BB: basic block of a send WQE
	sendWQEShift = 6
	segSize      = 16 // every segment is a multiple of 16 bytes (one "ds")
	inlineSeg    = 0x80000000
	invalidLKey  = 0x100 // MLX5_INVALID_LKEY: receive scatter list terminator
	atomicSize   = 8
)

// Offsets inside the 16-byte segments.
const (
	ctrlOpmodIdxOpcode = 0
	ctrlQPNDS          = 4
	ctrlSignature      = 8
	ctrlFmCeSe         = 11
	ctrlImm            = 12
)

// Completion queue entry (struct mlx5_cqe64) field offsets.
const (
	cqeSize         = 64
	cqeMLPath       = 17
	cqeSLID         = 22
	cqeFlagsRQPN    = 24
	cqeSRQNUIdx     = 32
	cqeImmInvalPKey = 36
	cqeByteCnt      = 44
	cqeTimestamp    = 48
	cqeSopDropQPN   = 56
	cqeWQECounter   = 60
	cqeSignature    = 62
	cqeOpOwn        = 63
	// struct mlx5_err_cqe overlays these on the same 64 bytes.
	cqeVendorErrSynd = 54
	cqeSyndrome      = 55
)

// CQE opcodes (op_own >> 4, MLX5_CQE_*).
const (
	cqeReq         = 0
	cqeRespWrImm   = 1
	cqeRespSend    = 2
	cqeRespSendImm = 3
	cqeRespSendInv = 4
	cqeResizeCQ    = 5
	cqeReqErr      = 13
	cqeRespErr     = 14
	cqeInvalid     = 15
)

// cqeInvalidOpOwn is the op_own byte a fresh CQ buffer is filled with:
// opcode INVALID in the high nibble, owner bit 0.
const cqeInvalidOpOwn = cqeInvalid << 4

// CQ doorbell (arm) register offset in the UAR page and arm commands.
const (
	cqDoorbellOffset = 0x20 // MLX5_CQ_DOORBELL
	cqDBReqNotSol    = 1 << 24
	cqDBReqNot       = 0 << 24
)

// BlueFlame registers start at this offset in a UAR page.
const bfOffset = 0x800

// Doorbell record slots (32-bit big-endian words).
const (
	qpRecRecv  = 0 // MLX5_RCV_DBR: receive producer counter
	qpRecSend  = 1 // MLX5_SND_DBR: send producer counter (WQEBBs)
	cqRecSetCI = 0 // MLX5_CQ_SET_CI: consumer index
	cqRecArm   = 1 // MLX5_CQ_ARM_DB: arm value
)

// CQE error syndromes (MLX5_CQE_SYNDROME_*).
const (
	syndLocalLengthErr    = 0x01
	syndLocalQPOpErr      = 0x02
	syndLocalProtErr      = 0x04
	syndWRFlushErr        = 0x05
	syndMWBindErr         = 0x06
	syndBadRespErr        = 0x10
	syndLocalAccessErr    = 0x11
	syndRemoteInvalReqErr = 0x12
	syndRemoteAccessErr   = 0x13
	syndRemoteOpErr       = 0x14
	syndTransportRetryExc = 0x15
	syndRNRRetryExc       = 0x16
	syndRemoteAbortedErr  = 0x22
)
