package perftest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/rdmago/te/uverbs"
)

// Info is one end's connection data.
type Info struct {
	QPN  uint32     `json:"qpn"`
	PSN  uint32     `json:"psn"`
	GID  uverbs.GID `json:"gid"`
	MTU  uint8      `json:"mtu"`           // active MTU enum of the port
	LID  uint16     `json:"lid,omitempty"` // InfiniBand ports
	Addr uint64     `json:"addr"`
	RKey uint32     `json:"rkey"`
	// OutReads is the RDMA READs this end accepts in flight as responder
	// (perftest's out_reads); 0 from te peers, which use the device's.
	OutReads int `json:"out_reads,omitempty"`
}

// end is one side: its own context on its own device.
type end struct {
	name string
	ctx  *uverbs.Context
	pd   *uverbs.PD
	ch   *uverbs.CompChannel // bandwidth tests that wait on completion events
	cq   *uverbs.CQ
	qp   *uverbs.QP
	// mr: [0,region) the peer writes/reads here; [region,2region) local source/sink
	mr        *uverbs.MR
	region    int
	port      uverbs.RCPort // GID, MTU, READ depths, provider defaults
	psn       uverbs.PSN
	p         Params
	wc        []uverbs.WC
	recvDepth int // receive queue size
	// early counts peer messages of the send-latency test that arrived
	// before this side finished the previous exchange.
	early int
	// preemptPerS: the process's thread preemptions per second during
	// the latency loop.
	preemptPerS float64
}

// Probe opens dev and its port's GID the way a test will, so a server
// fails before it waits for a client.
func Probe(dev Device, opts *uverbs.Options) error {
	c, err := uverbs.Open(dev.Name, opts)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.RCPort(uint8(dev.Port), dev.GIDIndex)
	return err
}

func openEnd(dev Device, p Params, opts *uverbs.Options) (_ *end, err error) {
	e := &end{name: dev.Name, p: p, psn: uverbs.PSN(rand.Uint32() & 0xffffff), wc: make([]uverbs.WC, 64),
		region: max(p.Size, p.Region)}
	if e.ctx, err = uverbs.Open(dev.Name, opts); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	// The port as the RDMA transport prepares it: GID (-x, or the first
	// RoCE v2 IPv4 one), as many RDMA READs in flight as the device takes
	// (perftest does the same), the provider's ACK timeout.
	if e.port, err = e.ctx.RCPort(uint8(dev.Port), dev.GIDIndex); err != nil {
		return nil, err
	}
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return nil, err
	}
	soft := e.ctx.Device().DriverID == uverbs.DriverRXE
	depth := p.Depth
	e.recvDepth = depth
	if p.Op == OpSend {
		// receives run out before sends do: keep plenty posted, or the sender
		// stalls on receiver-not-ready NAKs
		e.recvDepth = max(512, 2*depth)
	}
	if p.Test == TestLat {
		depth, e.recvDepth = 4, 4
	}
	cqc := uverbs.CQConfig{Entries: depth + e.recvDepth + 16}
	if p.Test == TestBW && (p.CQ == "event" || (p.CQ == "auto" || p.CQ == "") && soft) {
		if e.ch, err = e.ctx.CreateCompChannel(); err != nil {
			return nil, err
		}
		cqc.Channel, cqc.SpinPolls = e.ch, p.Spin
	}
	if e.cq, err = e.ctx.CreateCQ(cqc); err != nil {
		return nil, err
	}
	access := uverbs.AccessLocalWrite | uverbs.AccessRemoteWrite | uverbs.AccessRemoteRead
	if e.mr, err = e.pd.AllocMR(2*e.region, access); err != nil {
		return nil, err
	}
	if e.qp, err = e.pd.CreateQP(uverbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq,
		Caps: uverbs.QPCaps{MaxSendWR: uint32(depth), MaxRecvWR: uint32(e.recvDepth), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: uint32(p.InlineSize())}}); err != nil {
		return nil, err
	}
	if err := e.qp.ToInit(e.port.Num, access); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *end) info() Info {
	ep := e.port.Endpoint(e.qp, e.psn)
	return Info{QPN: uint32(ep.QPN), PSN: uint32(ep.PSN), GID: ep.GID, MTU: uint8(ep.MTU), LID: ep.LID,
		Addr: e.mr.Addr(), RKey: uint32(e.mr.RKey()), OutReads: int(max(1, e.port.MaxDestRdAtomic))}
}

func (e *end) connect(peer Info) error {
	remote := uverbs.Endpoint{QPN: uverbs.QPN(peer.QPN), PSN: uverbs.PSN(peer.PSN), GID: peer.GID, MTU: uverbs.MTU(peer.MTU), LID: peer.LID}
	cfg := uverbs.ConnectConfig{MTU: MTUEnum(e.p.MTU), Timeout: uint8(e.p.QPTimeout)}
	if peer.OutReads > 0 { // never more READs in flight than the responder takes
		cfg.MaxRdAtomic = uint8(min(peer.OutReads, int(max(1, e.port.MaxRdAtomic))))
	}
	return e.port.Connect(e.qp, e.psn, remote, cfg)
}

func (e *end) pathMTU(peer Info) int {
	if e.p.MTU != 0 {
		return e.p.MTU
	}
	if peer.MTU == 0 {
		return e.port.Attr.ActiveMTU.Bytes()
	}
	return min(e.port.Attr.ActiveMTU, uverbs.MTU(peer.MTU)).Bytes()
}

// Close releases everything; safe on a partly opened end.
func (e *end) Close() error {
	if e == nil || e.ctx == nil {
		return nil
	}
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
	}
	if e.ch != nil {
		errs = append(errs, e.ch.Close())
	}
	if e.mr != nil {
		errs = append(errs, e.mr.Close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	errs = append(errs, e.ctx.Close())
	e.ctx = nil
	return errors.Join(errs...)
}

// poll returns at least one completion, busy-polling (what perftest does) or,
// with a completion channel, sleeping on it; it fails on an error completion
// or when ctx ends.
func (e *end) poll(ctx context.Context) ([]uverbs.WC, error) {
	for spins := 0; ; spins++ {
		var n int
		var err error
		if e.ch != nil {
			n, err = e.cq.Wait(ctx, e.wc)
		} else {
			n, err = e.cq.Poll(e.wc)
		}
		if err != nil {
			return nil, err
		}
		if n > 0 {
			for i := range e.wc[:n] {
				if err := e.wc[i].Err(); err != nil {
					return nil, fmt.Errorf("%s: %w", e.name, err)
				}
			}
			return e.wc[:n], nil
		}
		if spins&0xffff == 0xffff && ctx.Err() != nil {
			return nil, fmt.Errorf("%s: waiting for completions: %w", e.name, ctx.Err())
		}
	}
}

func (e *end) postRecvs(n int) error {
	wr := []uverbs.RecvWR{{ID: 1, SGL: []uverbs.SGE{e.mr.SGE(0, e.p.Size)}}}
	for i := 0; i < n; i++ {
		if _, err := e.qp.PostRecv(wr); err != nil {
			return fmt.Errorf("%s: post_recv: %w", e.name, err)
		}
	}
	return nil
}

// src is the local source (or RDMA READ sink) of one message.
func (e *end) src() uverbs.SGE { return e.mr.SGE(e.region, e.p.Size) }

func opcode(op string) uverbs.WROpcode {
	switch op {
	case OpRead:
		return uverbs.WRRDMARead
	case OpSend:
		return uverbs.WRSend
	}
	return uverbs.WRRDMAWrite
}
