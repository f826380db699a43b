// Package ucmd is the uverbs command channel: the encoders for legacy write()
// commands (ib_uverbs_cmd_hdr, optionally followed by ib_uverbs_ex_cmd_hdr)
// and for RDMA_VERBS_IOCTL (ib_uverbs_ioctl_hdr + ib_uverbs_attr array), and
// the File that issues them on /dev/infiniband/uverbsN.
//
// Command memory. The kernel reads requests and writes responses through
// addresses stored inside other buffers (the response pointer of a write
// command, PTR_IN/PTR_OUT attributes) and writes new handles and fds back
// into the attribute array. Such memory must not move during the syscall, and
// Go stacks move. Every command is therefore built in a per-File arena of
// mmap'd memory that the Go runtime does not manage, serialized by a mutex;
// the encoders take that buffer plus its address and are pure functions, so
// they are tested byte for byte on any machine.
package ucmd
