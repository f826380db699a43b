package uapi

import "structs"

// CmdHdr is struct ib_uverbs_cmd_hdr, the 8-byte prefix of every write() command.
type CmdHdr struct {
	_        structs.HostLayout
	Command  uint32 `c:"command"`
	InWords  uint16 `c:"in_words"`
	OutWords uint16 `c:"out_words"`
}

// ExCmdHdr is struct ib_uverbs_ex_cmd_hdr, following CmdHdr for extended commands.
type ExCmdHdr struct {
	_                structs.HostLayout
	Response         uint64 `c:"response"`
	ProviderInWords  uint16 `c:"provider_in_words"`
	ProviderOutWords uint16 `c:"provider_out_words"`
	CmdHdrReserved   uint32 `c:"cmd_hdr_reserved"`
}

// IoctlHdr is struct ib_uverbs_ioctl_hdr without its flexible attrs array.
type IoctlHdr struct {
	_         structs.HostLayout
	Length    uint16 `c:"length"`
	ObjectID  uint16 `c:"object_id"`
	MethodID  uint16 `c:"method_id"`
	NumAttrs  uint16 `c:"num_attrs"`
	Reserved1 uint64 `c:"reserved1"`
	DriverID  uint32 `c:"driver_id"`
	Reserved2 uint32 `c:"reserved2"`
}

// Attr is struct ib_uverbs_attr.
type Attr struct {
	_        structs.HostLayout
	AttrID   uint16 `c:"attr_id"`
	Len      uint16 `c:"len"`
	Flags    uint16 `c:"flags"`
	AttrData uint16 `c:"attr_data"` // union enum_data{elem_id,reserved} / reserved
	Data     uint64 `c:"data"`      // union: value, pointer, handle, fd
}

// GetContext is struct ib_uverbs_get_context.
type GetContext struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
}

// GetContextResp is struct ib_uverbs_get_context_resp.
type GetContextResp struct {
	_              structs.HostLayout
	AsyncFD        uint32 `c:"async_fd"`
	NumCompVectors uint32 `c:"num_comp_vectors"`
}

// QueryDevice is struct ib_uverbs_query_device.
type QueryDevice struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
}

// QueryDeviceResp is struct ib_uverbs_query_device_resp.
type QueryDeviceResp struct {
	_                     structs.HostLayout
	FWVer                 uint64  `c:"fw_ver"`
	NodeGUID              uint64  `c:"node_guid"` // big-endian
	SysImageGUID          uint64  `c:"sys_image_guid"`
	MaxMRSize             uint64  `c:"max_mr_size"`
	PageSizeCap           uint64  `c:"page_size_cap"`
	VendorID              uint32  `c:"vendor_id"`
	VendorPartID          uint32  `c:"vendor_part_id"`
	HWVer                 uint32  `c:"hw_ver"`
	MaxQP                 uint32  `c:"max_qp"`
	MaxQPWR               uint32  `c:"max_qp_wr"`
	DeviceCapFlags        uint32  `c:"device_cap_flags"`
	MaxSGE                uint32  `c:"max_sge"`
	MaxSGERd              uint32  `c:"max_sge_rd"`
	MaxCQ                 uint32  `c:"max_cq"`
	MaxCQE                uint32  `c:"max_cqe"`
	MaxMR                 uint32  `c:"max_mr"`
	MaxPD                 uint32  `c:"max_pd"`
	MaxQPRdAtom           uint32  `c:"max_qp_rd_atom"`
	MaxEERdAtom           uint32  `c:"max_ee_rd_atom"`
	MaxResRdAtom          uint32  `c:"max_res_rd_atom"`
	MaxQPInitRdAtom       uint32  `c:"max_qp_init_rd_atom"`
	MaxEEInitRdAtom       uint32  `c:"max_ee_init_rd_atom"`
	AtomicCap             uint32  `c:"atomic_cap"`
	MaxEE                 uint32  `c:"max_ee"`
	MaxRDD                uint32  `c:"max_rdd"`
	MaxMW                 uint32  `c:"max_mw"`
	MaxRawIPv6QP          uint32  `c:"max_raw_ipv6_qp"`
	MaxRawEthyQP          uint32  `c:"max_raw_ethy_qp"`
	MaxMcastGrp           uint32  `c:"max_mcast_grp"`
	MaxMcastQPAttach      uint32  `c:"max_mcast_qp_attach"`
	MaxTotalMcastQPAttach uint32  `c:"max_total_mcast_qp_attach"`
	MaxAH                 uint32  `c:"max_ah"`
	MaxFMR                uint32  `c:"max_fmr"`
	MaxMapPerFMR          uint32  `c:"max_map_per_fmr"`
	MaxSRQ                uint32  `c:"max_srq"`
	MaxSRQWR              uint32  `c:"max_srq_wr"`
	MaxSRQSGE             uint32  `c:"max_srq_sge"`
	MaxPKeys              uint16  `c:"max_pkeys"`
	LocalCAAckDelay       uint8   `c:"local_ca_ack_delay"`
	PhysPortCnt           uint8   `c:"phys_port_cnt"`
	Reserved              [4]byte `c:"reserved"`
}

