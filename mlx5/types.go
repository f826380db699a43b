package mlx5

import (
	"fmt"

	"github.com/rdmago/te/uverbs"
)

// The data path speaks the provider-neutral types of package uverbs, so
// posting and polling need no conversion.
type (
	SendWR = uverbs.SendWR
	RecvWR = uverbs.RecvWR
	SGE    = uverbs.SGE
	WC     = uverbs.WC
)

// Errors returned per operation are the preallocated uverbs sentinels,
// unwrapped, so that failing posts do not allocate and callers match them
// with errors.Is exactly as for any other provider.
var (
	errSendQueueFull = uverbs.ErrQueueFull
	errRecvQueueFull = uverbs.ErrQueueFull
	errTooManySGE    = uverbs.ErrTooManySGE
	errInlineTooLong = uverbs.ErrInlineTooLarge
	errInvalidWR     = uverbs.ErrInvalidWR
)

// ErrNotSupported: the device, kernel or architecture lacks a feature this
// provider needs. It matches uverbs.ErrNotSupported.
var ErrNotSupported = uverbs.ErrNotSupported

// errClosed matches uverbs.ErrClosed (os.ErrClosed) with errors.Is.
var errClosed = fmt.Errorf("mlx5: context or queue already released: %w", uverbs.ErrClosed)
