// Package uverbs is a verbs library written directly against the Linux
// uverbs ABI (/dev/infiniband/uverbsN): no cgo, no libibverbs.
//
// Control path. Commands go to the kernel as legacy write() commands or
// RDMA_VERBS_IOCTL calls (internal/ucmd), built in mmap'd memory so that no
// address handed to the kernel can move. Objects:
//
//	Devices / LookupDevice    sysfs + RDMA netlink discovery, GID tables
//	Open -> *Context          GET_CONTEXT; the async event fd exists before any CQ/QP
//	Context.AllocPD -> *PD    protection domain
//	PD.RegMR / AllocMR -> *MR memory regions over non-Go-heap memory (AllocBuffer)
//	Context.CreateCompChannel completion channel, waited on via the Go netpoller
//	Context.CreateCQ -> *CQ   completion queue
//	PD.CreateQP -> *QP        RC (Connect) or UD (ActivateUD) queue pair; Modify/Query/ToErr
//	PD.CreateAH -> *AH        address handle for UD sends
//
// Data path. A Provider chosen by the device's driver id (rxe for Soft-RoCE,
// mlx5 for ConnectX) implements PostSend, PostRecv, Poll and ReqNotify on
// memory it maps; these calls allocate nothing.
//
// Lifetimes. Every object has an idempotent Close. Parents refuse to close
// while children are open (ErrBusy); Context.Close destroys whatever is left
// and reports it (ErrLeak). LiveObjects lists every object not yet closed, so
// tests can prove nothing leaked. Closing the Context closes the device file,
// and the kernel then frees anything the process left behind.
//
// Concurrency. Context, PD and MR are safe for concurrent use. A QP's send
// side, its receive side and a CQ's poll side each belong to one goroutine at
// a time; concurrent use is detected and returns ErrConcurrent.
//
// Errors. Kernel failures are wrapped with the operation and device, and wrap
// the errno (errors.Is(err, syscall.EINVAL)). Data-path failures are the
// sentinels ErrQPState, ErrQueueFull, ErrTooManySGE, ErrInlineTooLarge and
// ErrInvalidWR. Failed work requests are completions, not errors: check
// WC.Status (or WC.Err).
package uverbs