// QueryPort is struct ib_uverbs_query_port.
type QueryPort struct {
	_        structs.HostLayout
	Response uint64  `c:"response"`
	PortNum  uint8   `c:"port_num"`
	Reserved [7]byte `c:"reserved"`
}

// QueryPortResp is struct ib_uverbs_query_port_resp.
type QueryPortResp struct {
	_             structs.HostLayout
	PortCapFlags  uint32 `c:"port_cap_flags"`
	MaxMsgSz      uint32 `c:"max_msg_sz"`
	BadPKeyCntr   uint32 `c:"bad_pkey_cntr"`
	QKeyViolCntr  uint32 `c:"qkey_viol_cntr"`
	GIDTblLen     uint32 `c:"gid_tbl_len"`
	PKeyTblLen    uint16 `c:"pkey_tbl_len"`
	LID           uint16 `c:"lid"`
	SMLID         uint16 `c:"sm_lid"`
	State         uint8  `c:"state"`
	MaxMTU        uint8  `c:"max_mtu"`
	ActiveMTU     uint8  `c:"active_mtu"`
	LMC           uint8  `c:"lmc"`
	MaxVLNum      uint8  `c:"max_vl_num"`
	SMSL          uint8  `c:"sm_sl"`
	SubnetTimeout uint8  `c:"subnet_timeout"`
	InitTypeReply uint8  `c:"init_type_reply"`
	ActiveWidth   uint8  `c:"active_width"`
	ActiveSpeed   uint8  `c:"active_speed"`
	PhysState     uint8  `c:"phys_state"`
	LinkLayer     uint8  `c:"link_layer"`
	Flags         uint8  `c:"flags"`
	Reserved      uint8  `c:"reserved"`
}

// AllocPD is struct ib_uverbs_alloc_pd.
type AllocPD struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
}

// AllocPDResp is struct ib_uverbs_alloc_pd_resp.
type AllocPDResp struct {
	_        structs.HostLayout
	PDHandle uint32 `c:"pd_handle"`
}

// DeallocPD is struct ib_uverbs_dealloc_pd.
type DeallocPD struct {
	_        structs.HostLayout
	PDHandle uint32 `c:"pd_handle"`
}

// RegMR is struct ib_uverbs_reg_mr.
type RegMR struct {
	_           structs.HostLayout
	Response    uint64 `c:"response"`
	Start       uint64 `c:"start"`
	Length      uint64 `c:"length"`
	HCAVA       uint64 `c:"hca_va"`
	PDHandle    uint32 `c:"pd_handle"`
	AccessFlags uint32 `c:"access_flags"`
}

// RegMRResp is struct ib_uverbs_reg_mr_resp.
type RegMRResp struct {
	_        structs.HostLayout
	MRHandle uint32 `c:"mr_handle"`
	LKey     uint32 `c:"lkey"`
	RKey     uint32 `c:"rkey"`
}

