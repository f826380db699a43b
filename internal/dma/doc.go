// Package dma owns memory that the kernel or a device reads and writes behind
// the Go runtime's back: anonymous mappings for registered buffers, shared
// mappings of kernel queues (rxe rings) on the uverbs fd, typed views into
// them, and the named memory-ordering operations the data paths need.
//
// Memory ordering for the rxe rings (kernel 6.1 rxe_queue.h pairs with this):
//
//   - Producer (SQ/RQ, user -> kernel): write the whole WQE with plain stores,
//     then StoreRelease32 the new producer index. The kernel reads the
//     producer index with smp_load_acquire, so it observes the WQE bytes.
//   - Full check: LoadAcquire32 of the kernel-owned consumer index before
//     reusing a slot the kernel may still be reading.
//   - Consumer (CQ, kernel -> user): LoadAcquire32 the producer index; read
//     the CQE; then StoreRelease32 the consumer index so the kernel does not
//     overwrite a slot before we finished reading it.
//
// On amd64 (TSO) an acquire load is a plain load and a release store is a
// plain store plus a compiler barrier. Go's sync/atomic Load/Store are
// sequentially consistent (the store compiles to XCHG), which is stronger than
// needed and still cheap next to the syscall that kicks rxe. They are also the
// only way to stop the Go compiler from reordering or caching the accesses.
// Device MMIO (mlx5 doorbells) needs SFENCE and is not handled here.
package dma
