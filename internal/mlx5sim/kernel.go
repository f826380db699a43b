package mlx5sim

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/internal/dma"
	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/internal/unix"
	"github.com/rdmago/te/uverbs"
)

var le = binary.LittleEndian

// kctx is one open command file: a verbs context on a simulated device,
// answering the uverbs commands the way the kernel's mlx5 driver does.
// Its state is guarded by the fabric's lock.
type kctx struct {
	f        *Fabric
	dev      *device
	uar      *dma.Region // the UAR pages, served at their mmap offsets
	driverID atomic.Uint32
	asyncW   int // write end of the async-event pipe
	started  bool
	closed   bool

	nextHandle uint32
	pds        map[uint32]bool
	mrs        map[uint32]*mr // by handle
	cqs        map[uint32]*cq // by handle
	qps        map[uint32]*qp // by handle
	chans      map[int32]int  // completion channel read fd -> write fd
	chanW      []int
}

var _ uverbs.CommandFile = (*kctx)(nil)

// FD is the memfd holding the UAR pages: the provider maps them from it.
func (k *kctx) FD() int { return k.uar.FD() }

func (k *kctx) SetDriverID(id uint32) { k.driverID.Store(id) }

// WriteEx: no extended command is needed on the way to RC traffic.
func (k *kctx) WriteEx(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return unix.EOPNOTSUPP
}

// Close destroys what is still open, as the kernel does when the file is
// closed. Idempotent.
func (k *kctx) Close() error {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	for _, q := range k.qps {
		delete(f.qps, q.qpn)
	}
	for _, c := range k.cqs {
		delete(f.cqs, c.cqn)
	}
	for _, m := range k.mrs {
		delete(f.mrs, m.key)
	}
	k.qps, k.cqs, k.mrs = nil, nil, nil
	delete(f.ctxs, k)
	for _, w := range k.chanW {
		unix.Close(w)
	}
	if k.asyncW >= 0 {
		unix.Close(k.asyncW)
	}
	return k.uar.Unmap()
}

// readArmDoorbell takes the last CQ arm doorbell written to the context's
// UAR page and arms that CQ (an arm that repeats the previous arm record,
// such as the first arm at consumer index 0, shows only here).
func (k *kctx) readArmDoorbell() {
	b := k.uar.Bytes()
	if b == nil {
		return
	}
	v := atomic.SwapUint64(dma.View[uint64](b, uarCQDoorbell), 0)
	if v == 0 {
		return
	}
	v = bits.ReverseBytes64(v)
	// The same request shows in the arm record too: act on it once.
	if c := k.f.cqs[uint32(v)]; c != nil && c.k == k && (!c.armedOnce || uint32(v>>32) != c.lastArm) {
		c.arm(uint32(v >> 32))
	}
}

func (k *kctx) handle() uint32 {
	k.nextHandle++
	return k.nextHandle
}

