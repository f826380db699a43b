package mlx5

import "structs"

// ABIVersion is MLX5_IB_UVERBS_ABI_VERSION, the driver ABI version the
// kernel reports in /sys/class/infiniband_verbs/uverbsN/abi_version.
const ABIVersion = 1

// Library capabilities (enum mlx5_lib_caps).
const (
	LibCap4KUAR  = 1 << 0 // MLX5_LIB_CAP_4K_UAR
	LibCapDynUAR = 1 << 1 // MLX5_LIB_CAP_DYN_UAR
)

// QP creation flags (MLX5_QP_FLAG_*). Only the ones the provider may send
// are named; SCATTER_CQE is named so tests can assert it is never set.
const (
	QPFlagScatterCQE   = 1 << 1  // MLX5_QP_FLAG_SCATTER_CQE
	QPFlagBFRegIndex   = 1 << 3  // MLX5_QP_FLAG_BFREG_INDEX
	QPFlagUARPageIndex = 1 << 10 // MLX5_QP_FLAG_UAR_PAGE_INDEX
)

// CQ creation flags (enum mlx5_ib_create_cq_flags).
const (
	CQFlagCQE128BPad   = 1 << 0 // MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD
	CQFlagUARPageIndex = 1 << 1 // MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX
)

// mmap commands (enum mlx5_ib_mmap_cmd) for static UAR pages.
const (
	MmapRegularPage = 0 // MLX5_IB_MMAP_REGULAR_PAGE: write-combining where possible
	MmapWCPage      = 2 // MLX5_IB_MMAP_WC_PAGE
	MmapNCPage      = 3 // MLX5_IB_MMAP_NC_PAGE: uncached
)

// UAROffset returns the mmap offset (in bytes) of static UAR page index
// with the given command: the page offset carries the command in bits 8..15
// and the index in bits 0..7 (and index bits 8..15 in bits 16..23).
func UAROffset(cmd, index int, pageSize int) int64 {
	pgoff := int64(cmd&0xff)<<8 | int64(index&0xff) | int64((index>>8)&0xff)<<16
	return pgoff * int64(pageSize)
}

// Driver-namespace ioctl IDs for dynamic UAR allocation.
const (
	ObjectUAR            = 0x1008 // MLX5_IB_OBJECT_UAR
	MethodUARObjAlloc    = 0x1000 // MLX5_IB_METHOD_UAR_OBJ_ALLOC
	MethodUARObjDestroy  = 0x1001 // MLX5_IB_METHOD_UAR_OBJ_DESTROY
	AttrUARAllocHandle   = 0x1000 // MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE
	AttrUARAllocType     = 0x1001 // MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE
	AttrUARAllocMmapOff  = 0x1002 // MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET
	AttrUARAllocMmapLen  = 0x1003 // MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH
	AttrUARAllocPageID   = 0x1004 // MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID
	AttrUARDestroyHandle = 0x1000 // MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE
	UARAllocTypeBF       = 0      // MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF
	UARAllocTypeNC       = 1      // MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC
)

// AllocUcontextReqV2 is struct mlx5_ib_alloc_ucontext_req_v2, the driver
// data of GET_CONTEXT.
type AllocUcontextReqV2 struct {
	_                   structs.HostLayout
	TotalNumBFRegs      uint32 `c:"total_num_bfregs"`
	NumLowLatencyBFRegs uint32 `c:"num_low_latency_bfregs"`
	Flags               uint32 `c:"flags"`
	CompMask            uint32 `c:"comp_mask"`
	MaxCQEVersion       uint8  `c:"max_cqe_version"`
	Reserved0           uint8  `c:"reserved0"`
	Reserved1           uint16 `c:"reserved1"`
	Reserved2           uint32 `c:"reserved2"`
	LibCaps             uint64 `c:"lib_caps"`
}