// DeregMR is struct ib_uverbs_dereg_mr.
type DeregMR struct {
	_        structs.HostLayout
	MRHandle uint32 `c:"mr_handle"`
}

// CreateCompChannel is struct ib_uverbs_create_comp_channel.
type CreateCompChannel struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
}

// CreateCompChannelResp is struct ib_uverbs_create_comp_channel_resp.
type CreateCompChannelResp struct {
	_  structs.HostLayout
	FD uint32 `c:"fd"`
}

// CreateCQ is struct ib_uverbs_create_cq.
type CreateCQ struct {
	_           structs.HostLayout
	Response    uint64 `c:"response"`
	UserHandle  uint64 `c:"user_handle"`
	CQE         uint32 `c:"cqe"`
	CompVector  uint32 `c:"comp_vector"`
	CompChannel int32  `c:"comp_channel"`
	Reserved    uint32 `c:"reserved"`
}

// CreateCQResp is struct ib_uverbs_create_cq_resp.
type CreateCQResp struct {
	_        structs.HostLayout
	CQHandle uint32 `c:"cq_handle"`
	CQE      uint32 `c:"cqe"`
}

// DestroyCQ is struct ib_uverbs_destroy_cq.
type DestroyCQ struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
	CQHandle uint32 `c:"cq_handle"`
	Reserved uint32 `c:"reserved"`
}

// DestroyCQResp is struct ib_uverbs_destroy_cq_resp.
type DestroyCQResp struct {
	_                   structs.HostLayout
	CompEventsReported  uint32 `c:"comp_events_reported"`
	AsyncEventsReported uint32 `c:"async_events_reported"`
}

// ReqNotifyCQ is struct ib_uverbs_req_notify_cq.
type ReqNotifyCQ struct {
	_             structs.HostLayout
	CQHandle      uint32 `c:"cq_handle"`
	SolicitedOnly uint32 `c:"solicited_only"`
}

// CreateQP is struct ib_uverbs_create_qp.
type CreateQP struct {
	_             structs.HostLayout
	Response      uint64 `c:"response"`
	UserHandle    uint64 `c:"user_handle"`
	PDHandle      uint32 `c:"pd_handle"`
	SendCQHandle  uint32 `c:"send_cq_handle"`
	RecvCQHandle  uint32 `c:"recv_cq_handle"`
	SRQHandle     uint32 `c:"srq_handle"`
	MaxSendWR     uint32 `c:"max_send_wr"`
	MaxRecvWR     uint32 `c:"max_recv_wr"`
	MaxSendSGE    uint32 `c:"max_send_sge"`
	MaxRecvSGE    uint32 `c:"max_recv_sge"`
	MaxInlineData uint32 `c:"max_inline_data"`
	SQSigAll      uint8  `c:"sq_sig_all"`
	QPType        uint8  `c:"qp_type"`
	IsSRQ         uint8  `c:"is_srq"`
	Reserved      uint8  `c:"reserved"`
}

// CreateQPResp is struct ib_uverbs_create_qp_resp.
type CreateQPResp struct {
	_             structs.HostLayout
	QPHandle      uint32 `c:"qp_handle"`
	QPN           uint32 `c:"qpn"`
	MaxSendWR     uint32 `c:"max_send_wr"`
	MaxRecvWR     uint32 `c:"max_recv_wr"`
	MaxSendSGE    uint32 `c:"max_send_sge"`
	MaxRecvSGE    uint32 `c:"max_recv_sge"`
	MaxInlineData uint32 `c:"max_inline_data"`
	Reserved      uint32 `c:"reserved"`
}

