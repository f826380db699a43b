package mlx5

// mmioSupported reports whether this architecture has the MMIO primitives
// the mlx5 data path needs.
const mmioSupported = true

// ringDoorbell stores recVal to the doorbell record, SFENCE (rdma-core's
// mmio_wc_start), one 64-bit store of val to the register, SFENCE
// (mmio_flush_writes).
//
//go:noescape
func ringDoorbell(rec *uint32, recVal uint32, reg *uint64, val uint64)

// ringBlueFlame stores recVal to the doorbell record, SFENCE, copies na
// words from a then nb words from b to reg with 64-bit stores, SFENCE.
//
//go:noescape
func ringBlueFlame(rec *uint32, recVal uint32, reg *uint64, a *uint64, na uintptr, b *uint64, nb uintptr)

// storeRecord is a plain 32-bit store that the compiler cannot move.
//
//go:noescape
func storeRecord(rec *uint32, v uint32)

// fromDeviceBarrier orders CQE reads after the owner check. On x86-64 the
// acquire load of the owner word already does (loads are not reordered
// with older loads, and device writes to cacheable memory are coherent),
// so it is empty; arm64 issues DMB OSHLD.
func fromDeviceBarrier() {}
