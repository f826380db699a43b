package engine

import (
	"errors"
	"fmt"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// Errors returned by the engine; compare with errors.Is. Returned errors
// wrap these with context (which request, which address).
var (
	// ErrClosed: the engine (or a transport) was closed.
	ErrClosed = driver.ErrClosed
	// ErrSegmentNotFound: the segment is not open, was closed, or its owner
	// unpublished it. It wraps segment.ErrNotFound.
	ErrSegmentNotFound = fmt.Errorf("engine: unknown segment: %w", segment.ErrNotFound)
	// ErrOutOfRange: a target range lies outside the target's exposed
	// buffers. It wraps segment.ErrOutOfRange.
	ErrOutOfRange = driver.ErrOutOfRange
	// ErrNotRegistered: a local range is not inside registered memory.
	ErrNotRegistered = errors.New("engine: local range not in registered memory")
	// ErrOverlap: memory to register overlaps an already registered region.
	ErrOverlap = errors.New("engine: region overlaps registered memory")
	// ErrMemoryBusy: memory cannot be unregistered while transfers use it.
	ErrMemoryBusy = driver.ErrMemoryBusy
	// ErrInvalidRequest: a request is malformed (zero length, bad op,
	// length beyond its local slice).
	ErrInvalidRequest = errors.New("engine: invalid request")
	// ErrInvalidBatch: the BatchID is unknown or was freed.
	ErrInvalidBatch = errors.New("engine: invalid batch")
	// ErrInvalidTask: the task index is not a submitted task of the batch.
	ErrInvalidTask = errors.New("engine: invalid task")
	// ErrBatchFull: a submission would exceed the batch's capacity.
	ErrBatchFull = errors.New("engine: batch capacity exceeded")
	// ErrBatchBusy: the batch still has tasks in flight.
	ErrBatchBusy = errors.New("engine: batch has tasks in flight")
	// ErrSegmentBusy: the segment still has tasks in flight.
	ErrSegmentBusy = errors.New("engine: segment has tasks in flight")
	// ErrNoTransport: no installed transport can reach the segment (or the
	// requested transport is not installed or not offered by the
	// segment). It wraps segment.ErrNoProtocol.
	ErrNoTransport = fmt.Errorf("engine: no usable transport: %w", segment.ErrNoProtocol)
	// ErrTransportExists: a transport of that name is already installed.
	ErrTransportExists = errors.New("engine: transport already installed")
	// ErrTransportBusy: the transport still carries tasks in flight.
	ErrTransportBusy = errors.New("engine: transport has tasks in flight")
	// ErrTooManyTransports: all transport slots are in use.
	ErrTooManyTransports = errors.New("engine: too many transports")
	// ErrPeerReset: the remote segment restarted (new epoch) or went away
	// while a transfer was in flight.
	ErrPeerReset = driver.ErrPeerReset
	// ErrTransient marks a slice failure worth one more try on a fresh
	// connection (a connection that broke). Transports wrap it; the
	// engine retries such slices up to Config.Retries times.
	ErrTransient = driver.ErrTransient
	// ErrNotSupported: the operation is not available on this platform.
	ErrNotSupported = errors.New("engine: not supported")
)