// QPDest is struct ib_uverbs_qp_dest (the address vector of modify/query QP).
type QPDest struct {
	_            structs.HostLayout
	DGID         [16]byte `c:"dgid"`
	FlowLabel    uint32   `c:"flow_label"`
	DLID         uint16   `c:"dlid"`
	Reserved     uint16   `c:"reserved"`
	SGIDIndex    uint8    `c:"sgid_index"`
	HopLimit     uint8    `c:"hop_limit"`
	TrafficClass uint8    `c:"traffic_class"`
	SL           uint8    `c:"sl"`
	SrcPathBits  uint8    `c:"src_path_bits"`
	StaticRate   uint8    `c:"static_rate"`
	IsGlobal     uint8    `c:"is_global"`
	PortNum      uint8    `c:"port_num"`
}

// ModifyQP is struct ib_uverbs_modify_qp (no response, no driver data).
type ModifyQP struct {
	_                structs.HostLayout
	Dest             QPDest  `c:"dest"`
	AltDest          QPDest  `c:"alt_dest"`
	QPHandle         uint32  `c:"qp_handle"`
	AttrMask         uint32  `c:"attr_mask"`
	QKey             uint32  `c:"qkey"`
	RQPSN            uint32  `c:"rq_psn"`
	SQPSN            uint32  `c:"sq_psn"`
	DestQPNum        uint32  `c:"dest_qp_num"`
	QPAccessFlags    uint32  `c:"qp_access_flags"`
	PKeyIndex        uint16  `c:"pkey_index"`
	AltPKeyIndex     uint16  `c:"alt_pkey_index"`
	QPState          uint8   `c:"qp_state"`
	CurQPState       uint8   `c:"cur_qp_state"`
	PathMTU          uint8   `c:"path_mtu"`
	PathMigState     uint8   `c:"path_mig_state"`
	EnSQDAsyncNotify uint8   `c:"en_sqd_async_notify"`
	MaxRdAtomic      uint8   `c:"max_rd_atomic"`
	MaxDestRdAtomic  uint8   `c:"max_dest_rd_atomic"`
	MinRNRTimer      uint8   `c:"min_rnr_timer"`
	PortNum          uint8   `c:"port_num"`
	Timeout          uint8   `c:"timeout"`
	RetryCnt         uint8   `c:"retry_cnt"`
	RNRRetry         uint8   `c:"rnr_retry"`
	AltPortNum       uint8   `c:"alt_port_num"`
	AltTimeout       uint8   `c:"alt_timeout"`
	Reserved         [2]byte `c:"reserved"`
}

// QueryQP is struct ib_uverbs_query_qp.
type QueryQP struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
	QPHandle uint32 `c:"qp_handle"`
	AttrMask uint32 `c:"attr_mask"`
}

// QueryQPResp is struct ib_uverbs_query_qp_resp.
type QueryQPResp struct {
	_               structs.HostLayout
	Dest            QPDest  `c:"dest"`
	AltDest         QPDest  `c:"alt_dest"`
	MaxSendWR       uint32  `c:"max_send_wr"`
	MaxRecvWR       uint32  `c:"max_recv_wr"`
	MaxSendSGE      uint32  `c:"max_send_sge"`
	MaxRecvSGE      uint32  `c:"max_recv_sge"`
	MaxInlineData   uint32  `c:"max_inline_data"`
	QKey            uint32  `c:"qkey"`
	RQPSN           uint32  `c:"rq_psn"`
	SQPSN           uint32  `c:"sq_psn"`
	DestQPNum       uint32  `c:"dest_qp_num"`
	QPAccessFlags   uint32  `c:"qp_access_flags"`
	PKeyIndex       uint16  `c:"pkey_index"`
	AltPKeyIndex    uint16  `c:"alt_pkey_index"`
	QPState         uint8   `c:"qp_state"`
	CurQPState      uint8   `c:"cur_qp_state"`
	PathMTU         uint8   `c:"path_mtu"`
	PathMigState    uint8   `c:"path_mig_state"`
	SQDraining      uint8   `c:"sq_draining"`
	MaxRdAtomic     uint8   `c:"max_rd_atomic"`
	MaxDestRdAtomic uint8   `c:"max_dest_rd_atomic"`
	MinRNRTimer     uint8   `c:"min_rnr_timer"`
	PortNum         uint8   `c:"port_num"`
	Timeout         uint8   `c:"timeout"`
	RetryCnt        uint8   `c:"retry_cnt"`
	RNRRetry        uint8   `c:"rnr_retry"`
	AltPortNum      uint8   `c:"alt_port_num"`
	AltTimeout      uint8   `c:"alt_timeout"`
	SQSigAll        uint8   `c:"sq_sig_all"`
	Reserved        [5]byte `c:"reserved"`
}