// pipe makes a pipe and returns its ends (the read end for the context).
func pipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// Write answers a legacy write() command.
func (k *kctx) Write(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if k.closed {
		return ucmd.ErrClosed
	}
	defer f.kick()
	switch cmd {
	case uapi.CmdGetContext:
		return k.getContext(drvIn, resp, drvOut)
	case uapi.CmdQueryDevice:
		r := uapi.QueryDeviceResp{FWVer: 22<<32 | 39<<16 | 1010, NodeGUID: bits.ReverseBytes64(0xe41d2d0300000001 | uint64(k.dev.idx)<<16),
			MaxMRSize: 1 << 46, PageSizeCap: ^uint64(0xfff), VendorID: 0x02c9, VendorPartID: 4125, MaxQP: 1 << 18,
			MaxQPWR: 1 << 15, MaxSGE: 30, MaxSGERd: 30, MaxCQ: 1 << 24, MaxCQE: 1<<22 - 1, MaxMR: 1 << 24, MaxPD: 1 << 24,
			MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, MaxResRdAtom: 1 << 22, MaxPKeys: 128, LocalCAAckDelay: 16, PhysPortCnt: 1}
		copy(resp, ucmd.Bytes(&r))
	case uapi.CmdQueryPort:
		var q uapi.QueryPort
		copy(ucmd.Bytes(&q), req)
		if q.PortNum != 1 {
			return unix.EINVAL
		}
		state, phys := uverbs.PortActive, uint8(5) // LinkUp
		if k.dev.down {
			state, phys = uverbs.PortDown, 3 // Disabled
		}
		r := uapi.QueryPortResp{PortCapFlags: 1 << 26, MaxMsgSz: 1 << 30, GIDTblLen: 256, PKeyTblLen: 1,
			State: uint8(state), MaxMTU: uint8(uverbs.MTU4096), ActiveMTU: uint8(uverbs.MTU1024),
			ActiveWidth: 2, ActiveSpeed: 32, PhysState: phys, LinkLayer: uint8(uverbs.LinkLayerEthernet)}
		copy(resp, ucmd.Bytes(&r))
	case uapi.CmdAllocPD:
		h := k.handle()
		k.pds[h] = true
		r := uapi.AllocPDResp{PDHandle: h}
		copy(resp, ucmd.Bytes(&r))
		d := abi.AllocPDResp{PDN: h}
		copy(drvOut, abi.Bytes(&d))
	case uapi.CmdDeallocPD:
		var q uapi.DeallocPD
		copy(ucmd.Bytes(&q), req)
		if !k.pds[q.PDHandle] {
			return unix.EINVAL
		}
		for _, m := range k.mrs {
			if m.pd == q.PDHandle {
				return fmt.Errorf("%w: PD %d has MRs", errBusy, q.PDHandle)
			}
		}
		for _, x := range k.qps {
			if x.pd == q.PDHandle {
				return fmt.Errorf("%w: PD %d has QPs", errBusy, q.PDHandle)
			}
		}
		delete(k.pds, q.PDHandle)
	case uapi.CmdRegMR:
		return k.regMR(req, resp)
	case uapi.CmdDeregMR:
		var q uapi.DeregMR
		copy(ucmd.Bytes(&q), req)
		m := k.mrs[q.MRHandle]
		if m == nil {
			return unix.EINVAL
		}
		delete(k.mrs, q.MRHandle)
		delete(f.mrs, m.key)
	case uapi.CmdCreateCompChannel:
		r, w, err := pipe()
		if err != nil {
			return err
		}
		k.chans[int32(r)] = w
		k.chanW = append(k.chanW, w)
		out := uapi.CreateCompChannelResp{FD: uint32(r)}
		copy(resp, ucmd.Bytes(&out))
	case uapi.CmdCreateCQ:
		return k.createCQ(req, drvIn, resp, drvOut)
	case uapi.CmdDestroyCQ:
		var q uapi.DestroyCQ
		copy(ucmd.Bytes(&q), req)
		c := k.cqs[q.CQHandle]
		if c == nil {
			return unix.EINVAL
		}
		if c.nqps > 0 {
			return fmt.Errorf("%w: CQ %d has %d QPs", errBusy, q.CQHandle, c.nqps)
		}
		delete(k.cqs, q.CQHandle)
		delete(f.cqs, c.cqn)
		clear(resp)
	case uapi.CmdCreateQP:
		return k.createQP(req, drvIn, resp, drvOut)
	case uapi.CmdModifyQP:
		return k.modifyQP(req)
	case uapi.CmdDestroyQP:
		var q uapi.DestroyQP
		copy(ucmd.Bytes(&q), req)
		x := k.qps[q.QPHandle]
		if x == nil {
			return unix.EINVAL
		}
		delete(k.qps, q.QPHandle)
		delete(f.qps, x.qpn)
		x.scq.nqps--
		x.rcq.nqps--
		clear(resp)
	default:
		return unix.EOPNOTSUPP
	}
	return nil
}

// getContext answers GET_CONTEXT with mlx5's context: CQE version 1, 16
// static bfregs (4 low-latency) on 4 KiB UARs, one UAR per page.
func (k *kctx) getContext(drvIn, resp, drvOut []byte) error {
	if k.started {
		return unix.EINVAL
	}
	var in abi.AllocUcontextReqV2
	copy(abi.Bytes(&in), drvIn)
	if in.MaxCQEVersion < 1 || in.TotalNumBFRegs > totalBFRegs*8 {
		return unix.EINVAL
	}
	r, w, err := pipe()
	if err != nil {
		return err
	}
	k.started, k.asyncW = true, w
	out := uapi.GetContextResp{AsyncFD: uint32(r), NumCompVectors: 8}
	copy(resp, ucmd.Bytes(&out))
	d := abi.AllocUcontextResp{QPTabSize: 1 << 18, BFRegSize: bfRegSize, TotBFRegs: totalBFRegs, CacheLineSize: 64,
		MaxSQDescSz: 512, MaxRQDescSz: 512, MaxSendWQEBB: 1 << 15, MaxRecvWR: 1 << 15, MaxSRQRecvWR: 1 << 15,
		NumPorts: 1, CQEVersion: 1, LogUARSize: 12, NumUARsPerPage: 1, ResponseLength: abi.SizeAllocUcontextResp}
	copy(drvOut, abi.Bytes(&d))
	return nil
}

