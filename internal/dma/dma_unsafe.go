package dma

// This file isolates the unsafe operations on mapped memory: turning an
// offset into a typed pointer, taking a slice's address for the kernel, and
// atomic access to ring indices. Every function bounds- and alignment-checks
// its offset against the slice, so no pointer escapes the mapping.

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rdmago/te/internal/unix"
)

// View returns a *T aliasing b[off:off+sizeof(T)]. It panics if the range is
// out of bounds or misaligned for T. b must be memory that does not move
// (a Region or a test buffer kept alive by the caller): the pointer is as
// valid as b.
func View[T any](b []byte, off int) *T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if off < 0 || off+size > len(b) {
		panic(fmt.Sprintf("dma.View: [%d:%d] out of range of %d bytes", off, off+size, len(b)))
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	p = unsafe.Add(p, off)
	if uintptr(p)%unsafe.Alignof(zero) != 0 {
		panic(fmt.Sprintf("dma.View: offset %d misaligned for %T", off, zero))
	}
	// Safe: p lies inside b (checked above) and is aligned for T.
	return (*T)(p)
}

// Addr returns the address of b[0] as the kernel sees it. b must not be Go
// heap memory that may move or be freed while the kernel uses the address.
func Addr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

func word(b []byte, off int) *uint32 {
	if off < 0 || off+4 > len(b) || off%4 != 0 {
		panic(fmt.Sprintf("dma: u32 at offset %d out of range/misaligned (len %d)", off, len(b)))
	}
	// Safe: in bounds and 4-byte aligned relative to a page-aligned mapping.
	return (*uint32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), off))
}

// LoadAcquire32 loads the u32 at b[off] with (at least) acquire ordering:
// later reads of the ring cannot be satisfied before it.
func LoadAcquire32(b []byte, off int) uint32 { return atomic.LoadUint32(word(b, off)) }

// StoreRelease32 stores v at b[off] with (at least) release ordering: all
// earlier writes (the WQE body, or our reads of a CQE) are ordered before it.
func StoreRelease32(b []byte, off int, v uint32) { atomic.StoreUint32(word(b, off), v) }

// At returns the n bytes at address addr. It is how a provider reads inline
// send payloads that SGEs reference by address. Precondition (the caller's
// contract, as for an HCA): addr..addr+n lies in memory this process mapped
// outside the Go heap and keeps mapped, i.e. a registered buffer. The
// address is reinterpreted through memory rather than converted from a
// uintptr expression because it never was a Go pointer.
func At(addr uint64, n int) []byte {
	if n == 0 {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// mapRaw maps size bytes (a multiple of PageSize) readable and writable,
// starting at a multiple of align (a power of two, at least PageSize): of
// fd at offset 0 when fd >= 0, else anonymous. See mapRawAt.
func mapRaw(fd int, size int, flags int, align int) ([]byte, error) {
	return mapRawAt(fd, 0, size, flags, align)
}

// mapRawAt maps size bytes of fd at offset (anonymous memory when fd < 0)
// at an address aligned to align. For alignments above a page it reserves
// size+align bytes of address space without access, maps the memory over
// the aligned part of it (MAP_FIXED inside a reservation this function
// owns, so nothing else is replaced) and returns the unused head and tail.
func mapRawAt(fd int, offset int64, size int, flags int, align int) ([]byte, error) {
	const prot = unix.PROT_READ | unix.PROT_WRITE
	if align <= PageSize {
		p, err := unix.MmapPtr(fd, offset, nil, uintptr(size), prot, flags)
		if err != nil {
			return nil, err
		}
		// Safe: the kernel mapped size bytes at p; they stay mapped until
		// unmapRaw, and the Go heap never owns them.
		return unsafe.Slice((*byte)(p), size), nil
	}
	resv := uintptr(size + align)
	base, err := unix.MmapPtr(-1, 0, nil, resv, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	start := (uintptr(base) + uintptr(align) - 1) &^ (uintptr(align) - 1)
	head := start - uintptr(base)
	// Safe: start lies inside the reservation [base, base+resv), which this
	// function mapped and owns.
	at := unsafe.Add(base, head)
	p, err := unix.MmapPtr(fd, offset, at, uintptr(size), prot, flags|unix.MAP_FIXED)
	if err != nil {
		unix.MunmapPtr(base, resv)
		return nil, err
	}
	if head > 0 {
		unix.MunmapPtr(base, head)
	}
	if tail := resv - head - uintptr(size); tail > 0 {
		unix.MunmapPtr(unsafe.Add(p, size), tail)
	}
	// Safe: as above, size bytes are mapped at p until unmapRaw.
	return unsafe.Slice((*byte)(p), size), nil
}

// unmapRaw unmaps a mapping made by mapRawAt (b is the whole mapping).
func unmapRaw(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	// Safe: b is a whole mapping from mapRawAt; nothing uses it after this.
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b)))
}
