// REP MOVSB for blockcopy.Copy (x86-64). The caller checks the sizes,
// the alignment and that the ranges do not overlap; a string move with
// the direction flag clear (the Go ABI keeps it clear) copies ascending.

#include "textflag.h"

// func repMovsb(dst, src *byte, n uintptr)
TEXT ·repMovsb(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	REP; MOVSB
	RET
