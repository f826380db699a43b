//go:build unix

package engine

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/rdmago/te/internal/dma"
)

// Memory is a mapping outside the Go heap, suitable for registration: the
// garbage collector never moves or frees it, so a NIC or a peer may write
// it at any time until Close. It is excluded from fork (a child never gets
// a copy-on-write copy of pages a device writes) and, from 2 MiB up, starts
// on a huge page boundary with transparent huge pages requested.
type Memory struct {
	mu      sync.Mutex
	reg     *dma.Region
	b       []byte
	len     int
	shared  bool
	closing bool
	// regions are the registrations (in any engine) that lie inside this
	// memory; Close unregisters them first.
	regions []*region
}

// Alloc maps size bytes of zeroed, page-aligned anonymous private memory.
func Alloc(size int) (*Memory, error) { return alloc(size, false) }

// AllocShared maps size bytes of zeroed, page-aligned memory backed by an
// anonymous memory file (memfd) and mapped shared: like Alloc, and in
// addition a same-host transport (shm) can hand it to a peer process, which
// then copies to and from it directly. The file has no name anywhere and
// disappears with the last process that maps it.
func AllocShared(size int) (*Memory, error) { return alloc(size, true) }

func alloc(size int, shared bool) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("engine: alloc %d bytes: %w", size, ErrInvalidRequest)
	}
	var r *dma.Region
	var err error
	if shared {
		r, err = dma.AllocShared(size)
	} else {
		r, err = dma.Alloc(size)
	}
	if err != nil {
		return nil, fmt.Errorf("engine: alloc %d bytes: %w", size, err)
	}
	m := &Memory{reg: r, b: r.Bytes(), len: size, shared: shared}
	allocs.add(m)
	return m, nil
}

// Bytes returns the mapping (nil after Close).
func (m *Memory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Len returns the mapping's size.
func (m *Memory) Len() int { return m.len }

// Shared reports whether the memory came from AllocShared.
func (m *Memory) Shared() bool { return m.shared }

// Close unregisters every registration inside the memory (from every
// engine) and unmaps it. If a registration cannot be removed because
// transfers use it, Close fails with an error wrapping ErrMemoryBusy and
// the memory stays mapped and registered: unmapping memory that a peer or
// NIC may still write would crash the process at the next access. Close
// is idempotent and safe on a nil Memory.
func (m *Memory) Close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	if m.b == nil {
		m.mu.Unlock()
		return nil
	}
	m.closing = true
	regs := slices.Clone(m.regions)
	m.mu.Unlock()
	for _, r := range regs {
		if err := r.e.unregisterRegion(r); err != nil && !errors.Is(err, ErrNotRegistered) {
			m.mu.Lock()
			m.closing = false
			m.mu.Unlock()
			return fmt.Errorf("engine: close memory: %w", err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.regions) > 0 {
		m.closing = false
		return fmt.Errorf("engine: close memory: %w: still registered", ErrMemoryBusy)
	}
	allocs.remove(m)
	m.b = nil
	if err := m.reg.Unmap(); err != nil {
		return fmt.Errorf("engine: munmap: %w", err)
	}
	return nil
}

// attach records r as a registration inside m; it fails while m closes.
func (m *Memory) attach(r *region) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing || m.b == nil {
		return fmt.Errorf("%w: memory is being closed", ErrNotRegistered)
	}
	m.regions = append(m.regions, r)
	return nil
}

// detach forgets a registration (unregistered, or its engine closed).
func (m *Memory) detach(r *region) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.regions = slices.DeleteFunc(m.regions, func(x *region) bool { return x == r })
}

// memfd returns the memory file of shared memory and the offset of addr
// in it.
func (m *Memory) memfd(addr uint64) (fd int, off uint64, ok bool) {
	if !m.shared {
		return -1, 0, false
	}
	return m.reg.FD(), addr - addrOf(m.b), true
}

// allocs is every live Memory of the process, sorted by address, so that a
// registration can find the Memory it lies in.
var allocs allocTable

type allocTable struct {
	mu sync.Mutex
	ms []*Memory
}

func (t *allocTable) add(m *Memory) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, _ := slices.BinarySearchFunc(t.ms, addrOf(m.b), func(x *Memory, a uint64) int { return cmp.Compare(addrOf(x.b), a) })
	t.ms = slices.Insert(t.ms, i, m)
}

func (t *allocTable) remove(m *Memory) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ms = slices.DeleteFunc(t.ms, func(x *Memory) bool { return x == m })
}

// find returns the Memory holding [addr, addr+n), or nil.
func (t *allocTable) find(addr, n uint64) *Memory {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, found := slices.BinarySearchFunc(t.ms, addr, func(x *Memory, a uint64) int { return cmp.Compare(addrOf(x.b), a) })
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	m := t.ms[i]
	base := addrOf(m.b)
	if addr >= base && n <= uint64(len(m.b)) && addr-base <= uint64(len(m.b))-n {
		return m
	}
	return nil
}
