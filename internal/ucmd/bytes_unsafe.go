package ucmd

// This file isolates the unsafe views of fixed-layout ABI structs as bytes
// and the raw syscalls whose arguments are addresses.

import (
	"unsafe"

	"github.com/rdmago/te/internal/unix"
)

// Bytes returns the memory of *p as a byte slice (no copy). T must be one of
// the fixed-layout uapi structs (structs.HostLayout, no pointers), so every
// byte is meaningful and the slice lives exactly as long as p.
func Bytes[T any](p *T) []byte {
	// Safe: p points to a live T of exactly Sizeof(T) bytes containing no Go pointers.
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p))
}

// ioctl issues RDMA_VERBS_IOCTL with the header at buf[0]. buf is mmap'd
// arena memory, so it cannot move while the kernel reads and writes it.
func ioctl(fd int, buf []byte) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(RDMAVerbsIoctl), uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	if e != 0 {
		return e
	}
	return nil
}

// rawWrite is write(2) through RawSyscall: the goroutine keeps its P and the
// scheduler is not told. Only for writes that cannot block (uverbs commands
// that do bounded work and never wait on a peer). cmd is mmap'd memory owned
// by the caller, so it cannot move while the kernel copies it.
func rawWrite(fd int, cmd []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(cmd))), uintptr(len(cmd)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
