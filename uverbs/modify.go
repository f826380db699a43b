package uverbs

import (
	"fmt"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// QPAttrMask selects the QPAttr fields a Modify applies (IB_QP_*).
type QPAttrMask uint32

// Attribute mask bits.
const (
	QPAttrState            QPAttrMask = uapi.QPAttrState
	QPAttrCurState         QPAttrMask = uapi.QPAttrCurState
	QPAttrEnSQDAsyncNotify QPAttrMask = uapi.QPAttrEnSQDAsyncNotify
	QPAttrAccessFlags      QPAttrMask = uapi.QPAttrAccessFlags
	QPAttrQKey             QPAttrMask = uapi.QPAttrQKey
	QPAttrPKeyIndex        QPAttrMask = uapi.QPAttrPKeyIndex
	QPAttrPort             QPAttrMask = uapi.QPAttrPort
	QPAttrAV               QPAttrMask = uapi.QPAttrAV
	QPAttrPathMTU          QPAttrMask = uapi.QPAttrPathMTU
	QPAttrTimeout          QPAttrMask = uapi.QPAttrTimeout
	QPAttrRetryCnt         QPAttrMask = uapi.QPAttrRetryCnt
	QPAttrRNRRetry         QPAttrMask = uapi.QPAttrRNRRetry
	QPAttrRQPSN            QPAttrMask = uapi.QPAttrRQPSN
	QPAttrMaxQPRdAtomic    QPAttrMask = uapi.QPAttrMaxQPRdAtomic
	QPAttrMinRNRTimer      QPAttrMask = uapi.QPAttrMinRNRTimer
	QPAttrSQPSN            QPAttrMask = uapi.QPAttrSQPSN
	QPAttrMaxDestRdAtomic  QPAttrMask = uapi.QPAttrMaxDestRdAtomic
	QPAttrCap              QPAttrMask = uapi.QPAttrCap
	QPAttrDestQPN          QPAttrMask = uapi.QPAttrDestQPN

	// Masks of the RC transitions (required attributes).
	MaskRC2Init = QPAttrState | QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags
	MaskRC2RTR  = QPAttrState | QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer
	MaskRC2RTS  = QPAttrState | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrSQPSN | QPAttrMaxQPRdAtomic
)

// AddressVector is the path to the peer: on RoCE the GRH fields (IsGlobal is
// required); on InfiniBand DLID (with a GRH only across subnets).
type AddressVector struct {
	DGID         GID
	FlowLabel    uint32
	DLID         uint16
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	SL           uint8
	SrcPathBits  uint8
	StaticRate   uint8
	IsGlobal     bool
	Port         uint8
}

// QPAttr are QP attributes for Modify and from Query.
type QPAttr struct {
	State           QPState
	CurState        QPState
	PathMTU         MTU
	QKey            uint32
	RQPSN           PSN
	SQPSN           PSN
	DestQPN         QPN
	Access          Access
	PKeyIndex       uint16
	Port            uint8
	AV              AddressVector
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	Timeout         uint8 // 4.096 µs * 2^Timeout; 0 = infinite
	RetryCnt        uint8 // rxe treats 7 as infinite
	RNRRetry        uint8 // 7 = infinite
	Caps            QPCaps
	SQDraining      bool
	SignalAll       bool
	// EnSQDAsyncNotify asks for an EventSQDrained when a move to SQD completes.
	EnSQDAsyncNotify bool
}

func destToAV(d *uapi.QPDest) AddressVector {
	return AddressVector{DGID: d.DGID, FlowLabel: d.FlowLabel, DLID: d.DLID, SGIDIndex: d.SGIDIndex,
		HopLimit: d.HopLimit, TrafficClass: d.TrafficClass, SL: d.SL, SrcPathBits: d.SrcPathBits,
		StaticRate: d.StaticRate, IsGlobal: d.IsGlobal != 0, Port: d.PortNum}
}

func avToDest(a *AddressVector) uapi.QPDest {
	d := uapi.QPDest{DGID: a.DGID, FlowLabel: a.FlowLabel, DLID: a.DLID, SGIDIndex: a.SGIDIndex,
		HopLimit: a.HopLimit, TrafficClass: a.TrafficClass, SL: a.SL, SrcPathBits: a.SrcPathBits,
		StaticRate: a.StaticRate, PortNum: a.Port}
	if a.IsGlobal {
		d.IsGlobal = 1
	}
	return d
}

// Modify applies the attributes selected by mask (MODIFY_QP).
func (qp *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return ErrClosed
	}
	req := uapi.ModifyQP{
		Dest: avToDest(&attr.AV), QPHandle: uint32(qp.handle), AttrMask: uint32(mask), QKey: attr.QKey,
		RQPSN: uint32(attr.RQPSN), SQPSN: uint32(attr.SQPSN), DestQPNum: uint32(attr.DestQPN),
		QPAccessFlags: uint32(attr.Access), PKeyIndex: attr.PKeyIndex, QPState: uint8(attr.State),
		CurQPState: uint8(attr.CurState), PathMTU: uint8(attr.PathMTU), MaxRdAtomic: attr.MaxRdAtomic,
		MaxDestRdAtomic: attr.MaxDestRdAtomic, MinRNRTimer: attr.MinRNRTimer, PortNum: attr.Port,
		Timeout: attr.Timeout, RetryCnt: attr.RetryCnt, RNRRetry: attr.RNRRetry,
	}
	if attr.EnSQDAsyncNotify {
		req.EnSQDAsyncNotify = 1
	}
	c := qp.pd.ctx
	if err := c.file.Write(uapi.CmdModifyQP, ucmd.Bytes(&req), nil, nil, nil); err != nil {
		what := "modify_qp"
		if mask&QPAttrState != 0 {
			what = fmt.Sprintf("modify_qp %#x %s->%s (mask %#x)", uint32(qp.qpn), qp.State(), attr.State, uint32(mask))
		}
		return opErr(what, c.dev.Name, err)
	}
	if mask&QPAttrState != 0 {
		qp.stateChanged(attr.State)
	}
	return nil
}

