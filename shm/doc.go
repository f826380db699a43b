// Package shm is the same-host transport: a target's registered memory,
// allocated with engine.AllocShared (a sealed memfd mapped shared), is
// handed to initiators on the same host over a unix socket, and from then
// on a WRITE or READ is a memory copy done by the initiator, with no
// system call per request and no work on the target's CPU.
//
// # Reaching a target
//
// The target advertises an shm protocol entry: an abstract unix socket
// name (no file anywhere, gone with the process) and the identity of its
// host (boot id and network namespace, internal/hostid) and user. An
// initiator's transport reaches the segment (driver.Reacher) only when
// both match its own and every buffer the target registered is
// shareable; the engine then prefers shm over rdma and tcp. Elsewhere shm
// is never chosen, not even when a request names it.
//
// # Handshake
//
// The target checks the connecting process's credentials (SO_PEERCRED:
// same user only), the initiator the target's; then the auth handshake
// (cluster secret, when authentication is on) runs before any memory is
// handed out. The target then sends a control page (a small memfd of its
// own per connection) and, with SCM_RIGHTS, the memory file of every
// registered region, which the initiator maps. Regions registered later
// are fetched on first use (MAPREQ).
//
// # Lifetime and safety
//
// The control page holds, per region slot, a generation the target sets
// while the region is live and a busy counter the initiator raises around
// each copy. A copy raises busy, then checks the generation; an
// unregistration zeroes the generation, then waits for busy to drop
// (sequentially consistent atomics on both sides, so one of them always
// sees the other): once UnregisterMemory returns, no copy into the region
// is in progress and none starts, and the initiator is told to unmap.
// A peer stuck inside one copy for longer than IOTimeout is disconnected
// and logged; its copy of at most one slice may still land. The memory
// file's pages outlive the target's own mapping while a peer maps them,
// so memory the target allocates later is never what a stale peer
// writes. A target that exits, crashes or restarts (new epoch) closes the
// socket: its initiators fail what they have not copied with
// driver.ErrPeerReset and unmap everything. An initiator that dies closes
// its end: the target drops its control page. Nothing is left in /dev/shm
// or in the file system.
//
// The engine's range checks apply as for every transport; the initiator
// checks each slice against the mapping as well.
package shm
