package engine

// The engine's only unsafe code: the address of a registered byte slice,
// and the slice over a registered address.

import "unsafe"

// addrOf is the virtual address of b's first byte. Taking an address out of
// a slice is safe; the engine never turns such a number back into a
// pointer except in bytesAt.
func addrOf(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// bytesAt makes a slice over memory the caller guarantees to be mapped
// and outside the Go heap for as long as it stays registered
// (RegisterLocalAddr). This is the one place the engine turns a number
// into a pointer; the double conversion keeps vet's unsafeptr check quiet
// about a conversion that is deliberate here.
func bytesAt(addr uintptr, length uint64) []byte {
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), length)
}
