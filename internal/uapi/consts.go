package uapi

// Legacy write() command numbers (enum ib_uverbs_write_cmds).
const (
	CmdGetContext        = 0
	CmdQueryDevice       = 1
	CmdQueryPort         = 2
	CmdAllocPD           = 3
	CmdCreateAH          = 5
	CmdDestroyAH         = 8
	CmdDeallocPD         = 4
	CmdRegMR             = 9
	CmdDeregMR           = 13
	CmdCreateCompChannel = 17
	CmdCreateCQ          = 18
	CmdDestroyCQ         = 20
	CmdReqNotifyCQ       = 23
	CmdCreateQP          = 24
	CmdQueryQP           = 25
	CmdModifyQP          = 26
	CmdDestroyQP         = 27
	CmdPostSend          = 28
	CmdPostRecv          = 29

	// CmdFlagExtended selects the extended command table (ib_uverbs_ex_cmd_hdr follows).
	CmdFlagExtended  = 0x80000000
	CmdExQueryDevice = CmdFlagExtended | 1
	CmdExCreateCQ    = CmdFlagExtended | 18
	CmdExCreateQP    = CmdFlagExtended | 24
	CmdExModifyQP    = CmdFlagExtended | 26
)

// RDMA_VERBS_IOCTL = _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr).
const RDMAVerbsIoctl = 0xC0181B01

// Attribute flags of struct ib_uverbs_attr.
const (
	AttrFMandatory   = 1 // UVERBS_ATTR_F_MANDATORY
	AttrFValidOutput = 2 // UVERBS_ATTR_F_VALID_OUTPUT (written by the kernel)
)

// Driver-namespace attribute IDs carrying driver (UHW) data.
const (
	AttrUHWIn  = 0x1000 // UVERBS_ATTR_UHW_IN
	AttrUHWOut = 0x1001 // UVERBS_ATTR_UHW_OUT
)

// Core ioctl objects (enum uverbs_default_objects).
const (
	ObjectDevice      = 0
	ObjectPD          = 1
	ObjectCompChannel = 2
	ObjectCQ          = 3
	ObjectQP          = 4
	ObjectMR          = 7
	ObjectAsyncEvent  = 16
)

// Methods and attributes used on the ioctl channel (ib_user_ioctl_cmds.h).
const (
	MethodInvokeWrite   = 0 // DEVICE
	MethodQueryPort     = 2 // DEVICE
	MethodGetContext    = 3 // DEVICE
	MethodQueryGIDTable = 5 // DEVICE
	MethodQueryGIDEntry = 6 // DEVICE

	AttrQueryGIDTableEntrySize      = 0
	AttrQueryGIDTableFlags          = 1
	AttrQueryGIDTableRespEntries    = 2
	AttrQueryGIDTableRespNumEntries = 3

	MethodCQCreate          = 0
	MethodCQDestroy         = 1
	AttrCreateCQHandle      = 0
	AttrCreateCQCQE         = 1
	AttrCreateCQUserHandle  = 2
	AttrCreateCQCompChannel = 3
	AttrCreateCQCompVector  = 4
	AttrCreateCQFlags       = 5
	AttrCreateCQRespCQE     = 6
	AttrCreateCQEventFD     = 7
	AttrDestroyCQHandle     = 0
	AttrDestroyCQResp       = 1

	MethodQPDestroy     = 1
	AttrDestroyQPHandle = 0
	AttrDestroyQPResp   = 1

	MethodPDDestroy     = 0
	AttrDestroyPDHandle = 0
	MethodMRDestroy     = 1
	AttrDestroyMRHandle = 0

	MethodAsyncEventAlloc  = 0
	AttrAsyncEventFDHandle = 0
)

// Driver IDs (enum rdma_driver_id).
const (
	DriverUnknown = 0
	DriverMLX5    = 1
	DriverRXE     = 14
)

// QP types (enum ib_uverbs_qp_type).
const (
	QPTypeRC = 2
	QPTypeUC = 3
	QPTypeUD = 4
)

// GID types (enum ib_uverbs_gid_type).
const (
	GIDTypeIB     = 0
	GIDTypeRoCEv1 = 1
	GIDTypeRoCEv2 = 2
)

// Modify-QP attribute mask bits (enum ib_qp_attr_mask / IBV_QP_*).
const (
	QPAttrState            = 1 << 0
	QPAttrCurState         = 1 << 1
	QPAttrEnSQDAsyncNotify = 1 << 2
	QPAttrAccessFlags      = 1 << 3
	QPAttrQKey             = 1 << 6
	QPAttrPKeyIndex        = 1 << 4
	QPAttrPort             = 1 << 5
	QPAttrAV               = 1 << 7
	QPAttrPathMTU          = 1 << 8
	QPAttrTimeout          = 1 << 9
	QPAttrRetryCnt         = 1 << 10
	QPAttrRNRRetry         = 1 << 11
	QPAttrRQPSN            = 1 << 12
	QPAttrMaxQPRdAtomic    = 1 << 13
	QPAttrMinRNRTimer      = 1 << 15
	QPAttrSQPSN            = 1 << 16
	QPAttrMaxDestRdAtomic  = 1 << 17
	QPAttrCap              = 1 << 19
	QPAttrDestQPN          = 1 << 20
)

// Send WR opcodes (IB_UVERBS_WR_*), also used by rxe_send_wr.opcode.
const (
	WRRDMAWrite         = 0
	WRRDMAWriteWithImm  = 1
	WRSend              = 2
	WRSendWithImm       = 3
	WRRDMARead          = 4
	WRAtomicCmpAndSwp   = 5
	WRAtomicFetchAndAdd = 6
	WRLocalInv          = 7
	WRBindMW            = 8
	WRSendWithInv       = 9
)

// Send flags (IB_UVERBS_SEND_*).
const (
	SendFence     = 1
	SendSignaled  = 2
	SendSolicited = 4
	SendInline    = 8
)

// Work completion opcodes (enum ib_wc_opcode as delivered in ib_uverbs_wc).
const (
	WCSend            = 0
	WCRDMAWrite       = 1
	WCRDMARead        = 2
	WCCompSwap        = 3
	WCFetchAdd        = 4
	WCBindMW          = 5
	WCLocalInv        = 6
	WCRecv            = 128
	WCRecvRDMAWithImm = 129
)

// Kernel work-completion flags (enum ib_wc_flags). These are the kernel bit
// values, which rxe copies to user space unchanged; libibverbs' IBV_WC_* differ.
const (
	WCFlagGRH            = 1
	WCFlagWithImm        = 2
	WCFlagWithInvalidate = 4
	WCFlagIPCSumOK       = 8
)

// rxe send WQE state (enum wqe_state in the kernel): a newly posted WQE is 0.
const RxeWQEStatePosted = 0

// RxeQueueHeaderSize is offsetof(struct rxe_queue_buf, data).
const RxeQueueHeaderSize = 384