func (k *kctx) regMR(req, resp []byte) error {
	f := k.f
	var q uapi.RegMR
	copy(ucmd.Bytes(&q), req)
	if !k.pds[q.PDHandle] || q.Length == 0 || q.HCAVA != q.Start {
		return unix.EINVAL
	}
	if q.AccessFlags&accessRemoteWrite != 0 && q.AccessFlags&accessLocalWrite == 0 {
		return unix.EINVAL
	}
	f.nextKey += 0x100
	m := &mr{k: k, handle: k.handle(), key: f.nextKey | 0x42, pd: q.PDHandle, addr: q.Start, length: q.Length, access: q.AccessFlags}
	k.mrs[m.handle] = m
	f.mrs[m.key] = m
	r := uapi.RegMRResp{MRHandle: m.handle, LKey: m.key, RKey: m.key}
	copy(resp, ucmd.Bytes(&r))
	return nil
}

func (k *kctx) createCQ(req, drvIn, resp, drvOut []byte) error {
	f := k.f
	var q uapi.CreateCQ
	copy(ucmd.Bytes(&q), req)
	var d abi.CreateCQ
	copy(abi.Bytes(&d), drvIn)
	n := uint32(1) << bits.Len32(q.CQE) // cqe+1 rounded up to a power of two
	if q.CQE == 0 || n > 1<<22 || d.CQESize != cqeSize || d.BufAddr == 0 || d.DBAddr == 0 || d.Flags != 0 {
		return unix.EINVAL
	}
	c := &cq{k: k, handle: k.handle(), uh: q.UserHandle, cnt: n, chW: -1, n: &k.dev.n,
		buf: dma.At(d.BufAddr, int(n)*cqeSize), rec: dma.At(d.DBAddr, 8)}
	if q.CompChannel >= 0 {
		w, ok := k.chans[q.CompChannel]
		if !ok {
			return unix.EINVAL
		}
		c.chW = w
	}
	f.nextCQN++
	c.cqn = f.nextCQN
	c.lastArm = record(c.rec, cqRecArm)
	k.cqs[c.handle] = c
	f.cqs[c.cqn] = c
	r := uapi.CreateCQResp{CQHandle: c.handle, CQE: n - 1}
	copy(resp, ucmd.Bytes(&r))
	dr := abi.CreateCQResp{CQN: c.cqn}
	copy(drvOut, abi.Bytes(&dr))
	return nil
}

func (k *kctx) createQP(req, drvIn, resp, drvOut []byte) error {
	f := k.f
	var q uapi.CreateQP
	copy(ucmd.Bytes(&q), req)
	var d abi.CreateQP
	copy(abi.Bytes(&d), drvIn)
	scq, rcq := k.cqs[q.SendCQHandle], k.cqs[q.RecvCQHandle]
	switch {
	case !k.pds[q.PDHandle] || scq == nil || rcq == nil || q.QPType != uint8(uverbs.QPTypeRC) || q.IsSRQ != 0:
		return unix.EINVAL
	case len(drvIn) < abi.CreateQPMinLen || d.BufAddr == 0 || d.DBAddr == 0 || d.Flags != 0:
		return unix.EINVAL
	case d.SQWQECount == 0 || d.SQWQECount&(d.SQWQECount-1) != 0 || d.RQWQECount&(d.RQWQECount-1) != 0 || d.RQWQEShift < 4:
		return unix.EINVAL
	}
	for _, x := range k.qps {
		if x.uidx == d.UIdx {
			return unix.EINVAL // the provider hands out each user index once
		}
	}
	rqBytes := int(d.RQWQECount) << d.RQWQEShift
	buf := dma.At(d.BufAddr, rqBytes+int(d.SQWQECount)*wqebb)
	x := &qp{k: k, handle: k.handle(), uidx: d.UIdx, pd: q.PDHandle, rq: buf[:rqBytes:rqBytes], sq: buf[rqBytes:],
		sqCnt: d.SQWQECount, rqCnt: d.RQWQECount, rqShift: d.RQWQEShift, rec: dma.At(d.DBAddr, 8), scq: scq, rcq: rcq,
		retry: uverbs.RetryBound(uverbs.HardwareRCDefaults.Timeout, uverbs.HardwareRCDefaults.RetryCnt), rnrRetry: 7}
	f.nextQPN++
	x.qpn = f.nextQPN
	k.qps[x.handle] = x
	f.qps[x.qpn] = x
	scq.nqps++
	rcq.nqps++
	r := uapi.CreateQPResp{QPHandle: x.handle, QPN: x.qpn, MaxSendWR: q.MaxSendWR, MaxRecvWR: q.MaxRecvWR,
		MaxSendSGE: q.MaxSendSGE, MaxRecvSGE: q.MaxRecvSGE, MaxInlineData: q.MaxInlineData}
	copy(resp, ucmd.Bytes(&r))
	dr := abi.CreateQPResp{BFRegIndex: bfregIndex}
	copy(drvOut, abi.Bytes(&dr))
	return nil
}

