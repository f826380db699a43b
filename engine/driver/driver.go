// Package driver is the contract between the transfer engine and its
// transports, after database/sql/driver: what a transport (tcp, rdma, shm,
// or one of your own) implements and what the engine hands it. Programs
// that move bytes use package engine; only transport authors import this
// package.
//
// The engine owns requests, tasks, batches and slicing; a transport only
// executes slices (Slice) whose every address, key and endpoint the engine
// has already resolved and checked, and serves remote initiators' accesses
// to local memory through Host. A transport that carries notifications
// implements Notifier and hands arrivals to Host.Inbox. Tests of a new Transport start with
// engine/transporttest.Run.
package driver

import (
	"context"
	"log/slog"

	"github.com/rdmago/te/segment"
)

// Transport moves slices to and from remote segments over one protocol
// (tcp, rdma, shm).
//
// Call order: Install once, then any mix of RegisterMemory,
// UnregisterMemory, Describe, Connect and Submit (concurrently), then Close
// once. Implementations must be safe for concurrent use.
type Transport interface {
	// Name is the protocol name, matched against segment.Protocol.Name
	// in descriptors (segment.ProtoTCP, segment.ProtoRDMA).
	Name() string
	// Install attaches the transport to an engine and starts whatever
	// serves remote initiators (a listener, QP handshakes). Target-side
	// accesses go through h, which checks them against registered memory.
	Install(h Host) error
	// Describe adds the transport's Protocol entry to the local
	// descriptor (appended to d.Protocols), with its typed part (for
	// rdma the rails and the keys of every buffer in d.Buffers, which is
	// already filled).
	Describe(d *segment.Descriptor) error
	// RegisterMemory prepares a newly registered region for transfers
	// (memory registration with each NIC). The returned key is opaque to
	// the engine and comes back in Slice.LocalKey and UnregisterMemory.
	RegisterMemory(r Region) (key any, err error)
	// UnregisterMemory releases what RegisterMemory prepared. The engine
	// calls it only when no transfer uses the region.
	UnregisterMemory(r Region, key any) error
	// Connect returns the transport's state for one incarnation of a
	// remote segment (endpoint addresses, connections, queue pairs). It may
	// set up connections eagerly or lazily. The engine calls it again,
	// after closing the old Peer, when the remote epoch changes, and within
	// one epoch when the transport's protocol entry changes or, for a
	// PeerKeeper, when KeepPeer says so; otherwise a new version of the
	// descriptor keeps the Peer (slices carry the current buffer).
	Connect(ctx context.Context, remote *segment.Descriptor) (Peer, error)
	// SliceSize is the largest slice the transport wants; the engine cuts
	// requests into slices of at most this many bytes unless configured
	// otherwise. Zero means no cutting.
	SliceSize() uint64
	// Submit starts the slices. Every slice must be completed exactly once
	// with Slice.Done — possibly before Submit returns, possibly from
	// another goroutine — whatever happens: failures are reported per
	// slice, never dropped. Submit must not block on a peer indefinitely.
	// The ss slice itself may be reused by the engine after Submit returns.
	//
	// Submit is re-entered: Slice.Done of a slice failed with an error
	// wrapping ErrTransient resubmits it (Attempt() > 0) by calling Submit
	// from inside Done, on the goroutine that called Done: the transport's
	// completion poller, or Submit itself when it fails a slice at once.
	// There Submit must only enqueue: it must not wait for completions or
	// queue space that only the calling goroutine would deliver (the
	// poller would deadlock on itself), and the transport must not call
	// Done while holding a lock that Submit takes.
	Submit(ss []*Slice)
	// Close stops the transport, fails every slice still in flight and
	// releases its resources, memory registrations included (the engine
	// does not call UnregisterMemory on Close). It is idempotent.
	Close() error
}