// stateChanged records a transition the kernel made. A QP in RESET starts
// its queues over, so stale completions are cleaned from its CQs first.
func (qp *QP) stateChanged(s QPState) {
	qp.state.Store(uint32(s))
	if s == QPStateReset {
		qp.cleanCQs()
	}
	qp.drv.StateChanged(s)
}

// Query returns the QP's current attributes from the kernel and refreshes State.
func (qp *QP) Query() (QPAttr, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.closed {
		return QPAttr{}, ErrClosed
	}
	req := uapi.QueryQP{QPHandle: uint32(qp.handle), AttrMask: 0x1fffff}
	var r uapi.QueryQPResp
	c := qp.pd.ctx
	if err := c.file.Write(uapi.CmdQueryQP, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return QPAttr{}, opErr("query_qp", c.dev.Name, err)
	}
	a := QPAttr{
		State: QPState(r.QPState), CurState: QPState(r.CurQPState), PathMTU: MTU(r.PathMTU), QKey: r.QKey,
		RQPSN: PSN(r.RQPSN), SQPSN: PSN(r.SQPSN), DestQPN: QPN(r.DestQPNum), Access: Access(r.QPAccessFlags),
		PKeyIndex: r.PKeyIndex, Port: r.PortNum, AV: destToAV(&r.Dest), MaxRdAtomic: r.MaxRdAtomic,
		MaxDestRdAtomic: r.MaxDestRdAtomic, MinRNRTimer: r.MinRNRTimer, Timeout: r.Timeout,
		RetryCnt: r.RetryCnt, RNRRetry: r.RNRRetry, SQDraining: r.SQDraining != 0, SignalAll: r.SQSigAll != 0,
		Caps: QPCaps{MaxSendWR: r.MaxSendWR, MaxRecvWR: r.MaxRecvWR, MaxSendSGE: r.MaxSendSGE,
			MaxRecvSGE: r.MaxRecvSGE, MaxInlineData: r.MaxInlineData},
	}
	qp.state.Store(uint32(a.State))
	return a, nil
}

// ToInit moves a RESET QP to INIT on port with the responder access rights
// the peer gets (remote read/write/atomic).
func (qp *QP) ToInit(port uint8, access Access) error {
	return qp.Modify(&QPAttr{State: QPStateInit, Port: port, Access: access}, MaskRC2Init)
}

// ToErr moves the QP to ERR: every outstanding work request completes with
// WCWRFlushErr.
func (qp *QP) ToErr() error { return qp.Modify(&QPAttr{State: QPStateErr}, QPAttrState) }

// ToReset moves the QP to RESET, discarding queued work without completions.
func (qp *QP) ToReset() error { return qp.Modify(&QPAttr{State: QPStateReset}, QPAttrState) }

