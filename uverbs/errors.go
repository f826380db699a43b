package uverbs

import (
	"errors"
	"os"
)

// Sentinel errors. Kernel failures are wrapped with the operation and the
// errno, so errors.Is works both with these and with syscall.Errno values.
var (
	// ErrClosed is returned by methods of a closed object.
	ErrClosed = os.ErrClosed
	// ErrNotSupported means the device, driver or kernel lacks a feature.
	ErrNotSupported = errors.New("uverbs: not supported")
	// ErrNoDevice means no RDMA device of that name (or none at all) exists.
	ErrNoDevice = errors.New("uverbs: no such RDMA device")
	// ErrNoProvider means no provider in Options.Providers handles the
	// device's driver.
	ErrNoProvider = errors.New("uverbs: no provider for driver")
	// ErrNoGID means no GID of the wanted address and type exists on the port.
	ErrNoGID = errors.New("uverbs: no matching GID")
	// ErrBusy means an object still has live children (e.g. a PD with MRs).
	ErrBusy = errors.New("uverbs: object still in use")
	// ErrLeak is returned by Context.Close when children were still open;
	// they have been destroyed, and the error lists them.
	ErrLeak = errors.New("uverbs: objects left open")

	// Data-path errors: pre-allocated, returned unwrapped so that the data
	// path never allocates.

	// ErrQPState means the QP is not in a state that allows the operation
	// (sends need RTS, SQD or ERR; receives need any state but RESET).
	ErrQPState = errors.New("uverbs: QP state does not allow posting")
	// ErrQueueFull means the send or receive queue has no free slot.
	ErrQueueFull = errors.New("uverbs: work queue full")
	// ErrTooManySGE means a work request has more SGEs than the QP allows.
	ErrTooManySGE = errors.New("uverbs: too many scatter/gather entries")
	// ErrInlineTooLarge means inline data exceeds the QP's max inline size.
	ErrInlineTooLarge = errors.New("uverbs: inline data too large")
	// ErrInvalidWR means a work request is malformed (unknown opcode,
	// misaligned or short atomic, ...).
	ErrInvalidWR = errors.New("uverbs: invalid work request")
	// ErrStrayCompletion means the CQ held a completion the provider could
	// not attribute to any queue pair of the context (a corrupt or foreign
	// CQE). It was consumed; the completions polled before it are valid.
	ErrStrayCompletion = errors.New("uverbs: completion for no known queue pair")
	// ErrConcurrent means two goroutines used a single-owner queue at once.
	ErrConcurrent = errors.New("uverbs: concurrent use of a single-owner queue")

	// Completion error classes. A failed completion's *WCError matches at
	// most one of them with errors.Is (WCStatus.Transient and
	// WCStatus.AccessDenied say the same for a bare status). A status in
	// neither class (a local length or QP operation error, a fatal error)
	// is a defect of the request or the device: treat it as permanent.

	// ErrCompletionTransient matches a completion that failed because of
	// the connection, not the request: transport retries exceeded (the
	// peer or the path is gone), RNR retries exceeded (the peer posted no
	// receive in time), or flushed (the QP entered ERR because of an
	// earlier request, or was moved there). The same request may succeed
	// on a fresh QP or another rail. A transport built on uverbs wraps
	// these as its own retryable error (engine.ErrTransient).
	ErrCompletionTransient = errors.New("uverbs: transient completion error")
	// ErrCompletionAccess matches a completion the memory protection
	// refused: remote access (bad rkey, range outside the remote MR,
	// missing access right), remote invalid request, local protection or
	// local access (bad lkey). Retrying the request fails the same way; the
	// error names the rkey and range when the poller supplied them
	// (WC.ErrRemote).
	ErrCompletionAccess = errors.New("uverbs: memory access refused")
)