// Reacher is implemented by a transport that can serve only some of the
// segments offering its protocol: shm reaches only segments on the same
// host (and of the same user). The engine never chooses a transport for a
// segment it does not reach, not even when a request or OpenOptions names
// it. Reaches must not allocate; the engine calls it per request.
type Reacher interface {
	Reaches(remote *segment.Descriptor) bool
}

// UnreachableExplainer is implemented by a Reacher that can say why it
// does not reach a segment. The engine puts the reason into the error of a
// request or OpenOptions that names the transport, so the user learns what
// to change (shm: the target's memory is not from engine.AllocShared, it
// runs on another host or as another user).
type UnreachableExplainer interface {
	// Unreachable returns why remote is not reached, nil when it is.
	Unreachable(remote *segment.Descriptor) error
}

// PeerKeeper is implemented by a transport that decides itself which
// descriptor changes its Peer survives; without it any change of the
// transport's Protocol entry gets a fresh Connect. rdma's entry holds
// keys per buffer, and buffers come and go under one Peer.
type PeerKeeper interface {
	// KeepPeer reports whether a Peer connected for old still serves
	// new, a later version of the same incarnation (both offering the
	// transport's protocol). It is called when the store reports a new
	// version, not per request.
	KeepPeer(old, new *segment.Descriptor) bool
}

// Peer is a transport's state for one incarnation of a remote segment.
// Closing it fails its slices still in flight (with an error wrapping
// ErrPeerReset or ErrClosed) and releases its connections.
type Peer interface {
	Close() error
}

// Host is the engine as its transports see it: local identity and
// target-side access to registered memory.
type Host interface {
	// LocalName is the local segment's name.
	LocalName() string
	// Epoch is the local segment's epoch (random per engine). Transports
	// may use it to refuse initiators that address a previous incarnation.
	Epoch() uint64
	// AcquireLocal finds the registered region holding all of
	// [addr, addr+length), pins it against unregistration and returns the
	// bytes of that range. The caller must call r.Release when it no
	// longer touches mem. It fails with an error wrapping ErrOutOfRange
	// (range not inside one registered region) or ErrMemoryBusy (region
	// being unregistered). It does not allocate on success.
	AcquireLocal(addr, length uint64) (mem []byte, r Region, err error)
	// Logger is the engine's logger.
	Logger() *slog.Logger
	// Inbox receives the notifications a Notifier's target side
	// carries in.
	Inbox() Inbox
}

// Region is a registered range of local memory. The engine creates it when
// the user registers memory and hands it to transports through
// RegisterMemory, Slice.LocalRegion and Host.AcquireLocal. Regions compare
// equal (==) when they are the same registration.
type Region interface {
	// Addr is the region's first virtual address.
	Addr() uint64
	// Len is the region's length in bytes.
	Len() uint64
	// Location is the memory's location tag (cpu:0, cuda:3).
	Location() string
	// Bytes returns the whole region.
	Bytes() []byte
	// SharedFD returns the memory file behind the region and the
	// region's offset in it, when the region lies in memory from
	// engine.AllocShared; ok is false otherwise. The descriptor stays
	// open while the region is registered; the caller must not close it.
	SharedFD() (fd int, off uint64, ok bool)
	// Release drops a pin taken by Host.AcquireLocal.
	Release()
}

// Helper is implemented by a transport whose completions the caller of
// the engine's Wait can read itself, on its own goroutine, instead of
// being woken by the transport's goroutine that read them: on a loopback
// TCP lane that hand-off (the reader readying the waiter, the runtime
// waking an idle thread for it) costs as much as a tenth of a batch.
//
// The engine calls Help from Wait while the batch is in flight, with
// done reporting whether the batch has finished. Help completes what it
// reads through Slice.Done and DoneAll as the transport's goroutines
// would (slices of other batches included) and returns when done
// reports true, when nothing is left that this caller can read (the
// transport's goroutines deliver the rest), or soon after ctx ends: it
// must not wait on a peer past ctx, nor for long without making
// progress. It must not allocate.
type Helper interface {
	Help(ctx context.Context, done func() bool)
}
