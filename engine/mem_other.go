//go:build !unix

package engine

// Memory is a mapping outside the Go heap; not available on this
// platform.
type Memory struct{}

// Alloc is not supported on this platform.
func Alloc(size int) (*Memory, error) { return nil, ErrNotSupported }

// AllocShared is not supported on this platform.
func AllocShared(size int) (*Memory, error) { return nil, ErrNotSupported }

// Bytes returns nil.
func (m *Memory) Bytes() []byte { return nil }

// Len returns 0.
func (m *Memory) Len() int { return 0 }

// Shared returns false.
func (m *Memory) Shared() bool { return false }

// Close does nothing.
func (m *Memory) Close() error { return nil }

func (m *Memory) attach(*region) error { return nil }
func (m *Memory) detach(*region)       {}
func (m *Memory) memfd(uint64) (int, uint64, bool) {
	return -1, 0, false
}

var allocs allocTable

type allocTable struct{}

func (allocTable) find(addr, n uint64) *Memory { return nil }
