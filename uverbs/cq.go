package uverbs

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// CompChannel delivers completion events of the CQs attached to it. Its fd
// is non-blocking and waited on through the Go netpoller, so a waiting
// goroutine does not hold an OS thread. Safe for concurrent use; one waiter
// at a time is the intended pattern.
type CompChannel struct {
	ctx *Context
	f   *ucmd.EventFile

	mu     sync.Mutex
	closed bool
	ncqs   int

	// waitMu serializes waiters over buf, which a local would not do: it
	// escapes through the read and would cost an allocation per event.
	waitMu sync.Mutex
	buf    [8]byte
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	req := uapi.CreateCompChannel{}
	var r uapi.CreateCompChannelResp
	if err := c.file.Write(uapi.CmdCreateCompChannel, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return nil, opErr("create_comp_channel", c.dev.Name, err)
	}
	f, err := ucmd.NewEventFile(int(r.FD), c.dev.Name+"-comp")
	if err != nil {
		return nil, err
	}
	ch := &CompChannel{ctx: c, f: f}
	c.channels[ch] = struct{}{}
	track(ch, "CompChannel on "+c.dev.Name)
	return ch, nil
}

// Wait blocks until a completion event arrives or ctx is done, and returns
// the CQ it is for. The event is acknowledged (the CQ must be re-armed with
// ReqNotify to get another one).
func (ch *CompChannel) Wait(ctx context.Context) (*CQ, error) {
	ch.waitMu.Lock()
	defer ch.waitMu.Unlock()
	buf := ch.buf[:]
	for {
		n, err := ch.f.Read(ctx, buf)
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return nil, ErrClosed
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("uverbs: read completion event: %w", err)
		}
		if n < 8 {
			continue
		}
		uh := le.Uint64(buf)
		ch.ctx.mu.Lock()
		cq := ch.ctx.cqs[uh]
		ch.ctx.mu.Unlock()
		if cq == nil {
			continue // its CQ was destroyed meanwhile
		}
		cq.drv.EventConsumed()
		cq.compEvents.Add(1)
		return cq, nil
	}
}

// Close closes the channel. It fails with ErrBusy while CQs use it. Idempotent.
func (ch *CompChannel) Close() error {
	if ch == nil {
		return nil
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil
	}
	if ch.ncqs > 0 {
		return fmt.Errorf("uverbs: close completion channel: %d CQs attached: %w", ch.ncqs, ErrBusy)
	}
	ch.closed = true
	err := ch.f.Close()
	ch.ctx.mu.Lock()
	delete(ch.ctx.channels, ch)
	ch.ctx.mu.Unlock()
	untrack(ch)
	return err
}

// CQConfig describes a completion queue.
type CQConfig struct {
	Entries    int          // minimum capacity (required)
	Channel    *CompChannel // optional: completion events go here
	CompVector int          // < Context.NumCompVectors()
	// SpinPolls is how many empty polls Wait spends before it arms the CQ
	// and sleeps on the channel (0: arm at once). Spinning trades CPU for
	// latency.
	SpinPolls int
}

// CQ is a completion queue. Poll, ReqNotify and Wait belong to one owner
// goroutine (concurrent use returns ErrConcurrent); Close may be called from
// anywhere.
type CQ struct {
	ctx     *Context
	drv     DriverCQ
	handle  Handle
	uh      uint64
	entries int
	ch      *CompChannel
	spin    int

	busy       atomic.Bool // single-owner guard of the data path
	dead       atomic.Bool
	compEvents atomic.Uint64

	mu     sync.Mutex
	closed bool
	nqps   int
}

