// Package mlx5sim is a simulated ConnectX fabric for tests: devices whose
// uverbs command file (uverbs.Options.OpenFile) is answered in process
// with mlx5's driver data, and an HCA that executes the work queues the
// real mlx5 provider builds.
//
// The kernel half answers the commands a verbs context issues on the way
// to RC traffic (GET_CONTEXT with mlx5's context sizes and static UAR
// layout, QUERY_DEVICE, QUERY_PORT, QUERY_GID_TABLE, PD, MR, completion
// channel, CQ and QP create, modify and destroy) and serves the UAR pages
// from a memfd, so the provider maps them from the command fd as it does
// on a device. Completion channels and the async-event file are pipes:
// the context reads events from them as from the kernel's files.
//
// The HCA half follows the doorbell records of every QP in the fabric,
// parses the WQEs (control, remote-address, data and inline segments),
// checks lkeys and rkeys against registered MRs (range, access, PD),
// moves the bytes between the QPs' contexts (RDMA WRITE, READ, SEND,
// SEND and WRITE with immediate into the peer's receive queue, and the
// two atomics on host-order words), refuses a SEND with no receive
// posted until the QP's RNR retries run out, writes CQE64s with the owner
// bit on each side's CQ, flushes a QP in the error state, and raises a
// completion event on a CQ's channel when the CQ was armed (by its arm
// doorbell) and a CQE lands. It never touches the provider's Go state:
// only the mmap'd rings, records and UAR page. It allocates nothing per
// work request.
//
// Loopback is the same HCA reduced to one QP connected to itself over
// rings a test built without a kernel (package mlx5's ring tests): it
// completes work by length only.
//
// A device's port can be taken down and up (Fabric.SetPort): async
// events on its contexts, and work from or to it waits as on a link that
// carries nothing. A request to a QP that is gone, or over a link that is
// down, waits out the QP's retry bound (uverbs.RetryBound of its ACK
// timeout and retry count) and completes with a retry-exceeded error,
// unless the link comes back first.
//
// A policy may hold work requests in flight (Fabric.SetPolicy,
// Fabric.Release), which is how tests place a completion at a chosen
// moment. What it does not model: SRQs, UD, inline receives,
// packets and their timing (data moves at once, whole), and arm requests
// of two CQs of one context between two HCA passes (a rail has one CQ per
// context).
package mlx5sim
