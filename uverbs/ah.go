package uverbs

import (
	"errors"
	"fmt"
	"sync"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// DriverAH is a provider's address handle (the destination of UD sends).
type DriverAH interface {
	// Request returns the driver input and output sizes of CREATE_AH.
	Request() (in []byte, outLen int)
	// Created receives the kernel handle and the driver output.
	Created(h Handle, out []byte) error
	// Destroyed releases provider resources after the kernel destroyed the AH.
	Destroyed() error
}

// AHCreator is implemented by DriverContexts that support UD address handles.
type AHCreator interface {
	NewAH(av AddressVector) (DriverAH, error)
}

// AH is an address handle: the path to one remote UD endpoint. Safe for
// concurrent use; SendWR.AH references it while a send is being posted.
type AH struct {
	pd     *PD
	drv    DriverAH
	handle Handle

	mu     sync.Mutex
	closed bool
}

// CreateAH creates an address handle for UD sends. On RoCE av must be global
// (IsGlobal) with the destination GID, the local SGID index and the port; the
// kernel resolves the destination MAC.
func (pd *PD) CreateAH(av AddressVector) (_ *AH, err error) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, ErrClosed
	}
	c := pd.ctx
	mk, ok := c.drv.(AHCreator)
	if !ok {
		return nil, fmt.Errorf("uverbs: create_ah on %s: %s provider: %w", c.dev.Name, c.prov.Name(), ErrNotSupported)
	}
	drv, err := mk.NewAH(av)
	if err != nil {
		return nil, fmt.Errorf("uverbs: create_ah on %s: %w", c.dev.Name, err)
	}
	defer func() {
		if err != nil {
			drv.Destroyed()
		}
	}()
	in, outLen := drv.Request()
	req := uapi.CreateAH{PDHandle: uint32(pd.handle), Attr: uapi.AHAttr{
		DGID: av.DGID, FlowLabel: av.FlowLabel, SGIDIndex: av.SGIDIndex, HopLimit: av.HopLimit,
		TrafficClass: av.TrafficClass, DLID: av.DLID, SL: av.SL, SrcPathBits: av.SrcPathBits,
		StaticRate: av.StaticRate, PortNum: av.Port,
	}}
	if av.IsGlobal {
		req.Attr.IsGlobal = 1
	}
	var r uapi.CreateAHResp
	out := make([]byte, outLen)
	if err := c.file.Write(uapi.CmdCreateAH, ucmd.Bytes(&req), in, ucmd.Bytes(&r), out); err != nil {
		return nil, opErr(fmt.Sprintf("create_ah(%s)", av.DGID), c.dev.Name, err)
	}
	ah := &AH{pd: pd, drv: drv, handle: Handle(r.AHHandle)}
	if err = drv.Created(ah.handle, out); err != nil {
		dr := uapi.DestroyAH{AHHandle: r.AHHandle}
		c.file.Write(uapi.CmdDestroyAH, ucmd.Bytes(&dr), nil, nil, nil)
		return nil, fmt.Errorf("uverbs: create_ah on %s: %w", c.dev.Name, err)
	}
	pd.ahs[ah] = struct{}{}
	track(ah, describe("AH", c.dev.Name, ah.handle))
	return ah, nil
}

// Driver returns the provider's side of the AH (providers read their
// destination data from it when posting UD sends).
func (ah *AH) Driver() DriverAH { return ah.drv }

// Handle returns the kernel handle.
func (ah *AH) Handle() Handle { return ah.handle }

// Close destroys the AH. Idempotent.
func (ah *AH) Close() error {
	if ah == nil {
		return nil
	}
	ah.mu.Lock()
	defer ah.mu.Unlock()
	if ah.closed {
		return nil
	}
	c := ah.pd.ctx
	req := uapi.DestroyAH{AHHandle: uint32(ah.handle)}
	if err := c.file.Write(uapi.CmdDestroyAH, ucmd.Bytes(&req), nil, nil, nil); err != nil && !errors.Is(err, ErrClosed) {
		return opErr("destroy_ah", c.dev.Name, err)
	}
	ah.closed = true
	ah.pd.mu.Lock()
	delete(ah.pd.ahs, ah)
	ah.pd.mu.Unlock()
	untrack(ah)
	return ah.drv.Destroyed()
}

// ActivateUD moves a RESET UD QP through INIT and RTR to RTS: it receives
// datagrams carrying qkey on port and sends starting at psn.
func (qp *QP) ActivateUD(port uint8, qkey uint32, psn PSN) error {
	if port == 0 {
		port = 1
	}
	if err := qp.Modify(&QPAttr{State: QPStateInit, Port: port, QKey: qkey},
		QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey); err != nil {
		return err
	}
	if err := qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState); err != nil {
		return err
	}
	return qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: psn & 0xffffff}, QPAttrState|QPAttrSQPSN)
}
