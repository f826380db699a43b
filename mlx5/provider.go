package mlx5

import (
	"errors"
	"fmt"
	"sync"

	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/uverbs"
)

// Defaults of the GET_CONTEXT request, as rdma-core sends them: 16 static
// bfregs of which 4 are low-latency (dedicated to one QP each).
const (
	defaultTotalBFRegs = 16
	defaultLowLatency  = 4
)

// Options tune the provider. The zero value is the default.
type Options struct {
	// DynamicUAR gives every QP its own doorbell page, allocated with the
	// driver's UAR_OBJ_ALLOC ioctl (kernel 5.7 and later), so no QP ever
	// shares a doorbell register or its lock. By default the kernel's 16
	// static registers are used: 4 dedicated, the rest shared under a lock.
	DynamicUAR bool
}

// provider embeds UnimplementedProvider so that it keeps compiling when the
// interface grows; every current method is implemented below.
type provider struct {
	uverbs.UnimplementedProvider
	opts Options
}

// Provider returns the mlx5 (ConnectX-4 and later) provider with default
// options. Pass it in uverbs.Options.Providers (package uverbs/providers lists it).
func Provider() uverbs.Provider { return provider{} }

// NewProvider returns the mlx5 provider with the given options.
func NewProvider(o Options) uverbs.Provider { return provider{opts: o} }

var (
	_ uverbs.DriverContext = (*Context)(nil)
	_ uverbs.DriverCQ      = (*CQ)(nil)
	_ uverbs.DriverQP      = (*QP)(nil)
)

func (provider) Name() string              { return "mlx5" }
func (provider) DriverID() uverbs.DriverID { return uverbs.DriverMLX5 }

// ContextRequest asks for CQE version 1 (CQEs name QPs by user index) and
// 4 KiB UARs: static ones, which need no driver ioctl, or with
// Options.DynamicUAR dynamic ones.
func (p provider) ContextRequest() ([]byte, int) {
	req := &abi.AllocUcontextReqV2{
		TotalNumBFRegs:      defaultTotalBFRegs,
		NumLowLatencyBFRegs: defaultLowLatency,
		MaxCQEVersion:       1,
		LibCaps:             abi.LibCap4KUAR,
	}
	if p.opts.DynamicUAR {
		req.LibCaps |= abi.LibCapDynUAR
	}
	return abi.Bytes(req), abi.SizeAllocUcontextResp
}

func (provider) NewContext(k uverbs.Kernel, out []byte) (uverbs.DriverContext, error) {
	var resp abi.AllocUcontextResp
	copy(abi.Bytes(&resp), out)
	return newContext(k, &resp)
}

// Context is the mlx5 state of a verbs context: mapped UAR pages, the send
// doorbell registers (bfregs), doorbell records and the user-index table
// that routes CQEs to QPs.
type Context struct {
	k    uverbs.Kernel
	fd   int
	resp abi.AllocUcontextResp
	qps  uidxTable
	dbs  dbPool
	// dyn: the kernel gave no static UARs (the library asked for dynamic
	// ones); cqUAR is then the page every CQ is armed through.
	dyn   bool
	cqUAR *dynUAR

	mu       sync.Mutex // guards the fields below
	closed   bool
	uars     map[int][]byte // static UAR system page index -> mapping
	bfregs   map[uint32]*bfreg
	nextUIdx uint32
}

func newContext(k uverbs.Kernel, resp *abi.AllocUcontextResp) (*Context, error) {
	if !mmioSupported {
		return nil, fmt.Errorf("mlx5: doorbells are implemented for amd64 and arm64 only: %w", ErrNotSupported)
	}
	if resp.CQEVersion != 1 {
		return nil, fmt.Errorf("mlx5: device offers CQE version %d, need 1: %w", resp.CQEVersion, ErrNotSupported)
	}
	if resp.NumUARsPerPage == 0 {
		resp.NumUARsPerPage = 1 // kernels before 4K UARs do not report it
	}
	c := &Context{k: k, fd: k.FD(), resp: *resp, uars: map[int][]byte{}, bfregs: map[uint32]*bfreg{}, nextUIdx: 1}
	if resp.TotBFRegs == 0 {
		// Dynamic UARs: CQs are armed through one uncached page.
		c.dyn = true
		u, err := c.allocUAR(abi.UARAllocTypeNC)
		if err != nil {
			return nil, err
		}
		c.cqUAR = u
		return c, nil
	}
	// System page 0 carries the CQ arm doorbell of every CQ.
	if _, err := c.uarPage(0); err != nil {
		return nil, err
	}
	return c, nil
}

