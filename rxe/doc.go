// Package rxe is the Soft-RoCE (rdma_rxe) provider for package uverbs.
//
// rxe keeps its completion queue and send/receive queues in kernel memory
// that user space maps through the uverbs fd (struct rxe_queue_buf, the mmap
// offsets come back in the CREATE_CQ and CREATE_QP driver responses). Posting
// writes struct rxe_send_wqe / rxe_recv_wqe into the rings and publishes the
// producer index with a release store; sends are then "kicked" with an empty
// POST_SEND write() (wr_count 0), which runs the requester in the calling
// thread (6.1 kernels; later ones schedule it). Posts of up to 256 KiB of
// payload kick with ucmd.QuickWrite, a raw write that keeps the goroutine's
// P: the scheduler's syscall hand-off cost more than it saved, on a small
// round trip and on a stream of 64 KiB slices alike. Receives need no syscall. Polling reads struct ib_uverbs_wc entries
// in place and publishes the consumer index. Arming a CQ is the core
// REQ_NOTIFY_CQ command.
//
// Supported: RC, UC and UD QPs (UD through kernel AH numbers, kernel 5.11+),
// all RC opcodes up to atomics, inline data, completion events. Not
// supported: SRQ, memory windows, LOCAL_INV/SEND_WITH_INV.
//
// rxe facts tests rely on: a send with a bad lkey completes with
// WCLocQPOpErr (not WCLocProtErr); retry_cnt 7 retries forever; a move to
// SQD with notification raises EventSQDrained; a CQ overflow raises
// EventCQErr.
//
// Post and poll allocate nothing.
package rxe
