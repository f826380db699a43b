package rdma

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmago/te/uverbs"
)

// railVerbs is everything a rail does with its device: the seam between the
// rail's logic (slots, credits, endpoints, failover) and the verbs, so that
// logic runs in unit tests against a scripted fake (fakeverbs_test.go). The
// real one, devVerbs, is a context, PD, completion channel and CQ of
// package uverbs.
//
// Poll, Arm and every QP method but PostSend's data are called by the
// rail's owner goroutine only (QPs are created, moved and destroyed through
// it: see rail.call), so no other goroutine takes the CQ's single-owner
// guard; WaitEvent by the rail's event goroutine; Events by its port
// watcher; RegMR from any goroutine.
type railVerbs interface {
	// Name is the device's name (rxe0, mlx5_2).
	Name() string
	// NUMANode is the device's NUMA node (-1: unknown).
	NUMANode() int
	// Port is the port the rail uses, with its GID and limits.
	Port() uverbs.RCPort
	// PortState reads the port's state (after a failure a dead link
	// explains, before its async event arrives).
	PortState() (uverbs.PortState, error)
	// Events delivers the device's async events; it is closed by Close.
	Events() <-chan uverbs.AsyncEvent
	// RegMR registers b for local write and remote read and write.
	RegMR(b []byte) (memReg, error)
	// CQEntries is the capacity of the rail's CQ.
	CQEntries() int
	// CreateQP creates an RC QP on the rail's CQ, with a send queue of
	// sendDepth work requests and a receive queue of recvDepth (at least
	// one), in the INIT state.
	CreateQP(sendDepth, recvDepth int) (railQP, error)
	// Poll fills wc with completions and returns their number; it does
	// not block.
	Poll(wc []uverbs.WC) (int, error)
	// Arm asks for an event on the next completion.
	Arm() error
	// WaitEvent blocks until a completion event arrives; it fails once
	// the verbs are closed.
	WaitEvent() error
	// Close releases the CQ, channel, PD and context (every QP and MR
	// must be closed first). Idempotent.
	Close() error
}

// railQP is one RC QP of a rail.
type railQP interface {
	QPN() uverbs.QPN
	// SendDepth is the send queue depth the device granted.
	SendDepth() int
	// Connect moves the QP from INIT to RTS against remote.
	Connect(psn uverbs.PSN, remote uverbs.Endpoint, tune uverbs.ConnectConfig) error
	// PostSend posts wrs in order; see uverbs.QP.PostSend.
	PostSend(wrs []uverbs.SendWR) (int, error)
	// RecvDepth is the receive queue depth the device granted.
	RecvDepth() int
	// PostRecv posts receive buffers in order (any state but RESET); see
	// uverbs.QP.PostRecv.
	PostRecv(wrs []uverbs.RecvWR) (int, error)
	// ToErr moves the QP to the error state: what is posted flushes.
	ToErr() error
	// Close destroys the QP (idempotent).
	Close() error
}

// memReg is a registration of memory on one rail.
type memReg interface {
	LKey() uint32
	RKey() uint32
	Close() error
}

