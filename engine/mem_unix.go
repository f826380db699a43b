//go:build unix

package engine

import (
	"fmt"
	"sync"
	"syscall"
)

// Memory is an anonymous private mapping outside the Go heap, suitable for
// registration: the garbage collector never moves or frees it, so a NIC or
// a peer may write it at any time until Close.
type Memory struct {
	mu  sync.Mutex
	b   []byte
	len int
}

// Alloc maps size bytes of zeroed, page-aligned memory.
func Alloc(size int) (*Memory, error) {
	if size <= 0 {
		return nil, fmt.Errorf("engine: alloc %d bytes: %w", size, ErrInvalidRequest)
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("engine: alloc %d bytes: mmap: %w", size, err)
	}
	return &Memory{b: b, len: size}, nil
}

// Bytes returns the mapping (nil after Close).
func (m *Memory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Len returns the mapping's size.
func (m *Memory) Len() int { return m.len }

// Close unmaps the memory. Unregister it first: touching it afterwards
// faults. Close is idempotent and safe on a nil Memory.
func (m *Memory) Close() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	err := syscall.Munmap(m.b)
	m.b = nil
	if err != nil {
		return fmt.Errorf("engine: munmap: %w", err)
	}
	return nil
}
