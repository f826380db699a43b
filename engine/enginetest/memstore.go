// Package enginetest holds helpers for testing the engine and its
// transports: an in-process segment.Store, and fixtures that build engines
// on loopback.
package enginetest

import (
	"context"
	"sync"

	"github.com/rdmago/te/segment"
)

// MemStore is a segment.Store kept in process memory, shared by all
// engines of a test. Descriptors go through the codec on the way in and
// out, as they would over the wire.
type MemStore struct {
	mu       sync.Mutex
	m        map[string][]byte
	watchers map[*watcher]struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

type watcher struct {
	name string
	poke chan struct{}
}

var _ segment.Store = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	s := &MemStore{m: map[string][]byte{}, watchers: map[*watcher]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

func (s *MemStore) pokeLocked(name string) {
	for w := range s.watchers {
		if w.name == name {
			select {
			case w.poke <- struct{}{}:
			default:
			}
		}
	}
}

// Publish stores d.
func (s *MemStore) Publish(ctx context.Context, d *segment.Descriptor) error {
	b, err := segment.Marshal(d)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return segment.ErrClosed
	}
	s.m[d.Name] = b
	s.pokeLocked(d.Name)
	return nil
}

// Unpublish removes name.
func (s *MemStore) Unpublish(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[name]; !ok {
		return segment.ErrNotFound
	}
	delete(s.m, name)
	s.pokeLocked(name)
	return nil
}

func (s *MemStore) get(name string) (*segment.Descriptor, error) {
	s.mu.Lock()
	b, ok := s.m[name]
	s.mu.Unlock()
	if !ok {
		return nil, segment.ErrNotFound
	}
	return segment.Unmarshal(b)
}

// Get returns name's descriptor or segment.ErrNotFound.
func (s *MemStore) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	if s.ctx.Err() != nil {
		return nil, segment.ErrClosed
	}
	return s.get(name)
}

// List returns every descriptor.
func (s *MemStore) List(ctx context.Context) ([]*segment.Descriptor, error) {
	s.mu.Lock()
	names := make([]string, 0, len(s.m))
	for n := range s.m {
		names = append(names, n)
	}
	s.mu.Unlock()
	var out []*segment.Descriptor
	for _, n := range names {
		if d, err := s.get(n); err == nil {
			out = append(out, d)
		}
	}
	return out, nil
}

// Watch reports changes of name until ctx ends or the store closes.
func (s *MemStore) Watch(ctx context.Context, name string) (<-chan *segment.Descriptor, error) {
	w := &watcher{name: name, poke: make(chan struct{}, 1)}
	out := make(chan *segment.Descriptor)
	s.mu.Lock()
	if s.ctx.Err() != nil {
		s.mu.Unlock()
		return nil, segment.ErrClosed
	}
	s.watchers[w] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	// The first report is the current descriptor, so nothing published
	// between a Get and this Watch is missed.
	var last *segment.Descriptor
	w.poke <- struct{}{}
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer func() {
			s.mu.Lock()
			delete(s.watchers, w)
			s.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.ctx.Done():
				return
			case <-w.poke:
			}
			cur, _ := s.get(name)
			if cur == nil && last == nil {
				continue
			}
			if cur != nil && last != nil && cur.Epoch == last.Epoch && cur.Version == last.Version {
				continue
			}
			select {
			case out <- cur:
				last = cur
			case <-ctx.Done():
				return
			case <-s.ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// Close ends every watch. It is idempotent.
func (s *MemStore) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}
