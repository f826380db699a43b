//go:build !linux

package ebpf

import (
	"fmt"
	"time"
)

// Tracer needs Linux.
type Tracer struct{}

// Open needs Linux.
func Open(Filter) (*Tracer, error) {
	return nil, fmt.Errorf("%w: eBPF tracing needs Linux", ErrUnsupported)
}

// Events needs Linux.
func (t *Tracer) Events() <-chan Event { return nil }

// Snapshot needs Linux.
func (t *Tracer) Snapshot() ([]Conn, error) { return nil, ErrClosed }

// Close needs Linux.
func (t *Tracer) Close() error { return nil }

// Cost needs Linux.
func (t *Tracer) Cost() (time.Duration, uint64, error) { return 0, 0, ErrClosed }
