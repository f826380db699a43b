// Package rdma is the engine's RDMA transport: slices become RDMA WRITE and
// READ work requests on reliable-connected QPs, spread over every rail (an
// RDMA device port) of both hosts.
//
// Per rail the transport owns one verbs context, PD, CQ and completion
// channel, and one owner goroutine that alone posts to the rail's QPs and
// polls its CQ, and creates, connects and destroys every QP on the rail
// (handshakes and target sessions ask it to), so nothing else ever holds
// the CQ's single-owner guard: submitters only enqueue (no lock is shared
// between rails),
// the owner chains the queued slices of one QP into one post, busy-polls
// while work is in flight and sleeps on the completion channel when idle. A
// completion finds its slice through wr_id, an index into a per-rail slot
// table sized to the CQ, so the CQ can never overflow and nothing is
// allocated per slice.
//
// Endpoints (QPsPerPath QPs between one local and one remote rail) are set
// up on first use through a handshake on the target's TCP control port
// (internal/wire frames). That connection stays open as the endpoint's
// lease: the target destroys an initiator's QPs when it closes, when the
// initiator handshakes again from a new epoch, or when the initiator evicts
// an idle endpoint; it bounds the QPs any one initiator may hold. An
// endpoint whose QP fails is torn down and rebuilt on next use.
//
// Rails are chosen per slice by the memory's location first
// (Config.Priority, or the NUMA node of a "cpu:N" region), then by which
// rail would finish its outstanding bytes first at its measured rate, so a
// slow rail gets fewer bytes; a rail whose port goes down (async event, or
// its state read after a failure) stops taking slices and its QPs are
// flushed, so their slices are retried on the other rails; it is used
// again when the port comes back. A peer that dies fails its slices at
// once when its control connection closes, or within the QP retry bound
// (uverbs.RetryBound of QPTimeout and RetryCount) when its host is gone. A
// work request the device never completes fails its slice after
// Config.SliceTimeout (ErrSliceTimeout) instead of hanging it.
//
// Completion notifications (driver.Notifier, docs/notify.md) ride the
// same QPs: a note is a SEND, either posted once every slice of its
// submission has completed or, with Config.NotifyMarkers, posted as a
// marker behind the data on every QP the submission used (RC orders a
// SEND after the earlier WRITEs of its QP only), the target delivering
// once all markers are in. Responder QPs keep receive buffers posted
// (registered memory outside the Go heap, replenished by the rail's
// owner); an initiator SENDs only against a credit, a receive the target
// has posted, and credits come back on the control connection, so no
// SEND meets an empty receive queue and a target whose inbox is full
// holds that sender's credits: back-pressure on that sender alone.
package rdma
