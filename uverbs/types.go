package uverbs

// The names of the enumerations below are their constants' line comments.
//go:generate go tool stringer -linecomment -output enums_string.go -type DriverID,QPState,WROpcode,WCStatus,WCOpcode,GIDType,PortState,AsyncEventType

import (
	"fmt"
	"net/netip"
)

// Typed identifiers. Swapping an LKey for an RKey does not compile.
type (
	// QPN is a 24-bit queue pair number.
	QPN uint32
	// PSN is a 24-bit packet sequence number.
	PSN uint32
	// LKey is the local key of a memory region (used in SGEs).
	LKey uint32
	// RKey is the remote key of a memory region (used by the peer).
	RKey uint32
	// DriverID identifies the kernel driver behind a device (enum rdma_driver_id).
	DriverID uint32
	// Handle is a kernel object handle, scoped to one Context.
	Handle uint32
)

// Driver IDs of the providers this module knows.
const (
	DriverUnknown DriverID = 0  // unknown
	DriverMLX5    DriverID = 1  // mlx5
	DriverRXE     DriverID = 14 // rxe
)

// GID is a 16-byte global identifier (an IPv6 address; RoCE v2 uses the
// IPv4-mapped form ::ffff:a.b.c.d for IPv4).
type GID [16]byte

// Addr returns the GID as an IP address (IPv4-mapped addresses unmapped).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// GIDFromAddr returns the GID of an IP address (IPv4 becomes ::ffff:a.b.c.d).
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// MTU is an IB path MTU enum value (1 = 256 ... 5 = 4096).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 if invalid).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string { return fmt.Sprintf("%d", m.Bytes()) }

// Access flags of memory regions and QPs (IB_ACCESS_*).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
	AccessRelaxedOrder Access = 1 << 20
)

// QPType is the transport type of a queue pair.
type QPType uint8

// QP types.
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// QPState is a queue pair state.
type QPState uint8

// QP states.
const (
	QPStateReset QPState = 0 // RESET
	QPStateInit  QPState = 1 // INIT
	QPStateRTR   QPState = 2 // RTR
	QPStateRTS   QPState = 3 // RTS
	QPStateSQD   QPState = 4 // SQD
	QPStateSQE   QPState = 5 // SQE
	QPStateErr   QPState = 6 // ERR
)

// QPCaps are the queue sizes of a QP.
type QPCaps struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// SGE is a scatter/gather element: a range of a registered memory region.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   LKey
}

// WROpcode is a send work request opcode (values of IB_UVERBS_WR_*).
type WROpcode uint8

// Send opcodes.
const (
	WRRDMAWrite         WROpcode = 0 // RDMA_WRITE
	WRRDMAWriteWithImm  WROpcode = 1 // RDMA_WRITE_WITH_IMM
	WRSend              WROpcode = 2 // SEND
	WRSendWithImm       WROpcode = 3 // SEND_WITH_IMM
	WRRDMARead          WROpcode = 4 // RDMA_READ
	WRAtomicCmpAndSwp   WROpcode = 5 // ATOMIC_CMP_AND_SWP
	WRAtomicFetchAndAdd WROpcode = 6 // ATOMIC_FETCH_AND_ADD
)

// SendFlags modify a send work request (values of IB_UVERBS_SEND_*).
type SendFlags uint8

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// SendWR is a send work request. It is plain data; posting copies it into the
// send queue, so the caller may reuse it (and its SGL) right after PostSend.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	// SGL lists the local buffers. With SendInline their bytes are copied
	// into the WQE at post time and the LKeys are not used.
	SGL []SGE
	// Imm is the immediate value of *_WITH_IMM opcodes, in host order; the
	// receiver's WC.Imm has the same value.
	Imm uint32
	// RemoteAddr and RKey address the peer's memory for RDMA and atomics.
	RemoteAddr uint64
	RKey       RKey
	// CompareAdd is the compare value of CMP_AND_SWP or the addend of FETCH_AND_ADD.
	CompareAdd uint64
	// Swap is the swap value of CMP_AND_SWP.
	Swap uint64
	// UD sends: the destination's address handle, QPN and QKey.
	AH         *AH
	RemoteQPN  QPN
	RemoteQKey uint32
}

// GRHSize is the size of the Global Route Header that precedes every UD
// receive's payload in the receive buffer.
const GRHSize = 40

