// MMIO and barrier primitives for the mlx5 data path (arm64).
//
// arm64 orders neither stores to memory nor stores to device memory for
// free, so each step carries rdma-core's aarch64 barrier (util/udma_barrier.h):
//   - DMB OSHST before the doorbell record (udma_to_device_barrier): WQE
//     stores reach the outer-shareable domain, where the HCA reads, first;
//   - DSB ST after it (mmio_wc_start): the record is complete before the
//     write-combining store that wakes the device;
//   - the wake-up is ONE aligned 64-bit store (MOVD); BlueFlame copies the
//     WQE with ascending 64-bit stores;
//   - DSB ST after it (mmio_flush_writes): the WC buffer drains before the
//     register half can be reused.
// Go never inlines assembly functions, so each call is also a compiler
// barrier: stores made in Go before the call cannot sink below it.
//
// DMB/DSB option encodings (CRm): OSHLD 0x1, OSHST 0x2, OSH 0x3, ST 0xe.

#include "textflag.h"

// func ringDoorbell(rec *uint32, recVal uint32, reg *uint64, val uint64)
TEXT ·ringDoorbell(SB), NOSPLIT, $0-32
	MOVD rec+0(FP), R0
	MOVWU recVal+8(FP), R1
	MOVD reg+16(FP), R2
	MOVD val+24(FP), R3
	DMB $0x2
	MOVW R1, (R0)
	DSB $0xe
	MOVD R3, (R2)
	DSB $0xe
	RET

// func ringBlueFlame(rec *uint32, recVal uint32, reg *uint64, a *uint64, na uintptr, b *uint64, nb uintptr)
TEXT ·ringBlueFlame(SB), NOSPLIT, $0-56
	MOVD rec+0(FP), R0
	MOVWU recVal+8(FP), R1
	DMB $0x2
	MOVW R1, (R0)
	DSB $0xe
	MOVD reg+16(FP), R2
	MOVD a+24(FP), R3
	MOVD na+32(FP), R4
	CBZ R4, second
loopa:
	MOVD.P 8(R3), R5
	MOVD.P R5, 8(R2)
	SUB $1, R4
	CBNZ R4, loopa
second:
	MOVD b+40(FP), R3
	MOVD nb+48(FP), R4
	CBZ R4, done
loopb:
	MOVD.P 8(R3), R5
	MOVD.P R5, 8(R2)
	SUB $1, R4
	CBNZ R4, loopb
done:
	DSB $0xe
	RET

// func storeRecord(rec *uint32, v uint32)
// DMB OSH (loads and stores): a consumer-index record must not become
// visible before the reads of the CQEs it hands back, a receive record not
// before the WQE stores it covers.
TEXT ·storeRecord(SB), NOSPLIT, $0-12
	MOVD rec+0(FP), R0
	MOVWU v+8(FP), R1
	DMB $0x3
	MOVW R1, (R0)
	RET

// func fromDeviceBarrier()
TEXT ·fromDeviceBarrier(SB), NOSPLIT, $0-0
	DMB $0x1
	RET
