package driver

import "errors"

// ErrTimeout marks a slice failure because the peer or the NIC did not
// answer in time (a lane's I/O timeout, a work request's slice timeout).
// Transports mark their own timeout errors with it so the engine can
// count failures by cause; it says nothing about retrying.
var ErrTimeout = errors.New("engine: timed out")

// Inspector is implemented by a transport that can describe its state:
// the engine's Snapshot (and through it te serve --admin and the metrics)
// includes what Inspect returns. Inspect is called by operators' tools,
// never on the data path: it may allocate and take the transport's locks
// briefly, but it must not wait on a peer, a NIC or a queue's owner, so
// that it answers while a transfer is stuck.
type Inspector interface {
	Inspect() TransportState
}

// TransportState is a transport's view of itself at one moment.
type TransportState struct {
	// Rails are the transport's devices (rdma: one per NIC port); empty
	// for a transport without any (tcp).
	Rails []RailState `json:"rails,omitempty"`
	// Paths are the live ways to peers: rdma endpoints (the QPs from a
	// local rail to a remote rail of one peer), tcp lanes.
	Paths []PathState `json:"paths,omitempty"`
	// Traffic holds the transport's counters per peer and rail or lane.
	// They count from the transport's start and never go back, across
	// reconnections and peer restarts.
	Traffic []PathTraffic `json:"traffic,omitempty"`
	// Served counts, per initiator (Rail empty), what remote initiators'
	// requests did to local memory, for a transport whose target side
	// sees them (tcp; one-sided rdma and shm do not).
	Served []PathTraffic `json:"served,omitempty"`
}

// RailState is one rail (a NIC port).
type RailState struct {
	Name string `json:"name"`
	Up   bool   `json:"up"`
	// Queued counts slices routed to the rail and not yet posted (waiting
	// for an endpoint's handshake, send credits or completion slots);
	// Posted those posted and not yet completed.
	Queued int64 `json:"queued"`
	Posted int64 `json:"posted"`
	// OutstandingBytes is the bytes queued or posted.
	OutstandingBytes int64 `json:"outstanding_bytes"`
	// Attrs are facts about the rail worth showing (gid, mtu, port).
	Attrs map[string]string `json:"attrs,omitempty"`
}

// PathState is one path to a peer: an rdma endpoint or a tcp lane.
type PathState struct {
	// Peer is the remote segment's name, Epoch its incarnation.
	Peer  string `json:"peer"`
	Epoch uint64 `json:"epoch,omitempty"`
	// Rail is the local rail (rdma) or the lane ("lane0"); Remote the
	// remote rail or address.
	Rail   string `json:"rail"`
	Remote string `json:"remote,omitempty"`
	// State is the path's state in the transport's words (rdma:
	// connecting, ready, broken, failed, closed; tcp: idle, dialing,
	// connected, writing).
	State string `json:"state"`
	// Queued counts slices waiting on the path and not yet posted or
	// written; Posted those posted or written and awaiting completion.
	Queued int64 `json:"queued"`
	Posted int64 `json:"posted"`
	// Err is why the path last failed, if it did.
	Err string `json:"err,omitempty"`
}

// PathTraffic counts what one peer's slices did on one rail or lane.
type PathTraffic struct {
	Peer string `json:"peer"`
	Rail string `json:"rail,omitempty"`
	// ReadBytes, WriteBytes, ReadSlices and WriteSlices count completed
	// slices; Failures failed ones.
	ReadBytes   uint64 `json:"read_bytes"`
	WriteBytes  uint64 `json:"write_bytes"`
	ReadSlices  uint64 `json:"read_slices"`
	WriteSlices uint64 `json:"write_slices"`
	Failures    uint64 `json:"failures"`
	// Connects counts connections or endpoints made on the path.
	Connects uint64 `json:"connects"`
}