// CreateCQ creates a completion queue (ioctl CQ_CREATE, falling back to the
// write command on kernels without it).
func (c *Context) CreateCQ(cfg CQConfig) (_ *CQ, err error) {
	if cfg.Entries <= 0 {
		return nil, fmt.Errorf("uverbs: create_cq: %d entries: %w", cfg.Entries, ucmd.EINVAL)
	}
	if max := c.limits.MaxCQE; max > 0 && uint64(cfg.Entries) > uint64(max) {
		return nil, fmt.Errorf("uverbs: create_cq: %d entries exceed %s's limit of %d: %w", cfg.Entries, c.dev.Name, max, ucmd.EINVAL)
	}
	if cfg.Channel != nil {
		cfg.Channel.mu.Lock()
		defer cfg.Channel.mu.Unlock()
		if cfg.Channel.closed {
			return nil, fmt.Errorf("uverbs: create_cq: channel: %w", ErrClosed)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	drv, err := c.drv.NewCQ(DriverCQConfig{Entries: cfg.Entries, Limits: c.limits})
	if err != nil {
		return nil, fmt.Errorf("uverbs: create_cq on %s: %w", c.dev.Name, err)
	}
	defer func() {
		if err != nil {
			drv.Destroyed()
		}
	}()
	cqe, in, outLen := drv.Request()
	uh := c.userHandle()
	chfd := int32(-1)
	if cfg.Channel != nil {
		chfd = int32(cfg.Channel.f.Fd())
	}
	var handle, gotCQE uint32
	var iHandle, iCQE, iOut int
	out := make([]byte, outLen)
	err = c.ioctls.run(uapi.ObjectCQ, uapi.MethodCQCreate, func() error {
		return c.file.Ioctl(uapi.ObjectCQ, uapi.MethodCQCreate, func(b *ucmd.Builder) {
			iHandle = b.NewIDR(uapi.AttrCreateCQHandle, uapi.AttrFMandatory)
			b.InU32(uapi.AttrCreateCQCQE, cqe, uapi.AttrFMandatory)
			b.InU64(uapi.AttrCreateCQUserHandle, uh, uapi.AttrFMandatory)
			if chfd >= 0 {
				b.FD(uapi.AttrCreateCQCompChannel, chfd, uapi.AttrFMandatory)
			}
			b.InU32(uapi.AttrCreateCQCompVector, uint32(cfg.CompVector), uapi.AttrFMandatory)
			iCQE = b.Out(uapi.AttrCreateCQRespCQE, 4, uapi.AttrFMandatory)
			b.UHWIn(in)
			iOut = b.UHWOut(outLen)
		}, func(b *ucmd.Builder) {
			handle = uint32(b.Data(iHandle))
			gotCQE = le.Uint32(b.Output(iCQE))
			copy(out, b.Output(iOut))
		})
	})
	if noIoctl(err) {
		req := uapi.CreateCQ{UserHandle: uh, CQE: cqe, CompVector: uint32(cfg.CompVector), CompChannel: chfd}
		var r uapi.CreateCQResp
		err = c.file.Write(uapi.CmdCreateCQ, ucmd.Bytes(&req), in, ucmd.Bytes(&r), out)
		handle, gotCQE = r.CQHandle, r.CQE
	}
	if err != nil {
		return nil, opErr(fmt.Sprintf("create_cq(%d entries)", cfg.Entries), c.dev.Name, err)
	}
	cq := &CQ{ctx: c, drv: drv, handle: Handle(handle), uh: uh, entries: int(gotCQE), ch: cfg.Channel, spin: cfg.SpinPolls}
	if err = drv.Created(cq.handle, gotCQE, out); err != nil {
		c.destroyCQ(cq.handle)
		return nil, fmt.Errorf("uverbs: create_cq on %s: %w", c.dev.Name, err)
	}
	if cfg.Channel != nil {
		cfg.Channel.ncqs++
	}
	c.cqs[uh] = cq
	track(cq, describe("CQ", c.dev.Name, cq.handle))
	return cq, nil
}

// useIoctl selects the ioctl methods where both channels exist; tests turn
// it off to exercise the write() fallback on a kernel that has both.
var useIoctl = true

// noIoctl reports whether an ioctl failed because the kernel lacks the
// method (then the legacy write() command does the job).
func noIoctl(err error) bool {
	return errors.Is(err, ucmd.ENOTTY) || errors.Is(err, ucmd.EPROTONOSUPPORT)
}

// ioctlProbe remembers which ioctl methods a context's kernel lacks: the
// first call that finds one missing (ENOTTY: no ioctl channel at all,
// EPROTONOSUPPORT: not this object or method) is the last to try it, and
// every later call goes straight to the write() command.
type ioctlProbe struct {
	none    atomic.Bool // ENOTTY: the kernel has no verbs ioctl channel
	mu      sync.Mutex
	missing map[uint32]bool // object<<16 | method
}

// run calls ioctl unless the method is known to be missing, in which case
// (or when ioctl reports it missing now) it returns an error for which
// noIoctl is true.
func (p *ioctlProbe) run(object, method uint16, ioctl func() error) error {
	key := uint32(object)<<16 | uint32(method)
	if !useIoctl || p.none.Load() {
		return ucmd.ENOTTY
	}
	p.mu.Lock()
	known := p.missing[key]
	p.mu.Unlock()
	if known {
		return ucmd.EPROTONOSUPPORT
	}
	err := ioctl()
	switch {
	case errors.Is(err, ucmd.ENOTTY):
		p.none.Store(true)
	case errors.Is(err, ucmd.EPROTONOSUPPORT):
		p.mu.Lock()
		if p.missing == nil {
			p.missing = map[uint32]bool{}
		}
		p.missing[key] = true
		p.mu.Unlock()
	}
	return err
}

// destroyObject destroys the object of handle h: the ioctl method (object,
// method; the handle in attribute hAttr, a response of len(resp) bytes in
// respAttr) where the kernel has it, else the legacy write() command cmd
// with request req and response resp.
func (c *Context) destroyObject(object, method, hAttr, respAttr uint16, h Handle, cmd uint32, req, resp []byte) error {
	err := c.ioctls.run(object, method, func() error {
		return c.file.Ioctl(object, method, func(b *ucmd.Builder) {
			b.IDR(hAttr, uint32(h), uapi.AttrFMandatory)
			b.Out(respAttr, len(resp), uapi.AttrFMandatory)
		}, nil)
	})
	if noIoctl(err) {
		err = c.file.Write(cmd, req, nil, resp, nil)
	}
	return err
}

func (c *Context) destroyCQ(h Handle) error {
	req := uapi.DestroyCQ{CQHandle: uint32(h)}
	var r uapi.DestroyCQResp
	return c.destroyObject(uapi.ObjectCQ, uapi.MethodCQDestroy, uapi.AttrDestroyCQHandle, uapi.AttrDestroyCQResp, h,
		uapi.CmdDestroyCQ, ucmd.Bytes(&req), ucmd.Bytes(&r))
}

// Handle returns the kernel handle.
func (cq *CQ) Handle() Handle { return cq.handle }

// Entries is the capacity granted by the kernel.
func (cq *CQ) Entries() int { return cq.entries }

// Channel returns the completion channel the CQ reports to (nil if none).
func (cq *CQ) Channel() *CompChannel { return cq.ch }

// CompEvents counts completion events consumed for this CQ.
func (cq *CQ) CompEvents() uint64 { return cq.compEvents.Load() }

func (cq *CQ) acquire() error {
	if cq.busy.CompareAndSwap(false, true) {
		if cq.dead.Load() {
			cq.busy.Store(false)
			return ErrClosed
		}
		return nil
	}
	if cq.dead.Load() {
		return ErrClosed
	}
	return ErrConcurrent
}

// Poll fills wc with up to len(wc) completions and returns their number. It
// does not block and does not allocate. A completion the provider cannot
// attribute to a QP of this context ends the poll with ErrStrayCompletion
// (unwrapped); the n completions before it are valid, and the stray one is
// consumed.
func (cq *CQ) Poll(wc []WC) (int, error) {
	if err := cq.acquire(); err != nil {
		return 0, err
	}
	n, err := cq.drv.Poll(wc)
	cq.busy.Store(false)
	return n, err
}

// ReqNotify arms the CQ: the next completion (with solicitedOnly, the next
// solicited one) raises one event on the CQ's channel. Poll after arming:
// completions that arrived before the arm raise no event.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if err := cq.acquire(); err != nil {
		return err
	}
	defer cq.busy.Store(false)
	if err := cq.drv.Arm(solicitedOnly); err != nil {
		return opErr("req_notify_cq", cq.ctx.dev.Name, err)
	}
	return nil
}

