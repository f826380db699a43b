package mlx5

// This file is the only Go code of the package that turns memory into typed
// pointers. It exists because the assembly doorbell routines take word
// pointers, and the memory behind them is not Go heap:
//   - queue buffers and doorbell records are anonymous mmaps owned by a
//     Context/CQ/QP and unmapped only in Close, after the kernel object
//     that pinned them was destroyed;
//   - UAR registers are MMIO pages mapped from the uverbs fd.
// Each helper checks bounds (through the slice index) and alignment, so a
// returned pointer always addresses a whole, naturally aligned word inside
// the mapping. The garbage collector ignores pointers outside its heap, so
// holding them in Go structs is safe for as long as the mapping lives.

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// word32 returns a pointer to the aligned 4-byte word at b[off:off+4].
func word32(b []byte, off int) *uint32 {
	p := unsafe.Pointer(&b[off+3])
	p = unsafe.Add(p, -3)
	if uintptr(p)%4 != 0 {
		panic(fmt.Sprintf("mlx5: word32 at offset %d is not 4-byte aligned", off))
	}
	return (*uint32)(p)
}

// word64 returns a pointer to the aligned 8-byte word at b[off:off+8].
func word64(b []byte, off int) *uint64 {
	p := unsafe.Pointer(&b[off+7])
	p = unsafe.Add(p, -7)
	if uintptr(p)%8 != 0 {
		panic(fmt.Sprintf("mlx5: word64 at offset %d is not 8-byte aligned", off))
	}
	return (*uint64)(p)
}

// addrOf returns the virtual address of b[0], the value the kernel needs
// in buf_addr/db_addr fields of create commands for memory it will pin.
func addrOf(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// sgeBytes returns the memory an SGE of an inline send request describes,
// so that its bytes can be copied into the WQE. The uverbs contract makes
// the caller vouch for SGE ranges (the same ranges the HCA would otherwise
// read by DMA): they lie in memory that stays mapped during the post. The
// address is reinterpreted rather than converted from uintptr: it comes
// from the caller, not from pointer arithmetic on a Go object.
func sgeBytes(s *SGE) []byte {
	if s.Length == 0 {
		return nil
	}
	addr := uintptr(s.Addr)
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), int(s.Length))
}

// recordBytes views a doorbell record word as its 4 bytes (tests and
// diagnostics read records back in memory order).
func recordBytes(p *uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), 4)
}

// loadAcquire32 atomically loads the little-endian word at b[off:off+4]
// (acquire ordering: later loads are not hoisted above it).
func loadAcquire32(b []byte, off int) uint32 {
	return atomic.LoadUint32(word32(b, off))
}
