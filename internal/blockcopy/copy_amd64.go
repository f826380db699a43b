package blockcopy

import "golang.org/x/sys/cpu"

// useRep: the CPU's REP MOVSB is fast (ERMS).
var useRep = cpu.X86.HasERMS

// repMove copies len(dst) bytes from src (as long) to dst with REP MOVSB.
// The ranges must not overlap.
func repMove(dst, src []byte) {
	repMovsb(&dst[0], &src[0], uintptr(len(dst)))
}

// repMovsb is REP MOVSB: n bytes from src to dst, ascending. It moves
// plain bytes (no pointers: no write barrier is due) between ranges the
// caller's slices keep alive for the call.
//
//go:noescape
func repMovsb(dst, src *byte, n uintptr)
