// Package mlx5 is the verbs provider for NVIDIA ConnectX-4 and later
// (kernel driver mlx5_ib): the direct data path, in Go, without cgo.
//
// The kernel does only the control path. This package allocates the CQ
// ring, the QP work queues and the doorbell records in mmap'd memory the
// kernel pins, maps the UAR pages of the uverbs fd, writes send and receive
// WQEs in the device's format, rings doorbells, and polls CQEs by owner bit,
// byte-compatible with rdma-core's mlx5 provider (checked against
// infiniband/mlx5dv.h by the tests).
//
// Choices and their reasons:
//   - CQE version 1: CQEs name their QP by a per-context user index, looked
//     up in a lock-free two-level table; indexes are never reused, so a late
//     CQE of a destroyed QP is dropped rather than misattributed. On RESET
//     and destroy the core calls CQ.Clean (uverbs.CQCleaner) under the CQ's
//     owner guard, which removes the QP's unpolled CQEs from the ring, so a
//     stale one can never complete work posted after a RESET. A CQE of no
//     known user index ends a poll with uverbs.ErrStrayCompletion.
//   - Static 4 KiB UARs by default: no driver ioctl is needed; the kernel
//     assigns each QP a bfreg. Dedicated (low-latency) bfregs are rung
//     without a lock, shared ones under a per-register mutex. Pages are
//     mapped write-combining (REGULAR) only when the device reports
//     BlueFlame registers (bf_reg_size > 0), uncached otherwise.
//     Options.DynamicUAR instead allocates a UAR page per QP (and one for
//     CQ arms) with the driver's UAR_OBJ_ALLOC ioctl: BlueFlame type only
//     with bf_reg_size > 0, never a shared register. Kernels without
//     dynamic UARs ignore the request and the static path is used.
//   - No scatter-to-CQE: every payload lands in the posted buffers.
//   - The send doorbell is: doorbell record, SFENCE, one 64-bit MOVQ to the
//     register, SFENCE, then the register half alternates; a single small
//     inline WQE is copied whole (BlueFlame) with 64-bit stores. On arm64
//     (Grace and other Neoverse hosts) the same steps carry rdma-core's
//     aarch64 barriers: DMB OSHST before each doorbell record, DSB ST
//     around the register store, DMB OSHLD after a CQE's owner check.
//     These live in mmio_amd64.s and mmio_arm64.s; the only other code that
//     makes pointers from memory is mem_unsafe.go. Other architectures
//     compile (builders and decoders work) but cannot open a context.
//   - RC only; no SRQ, memory windows or UMR, so a one-SGE WQE fits one
//     64-byte block (rdma-core reserves 4 for memory-window binds).
//
// Concurrency: each queue has one owner at a time (the uverbs core enforces
// it): PostSend, PostRecv and a CQ's Poll/Arm may each run on a different
// goroutine. What a poster and a poller share (published head, completed
// tail, work request IDs) is handed over with atomic release/acquire, so
// the data path takes no lock; only a doorbell register shared between
// QPs (static UARs beyond the 4 dedicated ones) is rung under a mutex.
package mlx5