// openVerbs opens the rails' devices; Transport.open defaults to it (unit
// tests set fakes).
func openVerbs(cfg *Config) ([]railVerbs, error) {
	devs, err := findDevices(cfg)
	if err != nil {
		return nil, err
	}
	var out []railVerbs
	for _, d := range devs {
		v, err := openDevice(cfg, d)
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// findDevices resolves Config.Devices, or finds every device with an
// active port.
func findDevices(cfg *Config) ([]uverbs.Device, error) {
	if len(cfg.Devices) > 0 {
		var out []uverbs.Device
		for _, n := range cfg.Devices {
			d, err := cfg.Options.Lookup(n)
			if err != nil {
				return nil, fmt.Errorf("rdma: device %q: %w", n, err)
			}
			out = append(out, d)
		}
		return out, nil
	}
	all, err := cfg.Options.List()
	if err != nil {
		return nil, fmt.Errorf("rdma: list devices: %w", err)
	}
	var out []uverbs.Device
	for _, d := range all {
		if st, err := d.PortState(int(cfg.Port)); err == nil && st == uverbs.PortActive {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("rdma: no RDMA device with an active port %d (found %d devices; `te devices` says why)", cfg.Port, len(all))
	}
	return out, nil
}

// devVerbs is railVerbs on a real device.
type devVerbs struct {
	dev    uverbs.Device
	ctx    *uverbs.Context
	pd     *uverbs.PD
	ch     *uverbs.CompChannel
	cq     *uverbs.CQ
	port   uverbs.RCPort
	access uverbs.Access
}

func openDevice(cfg *Config, dev uverbs.Device) (_ *devVerbs, err error) {
	v := &devVerbs{dev: dev, access: uverbs.AccessLocalWrite | uverbs.AccessRemoteWrite | uverbs.AccessRemoteRead}
	if v.ctx, err = dev.Open(cfg.Options); err != nil {
		return nil, fmt.Errorf("rdma: open %s: %w", dev.Name, err)
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	gidx := -1 // RCPort chooses
	if cfg.GIDIndex != nil {
		gidx = *cfg.GIDIndex
	}
	if v.port, err = v.ctx.RCPort(cfg.Port, gidx); err != nil {
		return nil, fmt.Errorf("rdma: %s: %w", dev.Name, err)
	}
	if v.pd, err = v.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if v.ch, err = v.ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	depth := cfg.CQDepth
	if v.port.MaxCQE > 0 {
		depth = min(depth, v.port.MaxCQE)
	}
	if v.cq, err = v.ctx.CreateCQ(uverbs.CQConfig{Entries: depth, Channel: v.ch}); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *devVerbs) Name() string                     { return v.dev.Name }
func (v *devVerbs) NUMANode() int                    { return v.dev.NUMANode }
func (v *devVerbs) Port() uverbs.RCPort              { return v.port }
func (v *devVerbs) Events() <-chan uverbs.AsyncEvent { return v.ctx.Events() }
func (v *devVerbs) CQEntries() int                   { return v.cq.Entries() }
func (v *devVerbs) Poll(wc []uverbs.WC) (int, error) { return v.cq.Poll(wc) }
func (v *devVerbs) Arm() error                       { return v.cq.ReqNotify(false) }

func (v *devVerbs) PortState() (uverbs.PortState, error) { return v.dev.PortState(int(v.port.Num)) }

// WaitEvent waits with a context that is never done, because watching a
// cancellable one costs an allocation per wait; closing the channel ends
// it.
func (v *devVerbs) WaitEvent() error {
	_, err := v.ch.Wait(context.Background())
	return err
}

func (v *devVerbs) RegMR(b []byte) (memReg, error) {
	mr, err := v.pd.RegMR(b, v.access)
	if err != nil {
		return nil, err
	}
	return devMR{mr}, nil
}

func (v *devVerbs) CreateQP(sendDepth, recvDepth int) (railQP, error) {
	qp, err := v.pd.CreateQP(uverbs.QPConfig{SendCQ: v.cq, RecvCQ: v.cq,
		Caps: uverbs.QPCaps{MaxSendWR: uint32(sendDepth), MaxRecvWR: uint32(max(1, recvDepth)), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, fmt.Errorf("rdma: create QP on %s: %w", v.dev.Name, err)
	}
	if err := qp.ToInit(v.port.Num, v.access); err != nil {
		return nil, errors.Join(err, qp.Close())
	}
	return &devQP{qp: qp, port: &v.port}, nil
}

func (v *devVerbs) Close() error {
	var errs []error
	if v.cq != nil {
		errs = append(errs, v.cq.Close())
	}
	if v.ch != nil {
		errs = append(errs, v.ch.Close())
	}
	if v.pd != nil {
		errs = append(errs, v.pd.Close())
	}
	if v.ctx != nil {
		errs = append(errs, v.ctx.Close())
	}
	return errors.Join(errs...)
}

type devQP struct {
	qp   *uverbs.QP
	port *uverbs.RCPort
}

func (q *devQP) QPN() uverbs.QPN { return q.qp.QPN() }
func (q *devQP) SendDepth() int  { return int(q.qp.Caps().MaxSendWR) }
func (q *devQP) ToErr() error    { return q.qp.ToErr() }
func (q *devQP) Close() error    { return q.qp.Close() }

func (q *devQP) PostSend(wrs []uverbs.SendWR) (int, error) { return q.qp.PostSend(wrs) }
func (q *devQP) RecvDepth() int                            { return int(q.qp.Caps().MaxRecvWR) }
func (q *devQP) PostRecv(wrs []uverbs.RecvWR) (int, error) { return q.qp.PostRecv(wrs) }

func (q *devQP) Connect(psn uverbs.PSN, remote uverbs.Endpoint, tune uverbs.ConnectConfig) error {
	return q.port.Connect(q.qp, psn, remote, tune)
}

type devMR struct{ mr *uverbs.MR }

func (m devMR) LKey() uint32 { return uint32(m.mr.LKey()) }
func (m devMR) RKey() uint32 { return uint32(m.mr.RKey()) }
func (m devMR) Close() error { return m.mr.Close() }