// DestroyQP is struct ib_uverbs_destroy_qp.
type DestroyQP struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
	QPHandle uint32 `c:"qp_handle"`
	Reserved uint32 `c:"reserved"`
}

// DestroyQPResp is struct ib_uverbs_destroy_qp_resp.
type DestroyQPResp struct {
	_              structs.HostLayout
	EventsReported uint32 `c:"events_reported"`
}

// PostSend is struct ib_uverbs_post_send without its flexible send_wr array.
// rxe uses it with WRCount 0 as the "kick" that runs the send queue.
type PostSend struct {
	_        structs.HostLayout
	Response uint64 `c:"response"`
	QPHandle uint32 `c:"qp_handle"`
	WRCount  uint32 `c:"wr_count"`
	SGECount uint32 `c:"sge_count"`
	WQESize  uint32 `c:"wqe_size"`
}

// PostSendResp is struct ib_uverbs_post_send_resp.
type PostSendResp struct {
	_     structs.HostLayout
	BadWR uint32 `c:"bad_wr"`
}

// SendWRSize is sizeof(struct ib_uverbs_send_wr); the kernel requires the
// post_send wqe_size to be at least this, even with wr_count 0.
const SendWRSize = 56

// WC is struct ib_uverbs_wc: a work completion, also the rxe CQE format.
type WC struct {
	_            structs.HostLayout
	WRID         uint64 `c:"wr_id"`
	Status       uint32 `c:"status"`
	Opcode       uint32 `c:"opcode"`
	VendorErr    uint32 `c:"vendor_err"`
	ByteLen      uint32 `c:"byte_len"`
	Ex           uint32 `c:"ex.imm_data"` // union imm_data (big-endian) / invalidate_rkey
	QPNum        uint32 `c:"qp_num"`
	SrcQP        uint32 `c:"src_qp"`
	WCFlags      uint32 `c:"wc_flags"`
	PKeyIndex    uint16 `c:"pkey_index"`
	SLID         uint16 `c:"slid"`
	SL           uint8  `c:"sl"`
	DLIDPathBits uint8  `c:"dlid_path_bits"`
	PortNum      uint8  `c:"port_num"`
	Reserved     uint8  `c:"reserved"`
}

// AsyncEventDesc is struct ib_uverbs_async_event_desc, read from the async event fd.
type AsyncEventDesc struct {
	_         structs.HostLayout
	Element   uint64 `c:"element"`
	EventType uint32 `c:"event_type"`
	Reserved  uint32 `c:"reserved"`
}

// CompEventDesc is struct ib_uverbs_comp_event_desc, read from a completion channel.
type CompEventDesc struct {
	_        structs.HostLayout
	CQHandle uint64 `c:"cq_handle"`
}

// GIDEntry is struct ib_uverbs_gid_entry (QUERY_GID_TABLE / QUERY_GID_ENTRY).
type GIDEntry struct {
	_             structs.HostLayout
	GID           [16]byte `c:"gid"` // __aligned_u64 gid[2], raw network-order bytes
	GIDIndex      uint32   `c:"gid_index"`
	PortNum       uint32   `c:"port_num"`
	GIDType       uint32   `c:"gid_type"`
	NetdevIfindex uint32   `c:"netdev_ifindex"`
}

// ---- Soft-RoCE (rdma_user_rxe.h) ------------------------------------------

// RxeMmapInfo is struct mminfo: where to mmap a kernel queue on the uverbs fd.
type RxeMmapInfo struct {
	_      structs.HostLayout
	Offset uint64 `c:"offset"`
	Size   uint32 `c:"size"`
	Pad    uint32 `c:"pad"`
}

