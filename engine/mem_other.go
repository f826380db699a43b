//go:build !unix

package engine

// Memory is an anonymous mapping outside the Go heap; not available on
// this platform.
type Memory struct{}

// Alloc is not supported on this platform.
func Alloc(size int) (*Memory, error) { return nil, ErrNotSupported }

// Bytes returns nil.
func (m *Memory) Bytes() []byte { return nil }

// Len returns 0.
func (m *Memory) Len() int { return 0 }

// Close does nothing.
func (m *Memory) Close() error { return nil }