// AllocUcontextResp is struct mlx5_ib_alloc_ucontext_resp, the driver part
// of the GET_CONTEXT response.
type AllocUcontextResp struct {
	_                  structs.HostLayout
	QPTabSize          uint32 `c:"qp_tab_size"`
	BFRegSize          uint32 `c:"bf_reg_size"`
	TotBFRegs          uint32 `c:"tot_bfregs"`
	CacheLineSize      uint32 `c:"cache_line_size"`
	MaxSQDescSz        uint16 `c:"max_sq_desc_sz"`
	MaxRQDescSz        uint16 `c:"max_rq_desc_sz"`
	MaxSendWQEBB       uint32 `c:"max_send_wqebb"`
	MaxRecvWR          uint32 `c:"max_recv_wr"`
	MaxSRQRecvWR       uint32 `c:"max_srq_recv_wr"`
	NumPorts           uint16 `c:"num_ports"`
	FlowActionFlags    uint16 `c:"flow_action_flags"`
	CompMask           uint32 `c:"comp_mask"`
	ResponseLength     uint32 `c:"response_length"`
	CQEVersion         uint8  `c:"cqe_version"`
	CmdsSuppUHW        uint8  `c:"cmds_supp_uhw"`
	EthMinInline       uint8  `c:"eth_min_inline"`
	ClockInfoVersions  uint8  `c:"clock_info_versions"`
	HCACoreClockOffset uint64 `c:"hca_core_clock_offset"`
	LogUARSize         uint32 `c:"log_uar_size"`
	NumUARsPerPage     uint32 `c:"num_uars_per_page"`
	NumDynBFRegs       uint32 `c:"num_dyn_bfregs"`
	DumpFillMkey       uint32 `c:"dump_fill_mkey"`
}

// AllocPDResp is struct mlx5_ib_alloc_pd_resp.
type AllocPDResp struct {
	_   structs.HostLayout
	PDN uint32 `c:"pdn"`
}

// CreateCQ is struct mlx5_ib_create_cq, the driver data of CREATE_CQ.
type CreateCQ struct {
	_                structs.HostLayout
	BufAddr          uint64 `c:"buf_addr"`
	DBAddr           uint64 `c:"db_addr"`
	CQESize          uint32 `c:"cqe_size"`
	CQECompEn        uint8  `c:"cqe_comp_en"`
	CQECompResFormat uint8  `c:"cqe_comp_res_format"`
	Flags            uint16 `c:"flags"`
	UARPageIndex     uint16 `c:"uar_page_index"`
	Reserved0        uint16 `c:"reserved0"`
	Reserved1        uint32 `c:"reserved1"`
}

// CreateCQResp is struct mlx5_ib_create_cq_resp.
type CreateCQResp struct {
	_        structs.HostLayout
	CQN      uint32 `c:"cqn"`
	Reserved uint32 `c:"reserved"`
}

// CreateQP is struct mlx5_ib_create_qp, the driver data of CREATE_QP.
type CreateQP struct {
	_          structs.HostLayout
	BufAddr    uint64 `c:"buf_addr"`
	DBAddr     uint64 `c:"db_addr"`
	SQWQECount uint32 `c:"sq_wqe_count"`
	RQWQECount uint32 `c:"rq_wqe_count"`
	RQWQEShift uint32 `c:"rq_wqe_shift"`
	Flags      uint32 `c:"flags"`
	UIdx       uint32 `c:"uidx"`
	BFRegIndex uint32 `c:"bfreg_index"`
	SQBufAddr  uint64 `c:"sq_buf_addr"`
	ECEOptions uint32 `c:"ece_options"`
	DCIStreams uint16 `c:"dci_streams"` // struct mlx5_ib_create_qp_dci_streams (2 x u8)
	Reserved   uint16 `c:"reserved"`
}

// CreateQPResp is struct mlx5_ib_create_qp_resp.
type CreateQPResp struct {
	_          structs.HostLayout
	BFRegIndex uint32 `c:"bfreg_index"`
	ECEOptions uint32 `c:"ece_options"`
	CompMask   uint32 `c:"comp_mask"`
	TIRN       uint32 `c:"tirn"`
	TISN       uint32 `c:"tisn"`
	RQN        uint32 `c:"rqn"`
	SQN        uint32 `c:"sqn"`
	Reserved1  uint32 `c:"reserved1"`
	TIRICMAddr uint64 `c:"tir_icm_addr"`
}

// Minimum CREATE_QP driver-data length the kernel accepts:
// offsetof(struct mlx5_ib_create_qp, ece_options).
const CreateQPMinLen = 48

// Sizes of the structs above, checked at compile time in abi_unsafe.go and
// against gcc in the layout test.
const (
	SizeAllocUcontextReqV2 = 32
	SizeAllocUcontextResp  = 72
	SizeAllocPDResp        = 4
	SizeCreateCQ           = 32
	SizeCreateCQResp       = 8
	SizeCreateQP           = 56
	SizeCreateQPResp       = 40
)
