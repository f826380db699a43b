package mlx5

// This file isolates the one unsafe operation of the package: viewing an ABI
// struct as the bytes the kernel reads or writes. It is safe because every
// struct here is HostLayout, has only fixed-size integer fields (no Go
// pointers), and its size is checked below at compile time and against the
// C header in the layout test.

import "unsafe"

// Compile-time size checks: a mismatch makes an array index negative or
// out of range and breaks the build.
var (
	_ = [1]struct{}{}[unsafe.Sizeof(AllocUcontextReqV2{})-SizeAllocUcontextReqV2]
	_ = [1]struct{}{}[unsafe.Sizeof(AllocUcontextResp{})-SizeAllocUcontextResp]
	_ = [1]struct{}{}[unsafe.Sizeof(AllocPDResp{})-SizeAllocPDResp]
	_ = [1]struct{}{}[unsafe.Sizeof(CreateCQ{})-SizeCreateCQ]
	_ = [1]struct{}{}[unsafe.Sizeof(CreateCQResp{})-SizeCreateCQResp]
	_ = [1]struct{}{}[unsafe.Sizeof(CreateQP{})-SizeCreateQP]
	_ = [1]struct{}{}[unsafe.Sizeof(CreateQPResp{})-SizeCreateQPResp]
)

// ABIStruct is the set of driver structs that may be viewed as bytes.
type ABIStruct interface {
	AllocUcontextReqV2 | AllocUcontextResp | AllocPDResp | CreateCQ | CreateCQResp | CreateQP | CreateQPResp
}

// Bytes returns the memory of *p as a byte slice of its exact C size. The
// slice aliases *p: the kernel may write a response directly into it.
func Bytes[T ABIStruct](p *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p))
}