// Wait returns at least one completion, blocking until one arrives or ctx is
// done: it polls (CQConfig.SpinPolls times), arms, polls again (closing the
// race with a completion that landed before the arm), then sleeps on the
// channel. Without a channel it polls with short sleeps. It assumes it is
// the only waiter on the channel.
func (cq *CQ) Wait(ctx context.Context, wc []WC) (int, error) {
	backoff := time.Microsecond
	for {
		n, err := cq.Poll(wc)
		if n > 0 || err != nil {
			return n, err
		}
		for i := 0; i < cq.spin; i++ {
			if n, err := cq.Poll(wc); n > 0 || err != nil {
				return n, err
			}
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if cq.ch == nil {
			runtime.Gosched()
			time.Sleep(backoff)
			if backoff < time.Millisecond {
				backoff *= 2
			}
			continue
		}
		if err := cq.ReqNotify(false); err != nil {
			return 0, err
		}
		if n, err := cq.Poll(wc); n > 0 || err != nil {
			return n, err
		}
		if _, err := cq.ch.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// Close destroys the CQ. It fails with ErrBusy while QPs use it. Idempotent.
func (cq *CQ) Close() error {
	if cq == nil {
		return nil
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return nil
	}
	if cq.nqps > 0 {
		return fmt.Errorf("uverbs: destroy_cq %d: %d QPs attached: %w", cq.handle, cq.nqps, ErrBusy)
	}
	// Stop the data path: mark dead, then wait out a Poll in progress.
	cq.dead.Store(true)
	for !cq.busy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	err := cq.ctx.destroyCQ(cq.handle)
	if err != nil && !errors.Is(err, ErrClosed) {
		cq.dead.Store(false)
		cq.busy.Store(false)
		return opErr("destroy_cq", cq.ctx.dev.Name, err)
	}
	cq.closed = true
	derr := cq.drv.Destroyed()
	cq.ctx.mu.Lock()
	delete(cq.ctx.cqs, cq.uh)
	cq.ctx.mu.Unlock()
	if cq.ch != nil {
		cq.ch.mu.Lock()
		cq.ch.ncqs--
		cq.ch.mu.Unlock()
	}
	untrack(cq)
	return derr
}
