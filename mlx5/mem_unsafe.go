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
// the mapping. Addresses for the kernel (dma.Addr) and inline SGE payloads
// read by address (dma.At) go through internal/dma, shared with rxe. The garbage collector ignores pointers outside its heap, so
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