// RecvWR is a receive work request. On a UD QP the first GRHSize bytes of
// the buffer receive the GRH.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WCStatus is a work completion status (IB_WC_*).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess        WCStatus = 0  // success
	WCLocLenErr      WCStatus = 1  // local length error
	WCLocQPOpErr     WCStatus = 2  // local QP operation error
	WCLocEECOpErr    WCStatus = 3  // local EE context operation error
	WCLocProtErr     WCStatus = 4  // local protection error
	WCWRFlushErr     WCStatus = 5  // WR flushed
	WCMWBindErr      WCStatus = 6  // memory window bind error
	WCBadRespErr     WCStatus = 7  // bad response error
	WCLocAccessErr   WCStatus = 8  // local access error
	WCRemInvReqErr   WCStatus = 9  // remote invalid request error
	WCRemAccessErr   WCStatus = 10 // remote access error
	WCRemOpErr       WCStatus = 11 // remote operation error
	WCRetryExcErr    WCStatus = 12 // transport retry counter exceeded
	WCRNRRetryExcErr WCStatus = 13 // RNR retry counter exceeded
	WCLocRDDViolErr  WCStatus = 14 // local RDD violation error
	WCRemInvRDReqErr WCStatus = 15 // remote invalid RD request
	WCRemAbortErr    WCStatus = 16 // remote aborted error
	WCInvEECNErr     WCStatus = 17 // invalid EE context number
	WCInvEECStateErr WCStatus = 18 // invalid EE context state
	WCFatalErr       WCStatus = 19 // fatal error
	WCRespTimeoutErr WCStatus = 20 // response timeout error
	WCGeneralErr     WCStatus = 21 // general error
)

// WCOpcode says what completed (IB_WC_* opcodes).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend            WCOpcode = 0   // SEND
	WCRDMAWrite       WCOpcode = 1   // RDMA_WRITE
	WCRDMARead        WCOpcode = 2   // RDMA_READ
	WCCompSwap        WCOpcode = 3   // COMP_SWAP
	WCFetchAdd        WCOpcode = 4   // FETCH_ADD
	WCBindMW          WCOpcode = 5   // BIND_MW
	WCLocalInv        WCOpcode = 6   // LOCAL_INV
	WCRecv            WCOpcode = 128 // RECV
	WCRecvRDMAWithImm WCOpcode = 129 // RECV_RDMA_WITH_IMM
)

// WCFlags qualify a completion. The values are the kernel's (ib_wc_flags).
type WCFlags uint8

// Completion flags.
const (
	WCFlagGRH            WCFlags = 1
	WCFlagWithImm        WCFlags = 2
	WCFlagWithInvalidate WCFlags = 4
	WCFlagIPCSumOK       WCFlags = 8
)

// WC is a work completion. For error statuses only ID, Status, QPN and
// VendorErr are meaningful (rxe leaves Opcode 0 on errors).
type WC struct {
	ID      uint64
	Status  WCStatus
	Opcode  WCOpcode
	Flags   WCFlags
	ByteLen uint32
	// Imm is the immediate value (host order) when Flags has WCFlagWithImm,
	// or the invalidated rkey when Flags has WCFlagWithInvalidate.
	Imm          uint32
	QPN          QPN
	SrcQP        QPN
	VendorErr    uint32
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
	PortNum      uint8
}

// Transient reports whether a failed completion with this status may
// succeed when retried on a fresh QP: retry-exceeded, RNR-retry-exceeded
// and flush (the class of ErrCompletionTransient).
func (s WCStatus) Transient() bool {
	return s == WCRetryExcErr || s == WCRNRRetryExcErr || s == WCWRFlushErr
}

// AccessDenied reports whether the status is a memory-protection refusal:
// remote access, remote invalid request, local protection or local access
// (the class of ErrCompletionAccess). Retrying cannot help.
func (s WCStatus) AccessDenied() bool {
	return s == WCRemAccessErr || s == WCRemInvReqErr || s == WCLocProtErr || s == WCLocAccessErr
}

// Err returns nil for a successful completion, or a *WCError.
// It allocates only for failed completions.
func (wc *WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, VendorErr: wc.VendorErr, QPN: wc.QPN, ID: wc.ID}
}

// ErrRemote is Err for a completion of an RDMA READ, WRITE or atomic whose
// remote side the caller knows: a failure's message names the rkey and the
// range [addr, addr+length) the request addressed, so that an access error
// says which key and bytes the peer refused. It allocates only for failed
// completions.
func (wc *WC) ErrRemote(rkey RKey, addr, length uint64) error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, VendorErr: wc.VendorErr, QPN: wc.QPN, ID: wc.ID,
		Remote: true, RKey: rkey, RemoteAddr: addr, Length: length}
}

// WCError is a failed work completion as an error. errors.Is matches it
// against its class: ErrCompletionTransient or ErrCompletionAccess.
type WCError struct {
	Status    WCStatus
	VendorErr uint32
	QPN       QPN
	ID        uint64
	// Remote says RKey, RemoteAddr and Length hold the remote range of the
	// request (set by WC.ErrRemote).
	Remote     bool
	RKey       RKey
	RemoteAddr uint64
	Length     uint64
}

func (e *WCError) Error() string {
	msg := fmt.Sprintf("uverbs: work request %d on QP %#x completed with %s (vendor error %#x)", e.ID, uint32(e.QPN), e.Status, e.VendorErr)
	if e.Remote {
		msg += fmt.Sprintf(", rkey %#x range [%#x, %#x) (%d bytes)", e.RKey, e.RemoteAddr, e.RemoteAddr+e.Length, e.Length)
	}
	return msg
}

// Is reports whether target is the class of e's status
// (ErrCompletionTransient or ErrCompletionAccess).
func (e *WCError) Is(target error) bool {
	switch target {
	case ErrCompletionTransient:
		return e.Status.Transient()
	case ErrCompletionAccess:
		return e.Status.AccessDenied()
	}
	return false
}