// cqArmPage returns the UAR page CQs are armed through.
func (c *Context) cqArmPage() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dyn {
		if c.cqUAR == nil {
			return nil
		}
		return c.cqUAR.page
	}
	return c.uars[0]
}

// uarPage maps static UAR system page i on first use. Write-combining
// (the REGULAR command) only where the device reported BlueFlame
// registers (bf_reg_size > 0); uncached otherwise.
func (c *Context) uarPage(i int) ([]byte, error) {
	if b, ok := c.uars[i]; ok {
		return b, nil
	}
	cmd := abi.MmapNCPage
	if c.resp.BFRegSize > 0 {
		cmd = abi.MmapRegularPage
	}
	b, err := abi.MapUAR(c.fd, abi.UAROffset(cmd, i, abi.PageSize), abi.PageSize)
	if err != nil {
		return nil, err
	}
	c.uars[i] = b
	return b, nil
}

// bfreg returns the send doorbell register with library number n (4 per
// UAR, as the kernel reports it in create_qp_resp.bfreg_index).
func (c *Context) bfreg(n uint32) (*bfreg, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errClosed
	}
	if r, ok := c.bfregs[n]; ok {
		return r, nil
	}
	const perUAR, nonFPPerUAR, uarSize = 4, 2, 4096
	perPage := c.resp.NumUARsPerPage
	if n%perUAR >= nonFPPerUAR || n/perUAR/perPage >= c.resp.TotBFRegs/nonFPPerUAR/perPage {
		return nil, fmt.Errorf("mlx5: kernel assigned bfreg %d outside the %d static bfregs: %w", n, c.resp.TotBFRegs, uverbs.ErrNotSupported)
	}
	page, err := c.uarPage(int(n / perUAR / perPage))
	if err != nil {
		return nil, err
	}
	off := int((n/perUAR)%perPage)*uarSize + bfOffset + int(n%perUAR)*int(c.resp.BFRegSize)
	r := &bfreg{index: n}
	// Kernel numbering (2 per UAR): 0 is the shared doorbell-only register,
	// the last num_low_latency ones are dedicated, the rest are shared.
	k := n/perUAR*nonFPPerUAR + n%perUAR
	dedicated := k >= c.resp.TotBFRegs-defaultLowLatency
	r.shared = k != 0 && !dedicated
	r.reg[0] = word64(page, off)
	r.reg[1] = r.reg[0]
	if k != 0 && c.resp.BFRegSize > 0 {
		r.bfHalf = c.resp.BFRegSize / 2
		r.reg[1] = word64(page, off+int(r.bfHalf))
	}
	c.bfregs[n] = r
	return r, nil
}

func (c *Context) allocUIdx() (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errClosed
	}
	if c.nextUIdx >= maxUIdx {
		return 0, fmt.Errorf("mlx5: user indexes exhausted: %w", abi.ENOMEM)
	}
	u := c.nextUIdx
	c.nextUIdx++
	return u, nil
}

// Close unmaps the UAR pages and doorbell-record pages. The core calls it
// after every CQ and QP was destroyed.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	if c.cqUAR != nil {
		errs = append(errs, c.freeUAR(c.cqUAR))
		c.cqUAR = nil
	}
	for i, b := range c.uars {
		errs = append(errs, abi.Unmap(b))
		delete(c.uars, i)
	}
	errs = append(errs, c.dbs.close())
	return errors.Join(errs...)
}
