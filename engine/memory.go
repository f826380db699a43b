package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
)

// region is a registered range of local memory (driver.Region). The engine
// creates it in RegisterLocalMemory and hands it to transports.
type region struct {
	addr     uint64
	mem      []byte
	location string
	e        *Engine
	// owner is the Memory (from Alloc or AllocShared) the region lies
	// in, nil for memory mapped by other means; set once. Memory.Close
	// unregisters the region before unmapping.
	owner *Memory
	// keys holds each transport's RegisterMemory result, by slot.
	keys [maxTransports]any
	// users counts pins: tasks in flight using the region as their local
	// side, and target-side accesses by transports. dead is set while an
	// unregistration decides; pin and unregister follow a store-then-check
	// protocol on the two atomics so that one of them always sees the other.
	users atomic.Int64
	dead  atomic.Bool
}

// Addr is the region's first virtual address.
func (r *region) Addr() uint64 { return r.addr }

// Len is the region's length in bytes.
func (r *region) Len() uint64 { return uint64(len(r.mem)) }

// Location is the memory's location tag (cpu:0, cuda:3).
func (r *region) Location() string { return r.location }

// Bytes returns the whole region.
func (r *region) Bytes() []byte { return r.mem }

// SharedFD returns the memory file behind the region and the region's
// offset in it, when the region lies in memory from AllocShared; ok is
// false otherwise. The descriptor stays open while the region is
// registered; the caller must not close it.
func (r *region) SharedFD() (fd int, off uint64, ok bool) {
	if r.owner == nil {
		return -1, 0, false
	}
	return r.owner.memfd(r.addr)
}

// Release drops a pin taken by driver.Host.AcquireLocal.
func (r *region) Release() { r.users.Add(-1) }

// pin takes a pin unless the region is being unregistered.
func (r *region) pin() bool {
	r.users.Add(1)
	if r.dead.Load() {
		r.users.Add(-1)
		return false
	}
	return true
}

func (r *region) contains(addr, length uint64) bool {
	if addr < r.addr || length > uint64(len(r.mem)) {
		return false
	}
	return addr-r.addr <= uint64(len(r.mem))-length
}

// sliceAt returns the bytes of [addr, addr+length), which must lie inside r.
func (r *region) sliceAt(addr, length uint64) []byte {
	off := addr - r.addr
	return r.mem[off : off+length : off+length]
}

// AddrOf returns the virtual address of b's first byte: the address space
// of descriptors, Request.LocalAddr and Request.TargetAddr.
func AddrOf(b []byte) uint64 { return addrOf(b) }

// memTable is the sorted set of registered regions. Readers load the
// snapshot without locks; writers (under Engine.memMu) publish a new one.
type memTable struct {
	snap atomic.Pointer[[]*region]
}

func (t *memTable) load() []*region {
	p := t.snap.Load()
	if p == nil {
		return nil
	}
	return *p
}

// find returns the region holding [addr, addr+length), or nil.
func (t *memTable) find(addr, length uint64) *region {
	rs := t.load()
	// First region whose start is > addr, then step back one.
	lo, hi := 0, len(rs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].addr <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return nil
	}
	if r := rs[lo-1]; r.contains(addr, length) {
		return r
	}
	return nil
}

// RegisterLocalMemory registers mem (which must stay mapped, and should be
// from Alloc or another mmap: never ordinary Go heap memory, which the
// garbage collector may move or free) for transfers, with a location tag
// such as "cpu:0" ("" means "cpu"). Every installed transport registers
// it, and the local descriptor is republished with the new buffer.
// Overlapping an already registered region is an error (ErrOverlap).
func (e *Engine) RegisterLocalMemory(mem []byte, location string) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: register: empty region", ErrInvalidRequest)
	}
	return e.register(addrOf(mem), mem, location)
}

// RegisterLocalAddr registers length bytes at addr, memory mapped by other
// means (another library, a device driver). The caller guarantees it stays
// mapped until UnregisterLocalAddr succeeds, and that it is not Go heap
// memory.
func (e *Engine) RegisterLocalAddr(addr uintptr, length uint64, location string) error {
	if addr == 0 || length == 0 || uint64(addr)+length < uint64(addr) {
		return fmt.Errorf("%w: register: bad range %#x+%d", ErrInvalidRequest, addr, length)
	}
	return e.register(uint64(addr), bytesAt(addr, length), location)
}

