package blockcopy

import "unsafe"

// aligned reports whether b (not empty) starts on a 64-byte cache line.
// It reads the address only; nothing is dereferenced.
func aligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))&63 == 0
}

// overlap reports whether a and b (not empty) share a byte. It compares
// addresses only.
func overlap(a, b []byte) bool {
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
