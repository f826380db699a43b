// Package tcp is the transfer engine's TCP transport: persistent, pipelined
// lanes between initiator and target, a small versioned binary framing, and
// a receiver that copies straight into and out of registered memory after
// checking every range.
//
// Initiator side: each remote segment (driver.Peer) gets Config.Lanes TCP
// connections, dialled on first use and redialled after a failure. The
// engine's slices of one submission are spread over the lanes in
// contiguous runs. Each lane has one writer goroutine, which gathers all
// queued frames into one writev (headers from a per-lane arena, payloads
// straight from registered memory; a run of small slices of one op goes
// as one vector frame), and one reader goroutine, which matches replies
// to requests by id (replies come back in request order) and completes
// the slices, a vector's together. While callers of the engine's Wait are
// about (driver.Helper), a reader that finds its lane with nothing in
// flight parks, and the waiter of the next batch on that lane reads its
// replies itself, saving the hand-off from the reader to the waiter;
// a reply no waiter takes within a few milliseconds goes back to the
// reader goroutine (waitread.go). Large READ payloads and a vector's are
// read straight into the local registered memory (readv). Nothing is
// allocated per slice in steady state.
//
// Target side: a listener (its address is the tcp Protocol Endpoint of the
// local descriptor) and one goroutine per accepted connection, which
// serves requests in order, checks each range with driver.Host.AcquireLocal
// (pinning the region while it copies; a vector's entries one by one, its
// payloads then read straight into memory with readv), and batches its
// replies into one write whenever it has no further request buffered.
//
// Handshake: every connection opens with te's handshake (internal/control:
// hello, challenge, answer, verdict): the initiator names the target's segment
// and epoch, so nothing addressed to another incarnation (a restarted
// target: driver.ErrPeerReset) or another segment is served; with
// Config.Auth set on both sides each proves the cluster secret to the
// other (package auth), and a peer without it gets no lane and no byte of
// memory (auth.ErrDenied). Failed handshakes are logged with the peer's
// address, rate-limited.
//
// Failures: a broken connection fails every slice in flight on it with an
// error wrapping ErrConnection (and driver.ErrTransient: the engine tries
// such a slice again, on a new connection, up to its Retries); a lane whose
// oldest request saw no reply for Config.IOTimeout is closed and its
// slices fail with ErrTimeout, so a hung or dead peer fails tasks within a
// bounded time. A submission after a failure dials again.
//
// Hostile initiators: on the target side every wait on the initiator is
// bounded: the handshake, the rest of a frame once it has begun (header,
// payload, or a refused WRITE's discarded payload) and a blocked reply
// write each within Config.IOTimeout, and replies held for a burst's next
// request (the More flag) at most as long; so no initiator can keep
// registered memory pinned past the I/O timeout. Between requests a
// connection may idle, but at Config.MaxConns (or MaxConnsPerSource for
// one address) a new connection takes the slot of the one that has waited
// longest for its initiator, so idle connections cannot lock real
// initiators out. The accept loop survives running out of descriptors or
// memory (EMFILE, ENFILE, ENOMEM): it backs off and logs.
//
// The wire format is documented at the constants in frame.go.
package tcp
