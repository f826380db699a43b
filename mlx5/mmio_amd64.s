// MMIO and barrier primitives for the mlx5 data path (x86-64).
//
// The UAR is device memory mapped write-combining or uncached. rdma-core's
// rules (util/udma_barrier.h, util/mmio.h) are followed exactly:
//   - doorbell record store, then SFENCE (mmio_wc_start) so the record is
//     globally visible before the device can be woken;
//   - the wake-up is ONE aligned 64-bit MOVQ store (never XCHG: Go's
//     atomic.StoreUint64 is a locked read-modify-write on device memory);
//   - BlueFlame copies the WQE with ascending 64-bit stores, no byte or
//     string stores (REP MOVS may split or reorder);
//   - SFENCE (mmio_flush_writes) flushes the write-combining buffer before
//     the register half can be reused.
// Go never inlines assembly functions, so each call is also a compiler
// barrier: WQE stores made in Go before the call cannot sink below it.

#include "textflag.h"

// func ringDoorbell(rec *uint32, recVal uint32, reg *uint64, val uint64)
TEXT ·ringDoorbell(SB), NOSPLIT, $0-32
	MOVQ rec+0(FP), AX
	MOVL recVal+8(FP), BX
	MOVQ reg+16(FP), CX
	MOVQ val+24(FP), DX
	MOVL BX, (AX)
	SFENCE
	MOVQ DX, (CX)
	SFENCE
	RET

// func ringBlueFlame(rec *uint32, recVal uint32, reg *uint64, a *uint64, na uintptr, b *uint64, nb uintptr)
// Copies na words from a, then nb words from b (the part of the WQE that
// wrapped to the start of the send queue), to consecutive words at reg.
TEXT ·ringBlueFlame(SB), NOSPLIT, $0-56
	MOVQ rec+0(FP), AX
	MOVL recVal+8(FP), BX
	MOVL BX, (AX)
	SFENCE
	MOVQ reg+16(FP), DI
	MOVQ a+24(FP), SI
	MOVQ na+32(FP), CX
	TESTQ CX, CX
	JZ second
loopa:
	MOVQ (SI), DX
	MOVQ DX, (DI)
	ADDQ $8, SI
	ADDQ $8, DI
	DECQ CX
	JNZ loopa
second:
	MOVQ b+40(FP), SI
	MOVQ nb+48(FP), CX
	TESTQ CX, CX
	JZ done
loopb:
	MOVQ (SI), DX
	MOVQ DX, (DI)
	ADDQ $8, SI
	ADDQ $8, DI
	DECQ CX
	JNZ loopb
done:
	SFENCE
	RET

// func storeRecord(rec *uint32, v uint32)
// A plain 32-bit store of a doorbell record (receive producer index, CQ
// consumer index). x86 keeps stores in program order, so earlier WQE stores
// are visible first; being an assembly call it is also a compiler barrier.
TEXT ·storeRecord(SB), NOSPLIT, $0-12
	MOVQ rec+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, (AX)
	RET
