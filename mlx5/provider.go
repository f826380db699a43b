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

type provider struct{}

// Provider returns the mlx5 (ConnectX-4 and later) provider. Pass it in
// uverbs.Options.Providers or to uverbs.Register.
func Provider() uverbs.Provider { return provider{} }

func (provider) Name() string              { return "mlx5" }
func (provider) DriverID() uverbs.DriverID { return uverbs.DriverMLX5 }

// ContextRequest asks for CQE version 1 (CQEs name QPs by user index) and
// static 4 KiB UARs, which need no driver ioctl.
func (provider) ContextRequest() ([]byte, int) {
	req := &abi.AllocUcontextReqV2{
		TotalNumBFRegs:      defaultTotalBFRegs,
		NumLowLatencyBFRegs: defaultLowLatency,
		MaxCQEVersion:       1,
		LibCaps:             abi.LibCap4KUAR,
	}
	return abi.Bytes(req), abi.SizeAllocUcontextResp
}

func (provider) NewContext(k uverbs.Kernel, out []byte) (uverbs.DriverContext, error) {
	var resp abi.AllocUcontextResp
	copy(abi.Bytes(&resp), out)
	return newContext(k.FD(), &resp)
}

// Context is the mlx5 state of a verbs context: mapped UAR pages, the send
// doorbell registers (bfregs), doorbell records and the user-index table
// that routes CQEs to QPs.
type Context struct {
	fd   int
	resp abi.AllocUcontextResp
	qps  uidxTable
	dbs  dbPool

	mu       sync.Mutex // guards the fields below
	closed   bool
	uars     map[int][]byte // static UAR system page index -> mapping
	bfregs   map[uint32]*bfreg
	nextUIdx uint32
}

func newContext(fd int, resp *abi.AllocUcontextResp) (*Context, error) {
	if !mmioSupported {
		return nil, fmt.Errorf("mlx5: doorbells are implemented for amd64 only: %w", ErrNotSupported)
	}
	if resp.CQEVersion != 1 {
		return nil, fmt.Errorf("mlx5: device offers CQE version %d, need 1: %w", resp.CQEVersion, ErrNotSupported)
	}
	if resp.TotBFRegs == 0 {
		return nil, fmt.Errorf("mlx5: kernel allocated no static UARs (dynamic UARs only): %w", ErrNotSupported)
	}
	if resp.NumUARsPerPage == 0 {
		resp.NumUARsPerPage = 1 // kernels before 4K UARs do not report it
	}
	c := &Context{fd: fd, resp: *resp, uars: map[int][]byte{}, bfregs: map[uint32]*bfreg{}, nextUIdx: 1}
	// System page 0 carries the CQ arm doorbell of every CQ.
	if _, err := c.uarPage(0); err != nil {
		return nil, err
	}
	return c, nil
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
	for i, b := range c.uars {
		errs = append(errs, abi.Unmap(b))
		delete(c.uars, i)
	}
	errs = append(errs, c.dbs.close())
	return errors.Join(errs...)
}