// modifyQP moves a QP through RESET, INIT, RTR (where it learns its
// peer's QPN), RTS and ERR.
func (k *kctx) modifyQP(req []byte) error {
	var m uapi.ModifyQP
	copy(ucmd.Bytes(&m), req)
	x := k.qps[m.QPHandle]
	if x == nil {
		return unix.EINVAL
	}
	if m.AttrMask&uapi.QPAttrState == 0 {
		return nil
	}
	to := m.QPState
	ok := false
	switch to {
	case stateReset, stateErr:
		ok = true
	case stateInit:
		ok = x.state == stateReset || x.state == stateInit
	case stateRTR:
		ok = x.state == stateInit && m.AttrMask&uapi.QPAttrDestQPN != 0
	case stateRTS:
		ok = x.state == stateRTR || x.state == stateRTS
	}
	if !ok {
		return unix.EINVAL
	}
	switch to {
	case stateReset:
		x.sqPI, x.rqCI, x.held, x.released, x.remote = 0, 0, false, false, 0
		x.failAt, x.rnrAt = time.Time{}, time.Time{}
	case stateRTR:
		x.remote = m.DestQPNum
	}
	if m.AttrMask&uapi.QPAttrRNRRetry != 0 {
		x.rnrRetry = min(m.RNRRetry, 7)
	}
	if m.AttrMask&(uapi.QPAttrTimeout|uapi.QPAttrRetryCnt) == uapi.QPAttrTimeout|uapi.QPAttrRetryCnt {
		x.retry = uverbs.RetryBound(m.Timeout, m.RetryCnt)
		if m.Timeout == 0 { // no ACK timeout: retransmits forever
			x.retry = time.Duration(1<<63 - 1)
		}
	}
	x.state = to
	return nil
}

// Ioctl answers QUERY_GID_TABLE; every other method is missing
// (EPROTONOSUPPORT), so the core uses the write() commands.
func (k *kctx) Ioctl(object, method uint16, build func(*ucmd.Builder), read func(*ucmd.Builder)) error {
	if object != uapi.ObjectDevice || method != uapi.MethodQueryGIDTable {
		return ucmd.EPROTONOSUPPORT
	}
	buf := make([]byte, 64<<10)
	b := ucmd.NewBuilder(buf, 0x7000_0000, k.driverID.Load(), object, method)
	build(b)
	if _, err := b.Finish(); err != nil {
		return err
	}
	var ents, num []byte
	esz := 0
	for i := range int(le.Uint16(buf[6:])) {
		a := buf[24+16*i:]
		switch le.Uint16(a) {
		case uapi.AttrQueryGIDTableEntrySize:
			esz = int(le.Uint64(a[8:]))
		case uapi.AttrQueryGIDTableRespEntries:
			ents = b.Output(i)
		case uapi.AttrQueryGIDTableRespNumEntries:
			num = b.Output(i)
		}
	}
	e := uapi.GIDEntry{GIDIndex: GIDIndex, PortNum: 1, GIDType: uint32(uverbs.GIDTypeRoCEv2)}
	eb := ucmd.Bytes(&e)
	if esz < len(eb) || len(ents) < esz || len(num) != 8 {
		return unix.EINVAL
	}
	k.f.mu.Lock()
	copy(e.GID[:], k.dev.gid[:])
	k.f.mu.Unlock()
	copy(ents, eb)
	le.PutUint64(num, 1)
	if read != nil {
		read(b)
	}
	return nil
}
