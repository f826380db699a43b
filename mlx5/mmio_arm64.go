package mlx5

// mmioSupported reports whether this architecture has the MMIO primitives
// the mlx5 data path needs.
const mmioSupported = true

// ringDoorbell: DMB OSHST (rdma-core's udma_to_device_barrier: the WQE is
// visible to the device before the record), the doorbell record store,
// DSB ST (mmio_wc_start), one 64-bit store of val to the register, DSB ST
// (mmio_flush_writes).
//
//go:noescape
func ringDoorbell(rec *uint32, recVal uint32, reg *uint64, val uint64)

// ringBlueFlame is ringDoorbell with the register store replaced by a copy
// of na words from a then nb words from b, with 64-bit stores.
//
//go:noescape
func ringBlueFlame(rec *uint32, recVal uint32, reg *uint64, a *uint64, na uintptr, b *uint64, nb uintptr)

// storeRecord stores a doorbell record (receive producer index, CQ
// consumer index) after DMB OSH, so every earlier store to the rings, and
// every earlier read of a CQE the record gives back, is ordered before it
// as the device sees it. arm64 keeps neither stores nor loads before
// stores in program order.
//
//go:noescape
func storeRecord(rec *uint32, v uint32)

// fromDeviceBarrier is DMB OSHLD (rdma-core's udma_from_device_barrier):
// after a CQE's owner byte says it is valid, the rest of the CQE is read
// only after it, as the device wrote it.
//
//go:noescape
func fromDeviceBarrier()
