package driver

import (
	"sync/atomic"

	"github.com/rdmago/te/segment"
)

//go:generate go tool stringer -linecomment -type Op

// Op is a transfer direction, seen from the initiator.
type Op uint8

// Ops.
const (
	// Read copies from the target segment into local memory.
	Read Op = 1 // READ
	// Write copies from local memory into the target segment.
	Write Op = 2 // WRITE
)

// Slice is one piece of a task, resolved for one transport. Transports
// read its fields and call Done exactly once; they must not keep the
// pointer after Done.
type Slice struct {
	Op Op
	// Local is the local side: the bytes to send (Write) or to fill (Read).
	// It lies inside LocalRegion, which stays registered until Done.
	Local []byte
	// LocalAddr is the virtual address of Local[0].
	LocalAddr uint64
	// LocalRegion is the registered region holding Local.
	LocalRegion Region
	// LocalKey is what this transport's RegisterMemory returned for
	// LocalRegion.
	LocalKey any
	// RemoteAddr is the target address of the first byte, in the target's
	// address space. [RemoteAddr, RemoteAddr+len(Local)) lies inside
	// RemoteBuffer.
	RemoteAddr uint64
	// RemoteBuffer is the target's descriptor entry holding the range.
	// Read-only.
	RemoteBuffer *segment.Buffer
	// RemoteIndex is RemoteBuffer's index in Remote.Buffers, which also
	// indexes per-buffer lists of protocol parts (segment.RDMA.RKeys).
	RemoteIndex int
	// Remote is the target's descriptor this slice was resolved against.
	// Read-only.
	Remote *segment.Descriptor
	// Peer is what this transport's Connect returned for the target.
	Peer Peer

	c        Completer
	attempt  int
	canceled *atomic.Bool // the submission's cancel flag (BindCanceled); nil: ask c
}

// Completer is the engine's side of a slice: Done hands it the outcome,
// Posted its progress. Transports do not implement it.
type Completer interface {
	Complete(n uint64, err error)
	Posted()
}

// Bind readies s for a submission whose outcome goes to c; attempt is what
// Attempt reports. Only the engine calls it, before each Submit of s.
func (s *Slice) Bind(c Completer, attempt int) {
	s.c = c
	s.attempt = attempt
}

// BindCanceled makes Canceled read flag, the cancel flag of the slice's
// submission. Only the engine calls it, with Bind, for every slice it
// hands to a transport; the flag stays across resubmissions.
func (s *Slice) BindCanceled(flag *atomic.Bool) {
	s.canceled = flag
}

// Attempt is 0 for a slice's first submission and counts its retries
// after transient failures; a transport may route retries differently
// (to a fresh connection).
func (s *Slice) Attempt() int { return s.attempt }

// Posted tells the engine that this submission of the slice has left the
// transport's queue: its work request is posted to the NIC, or its request
// is written (or being written) to a connection. What is in flight then
// waits on the peer or the network, not on this process, and the engine's
// Snapshot says so. Call it at most once per submission and before Done
// (a slice completed without it counts as completed from the queue). It
// does not allocate.
func (s *Slice) Posted() {
	if c := s.c; c != nil {
		c.Posted()
	}
}

// Done completes the slice with the number of bytes moved and an error
// (nil on success). An error wrapping ErrTransient is retried (submitted
// again to the same transport and peer, from inside Done) up to the
// engine's Config.Retries times before it fails the task; the transport
// must treat the retry as a new slice. Done does not allocate on success.
// Calling it twice for one submission panics.
func (s *Slice) Done(n uint64, err error) {
	c := s.c
	if c == nil {
		panic("engine: Slice.Done called twice")
	}
	s.c = nil
	c.Complete(n, err)
}

// batchCompleter is implemented by the engine's completers: it accounts
// for several successful slices at once.
type batchCompleter interface {
	CompleteAll(ss []*Slice)
}

// DoneAll completes every slice of ss as moved in full, as
// Done(uint64(len(s.Local)), nil) one after the other would, but lets the
// engine account for them together: a few atomic operations for a run of
// slices of one batch, segment and transport instead of several per
// slice. A slice already completed panics, as with Done. ss may be
// handed on: it must not be on the caller's stack frame only (pass a
// buffer the transport keeps), or it is copied to the heap.
func DoneAll(ss []*Slice) {
	if len(ss) == 0 {
		return
	}
	if bc, ok := ss[0].c.(batchCompleter); ok {
		bc.CompleteAll(ss)
		return
	}
	for _, s := range ss {
		s.Done(uint64(len(s.Local)), nil)
	}
}

// Take returns the completer of s's submission and marks s done; only
// the engine calls it, for the slices DoneAll hands it. A slice already
// completed panics, as with Done.
func (s *Slice) Take() Completer {
	c := s.c
	if c == nil {
		panic("engine: Slice.Done called twice")
	}
	s.c = nil
	return c
}