// Endpoint is what two RC QPs exchange out of band to connect.
type Endpoint struct {
	QPN QPN
	PSN PSN    // initial send PSN (24 bits)
	GID GID    // the GID the side sends from (RoCE; unused on InfiniBand)
	MTU MTU    // the side's port active MTU
	LID uint16 // the side's port LID (InfiniBand; 0 on RoCE)
}

// ConnectConfig drives Connect. Zero values take the defaults noted.
type ConnectConfig struct {
	Port            uint8 // local port (default 1)
	SGIDIndex       uint8 // local GID index, e.g. from FindRoCEv2GID (RoCE)
	LocalPSN        PSN   // our initial send PSN (give it to the peer)
	Remote          Endpoint
	Access          Access // responder rights; default remote write|read|atomic
	MTU             MTU    // default min(local active, Remote.MTU)
	Timeout         uint8  // default 14 (~67 ms)
	RetryCnt        uint8  // default 6 (7 would retry forever on rxe)
	RNRRetry        uint8  // default 7 (infinite)
	MinRNRTimer     uint8  // default 12 (0.64 ms)
	MaxRdAtomic     uint8  // default 16
	MaxDestRdAtomic uint8  // default 16
	TrafficClass    uint8  // RoCE
	HopLimit        uint8  // RoCE; default 64
	SL              uint8  // service level
}

// Connect brings an RC QP from RESET or INIT through RTR to RTS against the
// peer described by cfg.Remote. The path follows the port's link layer: on
// RoCE the peer is addressed by GID (a GRH from cfg.SGIDIndex); on
// InfiniBand by Remote.LID, without a GRH (the peer is in the same subnet).
func (qp *QP) Connect(cfg ConnectConfig) error {
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	pa, err := qp.pd.ctx.QueryPort(cfg.Port)
	if err != nil {
		return err
	}
	rtr, rts, err := connectAttrs(&cfg, &pa)
	if err != nil {
		return fmt.Errorf("uverbs: connect QP %#x: %w", uint32(qp.qpn), err)
	}
	if qp.State() == QPStateReset {
		if err := qp.ToInit(cfg.Port, cfg.Access); err != nil {
			return err
		}
	}
	if err := qp.Modify(&rtr, MaskRC2RTR); err != nil {
		return err
	}
	return qp.Modify(&rts, MaskRC2RTS)
}

// connectAttrs fills cfg's defaults for a QP on a port with attributes pa
// and returns the RTR and RTS attributes of an RC connection.
func connectAttrs(cfg *ConnectConfig, pa *PortAttr) (rtr, rts QPAttr, err error) {
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	if cfg.Access == 0 {
		cfg.Access = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	if cfg.MTU == 0 {
		cfg.MTU = pa.ActiveMTU
		if cfg.Remote.MTU != 0 && cfg.Remote.MTU < cfg.MTU {
			cfg.MTU = cfg.Remote.MTU
		}
	}
	def := func(v *uint8, d uint8) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.Timeout, 14)
	def(&cfg.RetryCnt, 6)
	def(&cfg.RNRRetry, 7)
	def(&cfg.MinRNRTimer, 12)
	def(&cfg.MaxRdAtomic, 16)
	def(&cfg.MaxDestRdAtomic, 16)
	def(&cfg.HopLimit, 64)
	av := AddressVector{SL: cfg.SL, Port: cfg.Port}
	if pa.LinkLayer == LinkLayerInfiniBand {
		if cfg.Remote.LID == 0 {
			return QPAttr{}, QPAttr{}, fmt.Errorf("InfiniBand port %d: the peer endpoint has no LID: %w", cfg.Port, ucmd.EINVAL)
		}
		av.DLID = cfg.Remote.LID
	} else {
		av.DGID, av.SGIDIndex, av.HopLimit, av.TrafficClass, av.IsGlobal = cfg.Remote.GID, cfg.SGIDIndex, cfg.HopLimit, cfg.TrafficClass, true
	}
	rtr = QPAttr{
		State: QPStateRTR, PathMTU: cfg.MTU, DestQPN: cfg.Remote.QPN, RQPSN: cfg.Remote.PSN & 0xffffff,
		MaxDestRdAtomic: cfg.MaxDestRdAtomic, MinRNRTimer: cfg.MinRNRTimer, AV: av,
	}
	rts = QPAttr{State: QPStateRTS, Timeout: cfg.Timeout, RetryCnt: cfg.RetryCnt, RNRRetry: cfg.RNRRetry,
		SQPSN: cfg.LocalPSN & 0xffffff, MaxRdAtomic: cfg.MaxRdAtomic}
	return rtr, rts, nil
}
