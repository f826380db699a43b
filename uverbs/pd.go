package uverbs

import (
	"errors"
	"fmt"
	"sync"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
)

// PD is a protection domain. Safe for concurrent use.
type PD struct {
	ctx    *Context
	handle Handle

	mu     sync.Mutex // guards below
	closed bool
	mrs    map[*MR]struct{}
	nqps   int
	ahs    map[*AH]struct{}
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	req := uapi.AllocPD{}
	var r uapi.AllocPDResp
	if err := c.file.Write(uapi.CmdAllocPD, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		return nil, opErr("alloc_pd", c.dev.Name, err)
	}
	pd := &PD{ctx: c, handle: Handle(r.PDHandle), mrs: map[*MR]struct{}{}, ahs: map[*AH]struct{}{}}
	c.pds[pd] = struct{}{}
	track(pd, describe("PD", c.dev.Name, pd.handle))
	return pd, nil
}

// Handle returns the kernel handle.
func (pd *PD) Handle() Handle { return pd.handle }

// Context returns the PD's context.
func (pd *PD) Context() *Context { return pd.ctx }

func (pd *PD) ahList() []*AH {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	var out []*AH
	for a := range pd.ahs {
		out = append(out, a)
	}
	return out
}

func (pd *PD) mrList() []*MR {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	var out []*MR
	for m := range pd.mrs {
		out = append(out, m)
	}
	return out
}

// Close deallocates the PD. It fails with ErrBusy while MRs or QPs of the PD
// are open. Idempotent.
func (pd *PD) Close() error {
	if pd == nil {
		return nil
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if len(pd.mrs) > 0 || pd.nqps > 0 || len(pd.ahs) > 0 {
		return fmt.Errorf("uverbs: dealloc_pd %d: %d MRs, %d QPs and %d AHs open: %w", pd.handle, len(pd.mrs), pd.nqps, len(pd.ahs), ErrBusy)
	}
	req := uapi.DeallocPD{PDHandle: uint32(pd.handle)}
	err := pd.ctx.file.Write(uapi.CmdDeallocPD, ucmd.Bytes(&req), nil, nil, nil)
	if err != nil && !errors.Is(err, ErrClosed) {
		return opErr("dealloc_pd", pd.ctx.dev.Name, err)
	}
	pd.closed = true
	pd.ctx.mu.Lock()
	delete(pd.ctx.pds, pd)
	pd.ctx.mu.Unlock()
	untrack(pd)
	return nil
}

// Buffer is page-aligned anonymous memory outside the Go heap, suitable for
// registration: the kernel and the device may access it at any time while
// registered. Close unmaps it (after every MR using it is closed).
type Buffer struct {
	r *dma.Region
}

// AllocBuffer maps n bytes of zeroed memory (rounded up to whole pages).
func AllocBuffer(n int) (*Buffer, error) {
	r, err := dma.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("uverbs: alloc buffer: %w", err)
	}
	b := &Buffer{r: r}
	track(b, fmt.Sprintf("Buffer of %d bytes", n))
	return b, nil
}

// Bytes returns the buffer's memory (nil after Close).
func (b *Buffer) Bytes() []byte { return b.r.Bytes() }

// Close unmaps the buffer. Idempotent.
func (b *Buffer) Close() error {
	if b == nil {
		return nil
	}
	untrack(b)
	return b.r.Unmap()
}

// MR is a registered memory region. Safe for concurrent use.
type MR struct {
	pd     *PD
	handle Handle
	lkey   LKey
	rkey   RKey
	buf    []byte
	own    *Buffer // set by AllocMR: unmapped on Close

	mu     sync.Mutex
	closed bool
}

// RegMR registers buf with the given access. buf must stay valid and at the
// same address until the MR is closed: use memory outside the Go heap
// (AllocBuffer, AllocMR, or any mmap). Registering Go heap memory is only
// safe if the caller pins it (runtime.Pinner) and keeps it reachable for
// the MR's lifetime, and even then neighbouring heap objects share its pages.
// Remote write and atomic access require AccessLocalWrite.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("uverbs: reg_mr: empty buffer: %w", ErrInvalidWR)
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, ErrClosed
	}
	addr := dma.Addr(buf)
	req := uapi.RegMR{Start: addr, Length: uint64(len(buf)), HCAVA: addr, PDHandle: uint32(pd.handle), AccessFlags: uint32(access)}
	var r uapi.RegMRResp
	if err := pd.ctx.file.Write(uapi.CmdRegMR, ucmd.Bytes(&req), nil, ucmd.Bytes(&r), nil); err != nil {
		what := fmt.Sprintf("reg_mr(%d bytes, access %#x)", len(buf), uint32(access))
		if errors.Is(err, ucmd.ENOMEM) {
			what += " (pinned memory is limited by RLIMIT_MEMLOCK, see ulimit -l)"
		}
		return nil, opErr(what, pd.ctx.dev.Name, err)
	}
	mr := &MR{pd: pd, handle: Handle(r.MRHandle), lkey: LKey(r.LKey), rkey: RKey(r.RKey), buf: buf}
	pd.mrs[mr] = struct{}{}
	track(mr, describe("MR", pd.ctx.dev.Name, mr.handle))
	return mr, nil
}

// AllocMR maps a new buffer of n bytes and registers it; Close deregisters
// and unmaps it.
func (pd *PD) AllocMR(n int, access Access) (*MR, error) {
	b, err := AllocBuffer(n)
	if err != nil {
		return nil, err
	}
	mr, err := pd.RegMR(b.Bytes(), access)
	if err != nil {
		b.Close()
		return nil, err
	}
	mr.own = b
	return mr, nil
}

// LKey is the local key, used in SGEs.
func (mr *MR) LKey() LKey { return mr.lkey }

// RKey is the remote key the peer uses (0 without remote access).
func (mr *MR) RKey() RKey { return mr.rkey }

// Addr is the address (and IOVA) of the region's first byte.
func (mr *MR) Addr() uint64 { return dma.Addr(mr.buf) }

// Len is the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// Bytes is the registered memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// Handle returns the kernel handle.
func (mr *MR) Handle() Handle { return mr.handle }

// SGE returns the scatter/gather element for buf[off:off+n]. It panics when
// the range is outside the region.
func (mr *MR) SGE(off, n int) SGE {
	if off < 0 || n < 0 || off+n > len(mr.buf) {
		panic(fmt.Sprintf("uverbs: SGE [%d:%d] outside MR of %d bytes", off, off+n, len(mr.buf)))
	}
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Close deregisters the region (and unmaps it if AllocMR mapped it). Idempotent.
func (mr *MR) Close() error {
	if mr == nil {
		return nil
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if mr.closed {
		return nil
	}
	req := uapi.DeregMR{MRHandle: uint32(mr.handle)}
	if err := mr.pd.ctx.file.Write(uapi.CmdDeregMR, ucmd.Bytes(&req), nil, nil, nil); err != nil && !errors.Is(err, ErrClosed) {
		return opErr("dereg_mr", mr.pd.ctx.dev.Name, err)
	}
	mr.closed = true
	mr.pd.mu.Lock()
	delete(mr.pd.mrs, mr)
	mr.pd.mu.Unlock()
	untrack(mr)
	return mr.own.Close()
}
