// Package tcp is the transfer engine's TCP transport: persistent, pipelined
// lanes between initiator and target, a small versioned binary framing, and
// a receiver that copies straight into and out of registered memory after
// checking every range.
//
// Initiator side: each remote segment (engine.Peer) gets Config.Lanes TCP
// connections, dialled on first use and redialled after a failure. The
// engine's slices of one submission are spread over the lanes in
// contiguous runs. Each lane has one writer goroutine, which gathers all
// queued frames into one writev (headers from a per-lane arena, payloads
// straight from registered memory), and one reader goroutine, which
// matches replies to requests by id (replies come back in request order)
// and completes the slices. READ payloads are read straight into the local
// registered memory. Nothing is allocated per slice in steady state.
//
// Target side: a listener (its address is the tcp Protocol Endpoint of the
// local descriptor) and one goroutine per accepted connection, which
// serves requests in order, checks each range with engine.Host.AcquireLocal
// (pinning the region while it copies), and batches its replies into one
// write whenever it has no further request buffered.
//
// Failures: a broken connection fails every slice in flight on it with an
// error wrapping ErrConnection (and engine.ErrTransient: the engine tries
// such a slice again, on a new connection, up to its Retries); a lane whose
// oldest request saw no reply for Config.IOTimeout is closed and its
// slices fail with ErrTimeout, so a hung or dead peer fails tasks within a
// bounded time. A submission after a failure dials again. On the target
// side the same timeout bounds a blocked reply write and a stalled payload
// read, so no initiator can keep registered memory pinned, and the wait
// for a new connection's HELLO; at most Config.MaxConns initiator
// connections are served at once, so no client can make the target
// allocate without bound. A target that restarted (a new epoch) refuses the connection's HELLO and
// the slices fail with engine.ErrPeerReset.
//
// The wire format is documented at the constants in frame.go.
package tcp
