//go:build !linux

package ebpf

import "fmt"

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