// UnregisterLocalMemory unregisters the region that starts at mem's first
// byte. It fails with ErrMemoryBusy while transfers use the region, and
// with ErrNotRegistered if no region starts there. Once it is past those
// checks the region is unregistered: a store that cannot take the new
// descriptor is logged, not returned.
func (e *Engine) UnregisterLocalMemory(mem []byte) error {
	if len(mem) == 0 {
		return fmt.Errorf("%w: unregister: empty region", ErrNotRegistered)
	}
	return e.unregister(addrOf(mem))
}

// UnregisterLocalAddr is UnregisterLocalMemory for the region at addr.
func (e *Engine) UnregisterLocalAddr(addr uintptr) error {
	return e.unregister(uint64(addr))
}

func (e *Engine) register(addr uint64, mem []byte, location string) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if location == "" {
		location = "cpu"
	}
	e.memMu.Lock()
	defer e.memMu.Unlock()
	rs := e.mem.load()
	end := addr + uint64(len(mem))
	for _, r := range rs {
		if addr < r.addr+uint64(len(r.mem)) && r.addr < end {
			return fmt.Errorf("%w: [%#x, %#x) overlaps [%#x, %#x)", ErrOverlap, addr, end, r.addr, r.addr+uint64(len(r.mem)))
		}
	}
	r := &region{addr: addr, mem: mem[:len(mem):len(mem)], location: location, e: e}
	if m := allocs.find(addr, uint64(len(mem))); m != nil {
		if err := m.attach(r); err != nil {
			return fmt.Errorf("engine: register [%#x, %#x): %w", addr, end, err)
		}
		r.owner = m
	}
	ts := e.transports.Load()
	for i, t := range ts.slots {
		if t == nil {
			continue
		}
		k, err := t.RegisterMemory(r)
		if err != nil {
			e.unregisterTransports(r, ts, i)
			r.detach()
			return fmt.Errorf("engine: register [%#x, %#x) with %s: %w", addr, end, t.Name(), err)
		}
		r.keys[i] = k
	}
	nrs := make([]*region, 0, len(rs)+1)
	nrs = append(nrs, rs...)
	nrs = append(nrs, r)
	slices.SortFunc(nrs, func(a, b *region) int { return cmp.Compare(a.addr, b.addr) })
	e.mem.snap.Store(&nrs)
	if err := e.republish(); err != nil {
		e.mem.snap.Store(&rs)
		e.unregisterTransports(r, ts, len(ts.slots))
		r.detach()
		return fmt.Errorf("engine: register [%#x, %#x): %w", addr, end, err)
	}
	return nil
}

// unregisterTransports undoes RegisterMemory for slots [0, upto).
func (e *Engine) unregisterTransports(r *region, ts *transportSet, upto int) error {
	var first error
	for i := 0; i < upto; i++ {
		if t := ts.slots[i]; t != nil {
			if err := t.UnregisterMemory(r, r.keys[i]); err != nil && first == nil {
				first = fmt.Errorf("engine: unregister from %s: %w", t.Name(), err)
			}
			r.keys[i] = nil
		}
	}
	return first
}

// detach unlinks the region from the Memory it lies in.
func (r *region) detach() {
	if r.owner != nil {
		r.owner.detach(r)
	}
}

func (e *Engine) unregister(addr uint64) error {
	return e.unregisterWhere(func(r *region) bool { return r.addr == addr }, addr)
}

// unregisterRegion unregisters r itself (Memory.Close).
func (e *Engine) unregisterRegion(r *region) error {
	return e.unregisterWhere(func(x *region) bool { return x == r }, r.addr)
}

func (e *Engine) unregisterWhere(match func(*region) bool, addr uint64) error {
	e.memMu.Lock()
	defer e.memMu.Unlock()
	rs := e.mem.load()
	i := slices.IndexFunc(rs, match)
	if i < 0 {
		return fmt.Errorf("%w: unregister: no region starts at %#x", ErrNotRegistered, addr)
	}
	r := rs[i]
	r.dead.Store(true)
	if n := r.users.Load(); n > 0 {
		r.dead.Store(false)
		return fmt.Errorf("%w: unregister [%#x, %#x): %d users", ErrMemoryBusy, r.addr, r.addr+r.Len(), n)
	}
	nrs := slices.Delete(slices.Clone(rs), i, i+1)
	e.mem.snap.Store(&nrs)
	err := e.unregisterTransports(r, e.transports.Load(), maxTransports)
	r.detach()
	// The region is gone whatever the store says: failing here would make
	// a retry find nothing to unregister, and Memory.Close keep a mapping
	// nothing uses. Peers that still see the old descriptor are refused
	// by the target's range checks.
	if perr := e.republish(); perr != nil && !e.closed.Load() {
		e.log.Warn("engine: republish after unregister", "addr", fmt.Sprintf("%#x", r.addr), "err", perr)
	}
	return err
}