// RxeCreateCQResp is struct rxe_create_cq_resp (driver response of CREATE_CQ).
type RxeCreateCQResp struct {
	_  structs.HostLayout
	MI RxeMmapInfo `c:"mi"`
}

// RxeCreateQPResp is struct rxe_create_qp_resp (driver response of CREATE_QP).
type RxeCreateQPResp struct {
	_    structs.HostLayout
	RQMI RxeMmapInfo `c:"rq_mi"`
	SQMI RxeMmapInfo `c:"sq_mi"`
}

// RxeQueueBuf is the header of struct rxe_queue_buf; slots start at offset 384.
type RxeQueueBuf struct {
	_             structs.HostLayout
	Log2ElemSize  uint32     `c:"log2_elem_size"`
	IndexMask     uint32     `c:"index_mask"`
	Pad1          [30]uint32 `c:"pad_1"`
	ProducerIndex uint32     `c:"producer_index"`
	Pad2          [31]uint32 `c:"pad_2"`
	ConsumerIndex uint32     `c:"consumer_index"`
	Pad3          [31]uint32 `c:"pad_3"`
}

// RxeSGE is struct rxe_sge.
type RxeSGE struct {
	_      structs.HostLayout
	Addr   uint64 `c:"addr"`
	Length uint32 `c:"length"`
	LKey   uint32 `c:"lkey"`
}

// RxeDMAInfo is struct rxe_dma_info without its flexible sge/inline_data union.
type RxeDMAInfo struct {
	_         structs.HostLayout
	Length    uint32 `c:"length"`
	Resid     uint32 `c:"resid"`
	CurSGE    uint32 `c:"cur_sge"`
	NumSGE    uint32 `c:"num_sge"`
	SGEOffset uint32 `c:"sge_offset"`
	Reserved  uint32 `c:"reserved"`
}

// RxeSendWR is struct rxe_send_wr. The 120-byte union wr is spelled out for
// the rdma and atomic arms; the ud and mw arms are not used.
type RxeSendWR struct {
	_          structs.HostLayout
	WRID       uint64     `c:"wr_id"`
	Reserved   uint32     `c:"reserved"`
	Opcode     uint32     `c:"opcode"`
	SendFlags  uint32     `c:"send_flags"`
	Ex         uint32     `c:"ex.imm_data"` // imm_data (big-endian) / invalidate_rkey
	RemoteAddr uint64     `c:"wr.atomic.remote_addr"`
	CompareAdd uint64     `c:"wr.atomic.compare_add"` // also wr.rdma.rkey (low 32 bits) for RDMA ops
	Swap       uint64     `c:"wr.atomic.swap"`
	AtomicRKey uint32     `c:"wr.atomic.rkey"`
	Pad        [23]uint32 `c:"-"`
}

// RxeSendWQE is struct rxe_send_wqe without the trailing sge/inline payload,
// which starts at offset 208.
type RxeSendWQE struct {
	_           structs.HostLayout
	WR          RxeSendWR  `c:"wr"`
	Status      uint32     `c:"status"`
	State       uint32     `c:"state"`
	IOVA        uint64     `c:"iova"`
	Mask        uint32     `c:"mask"`
	FirstPSN    uint32     `c:"first_psn"`
	LastPSN     uint32     `c:"last_psn"`
	AckLength   uint32     `c:"ack_length"`
	SSN         uint32     `c:"ssn"`
	HasRdAtomic uint32     `c:"has_rd_atomic"`
	DMA         RxeDMAInfo `c:"dma"`
}

// RxeRecvWQE is struct rxe_recv_wqe without the trailing sge array (offset 40).
type RxeRecvWQE struct {
	_        structs.HostLayout
	WRID     uint64     `c:"wr_id"`
	Reserved uint32     `c:"reserved"`
	Padding  uint32     `c:"padding"`
	DMA      RxeDMAInfo `c:"dma"`
}

