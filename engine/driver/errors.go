package driver

import (
	"errors"
	"fmt"

	"github.com/rdmago/te/segment"
)

// Errors a transport reports and checks; package engine returns the same
// values to users (engine.ErrClosed is ErrClosed), so wrap them, and
// compare with errors.Is.
var (
	// ErrClosed: the engine (or a transport) was closed.
	ErrClosed = errors.New("engine: closed")
	// ErrPeerReset: the remote segment restarted (new epoch) or went away
	// while a transfer was in flight.
	ErrPeerReset = errors.New("engine: peer restarted or went away")
	// ErrTransient marks a slice failure worth one more try on a fresh
	// connection (a connection that broke). Transports wrap it; the
	// engine retries such slices up to its Config.Retries times.
	ErrTransient = errors.New("engine: transient transport failure")
	// ErrOutOfRange: a target range lies outside the target's exposed
	// buffers (or its registered memory). It wraps segment.ErrOutOfRange.
	ErrOutOfRange = fmt.Errorf("engine: target range outside exposed buffers: %w", segment.ErrOutOfRange)
	// ErrMemoryBusy: memory cannot be unregistered while transfers use it,
	// nor acquired while it is being unregistered.
	ErrMemoryBusy = errors.New("engine: memory in use by transfers")
)