// ExQueryDevice is struct ib_uverbs_ex_query_device (EX_QUERY_DEVICE request).
type ExQueryDevice struct {
	_        structs.HostLayout
	CompMask uint32 `c:"comp_mask"`
	Reserved uint32 `c:"reserved"`
}

// ExQueryDeviceResp is struct ib_uverbs_ex_query_device_resp. The nested
// capability structs we do not use are kept as opaque byte ranges.
type ExQueryDeviceResp struct {
	_                  structs.HostLayout
	Base               QueryDeviceResp `c:"base"`
	CompMask           uint32          `c:"comp_mask"`
	ResponseLength     uint32          `c:"response_length"`
	ODPGeneralCaps     uint64          `c:"odp_caps.general_caps"`
	ODPRCCaps          uint32          `c:"odp_caps.per_transport_caps.rc_odp_caps"`
	ODPUCCaps          uint32          `c:"odp_caps.per_transport_caps.uc_odp_caps"`
	ODPUDCaps          uint32          `c:"odp_caps.per_transport_caps.ud_odp_caps"`
	ODPReserved        uint32          `c:"odp_caps.reserved"`
	TimestampMask      uint64          `c:"timestamp_mask"`
	HCACoreClock       uint64          `c:"hca_core_clock"`
	DeviceCapFlagsEx   uint64          `c:"device_cap_flags_ex"`
	RSSCaps            [16]byte        `c:"rss_caps"`
	MaxWQTypeRQ        uint32          `c:"max_wq_type_rq"`
	RawPacketCaps      uint32          `c:"raw_packet_caps"`
	TMCaps             [24]byte        `c:"tm_caps"`
	CQModerationCount  uint16          `c:"cq_moderation_caps.max_cq_moderation_count"`
	CQModerationPeriod uint16          `c:"cq_moderation_caps.max_cq_moderation_period"`
	CQModerationRsvd   uint32          `c:"cq_moderation_caps.reserved"`
	MaxDMSize          uint64          `c:"max_dm_size"`
	XRCODPCaps         uint32          `c:"xrc_odp_caps"`
	Reserved           uint32          `c:"reserved"`
}

// AHAttr is struct ib_uverbs_ah_attr (with its global route inlined).
type AHAttr struct {
	_            structs.HostLayout
	DGID         [16]byte `c:"grh.dgid"`
	FlowLabel    uint32   `c:"grh.flow_label"`
	SGIDIndex    uint8    `c:"grh.sgid_index"`
	HopLimit     uint8    `c:"grh.hop_limit"`
	TrafficClass uint8    `c:"grh.traffic_class"`
	GRHReserved  uint8    `c:"grh.reserved"`
	DLID         uint16   `c:"dlid"`
	SL           uint8    `c:"sl"`
	SrcPathBits  uint8    `c:"src_path_bits"`
	StaticRate   uint8    `c:"static_rate"`
	IsGlobal     uint8    `c:"is_global"`
	PortNum      uint8    `c:"port_num"`
	Reserved     uint8    `c:"reserved"`
}

// CreateAH is struct ib_uverbs_create_ah.
type CreateAH struct {
	_          structs.HostLayout
	Response   uint64 `c:"response"`
	UserHandle uint64 `c:"user_handle"`
	PDHandle   uint32 `c:"pd_handle"`
	Reserved   uint32 `c:"reserved"`
	Attr       AHAttr `c:"attr"`
}

// CreateAHResp is struct ib_uverbs_create_ah_resp.
type CreateAHResp struct {
	_        structs.HostLayout
	AHHandle uint32 `c:"ah_handle"`
}

// DestroyAH is struct ib_uverbs_destroy_ah.
type DestroyAH struct {
	_        structs.HostLayout
	AHHandle uint32 `c:"ah_handle"`
}

// RxeCreateAHResp is struct rxe_create_ah_resp: the AH number UD send WQEs carry.
type RxeCreateAHResp struct {
	_        structs.HostLayout
	AHNum    uint32 `c:"ah_num"`
	Reserved uint32 `c:"reserved"`
}
