// Package enginetest holds helpers for testing the engine and its
// transports: an in-process segment.Store.
package enginetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmago/te/segment"
)

// memBackend is the namespace shared by all views of one MemStore.
type memBackend struct {
	mu       sync.Mutex
	m        map[string][]byte
	owner    map[string]*MemStore
	watchers map[*watcher]struct{}
}

type watcher struct {
	name string
	poke chan struct{}
}

// MemStore is a segment.Store kept in process memory. A MemStore and the
// stores made by its Process method share one namespace, as processes
// share a central store; each is one "process": Close unpublishes what it
// published and ends its watches. Descriptors go through the codec on the
// way in and out, as they would over the wire. Several engines of a test
// may also share one MemStore.
type MemStore struct {
	b      *memBackend
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool // under b.mu
}

var _ segment.Store = (*MemStore)(nil)

// NewMemStore returns a store with an empty namespace of its own.
func NewMemStore() *MemStore {
	return newView(&memBackend{m: map[string][]byte{}, owner: map[string]*MemStore{}, watchers: map[*watcher]struct{}{}})
}

func newView(b *memBackend) *MemStore {
	s := &MemStore{b: b}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Process returns another store over the same namespace, standing for
// another process.
func (s *MemStore) Process() *MemStore { return newView(s.b) }

func (b *memBackend) pokeLocked(name string) {
	for w := range b.watchers {
		if w.name == name {
			select {
			case w.poke <- struct{}{}:
			default:
			}
		}
	}
}

// Publish stores d. Another live store owning the name makes it fail with
// segment.ErrConflict.
func (s *MemStore) Publish(ctx context.Context, d *segment.Descriptor) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	enc, err := segment.Marshal(d)
	if err != nil {
		return err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	if o := s.b.owner[d.Name]; o != nil && o != s {
		return fmt.Errorf("%w: %s is published by another store", segment.ErrConflict, d.Name)
	}
	s.b.m[d.Name] = enc
	s.b.owner[d.Name] = s
	s.b.pokeLocked(d.Name)
	return nil
}

// Unpublish removes a name this store published.
func (s *MemStore) Unpublish(ctx context.Context, name string) error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	if s.b.owner[name] != s {
		return fmt.Errorf("%w: %s was not published by this store", segment.ErrNotFound, name)
	}
	delete(s.b.m, name)
	delete(s.b.owner, name)
	s.b.pokeLocked(name)
	return nil
}

func (b *memBackend) get(name string) (*segment.Descriptor, error) {
	b.mu.Lock()
	enc, ok := b.m[name]
	b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", segment.ErrNotFound, name)
	}
	return segment.Unmarshal(enc)
}

func (s *MemStore) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	return nil
}

// Get returns name's descriptor or segment.ErrNotFound.
func (s *MemStore) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return s.b.get(name)
}

// List returns every descriptor of the namespace.
func (s *MemStore) List(ctx context.Context) ([]*segment.Descriptor, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	names := make([]string, 0, len(s.b.m))
	for n := range s.b.m {
		names = append(names, n)
	}
	s.b.mu.Unlock()
	out := []*segment.Descriptor{}
	for _, n := range names {
		if d, err := s.b.get(n); err == nil {
			out = append(out, d)
		}
	}
	return out, nil
}

// Watch reports name's descriptor now (nil if absent) and after every
// change, until ctx ends or the store closes.
func (s *MemStore) Watch(ctx context.Context, name string) (<-chan *segment.Descriptor, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	w := &watcher{name: name, poke: make(chan struct{}, 1)}
	w.poke <- struct{}{} // report the current state first
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	s.b.watchers[w] = struct{}{}
	// s.ctx ends when the store closes.
	return segment.GoWatch(ctx, s.ctx, &s.wg, func(ctx context.Context, rep *segment.WatchReport) {
		defer func() {
			s.b.mu.Lock()
			delete(s.b.watchers, w)
			s.b.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.poke:
			}
			cur, _ := s.b.get(name)
			if !rep.Send(ctx, cur) {
				return
			}
		}
	}), nil
}

// Close unpublishes what this store published and ends its watches. It is
// idempotent; a concurrent Close returns once the watches have ended.
func (s *MemStore) Close() error {
	s.b.mu.Lock()
	if s.closed {
		s.b.mu.Unlock()
		s.wg.Wait() // a Close in progress: wait for its watches to end
		return nil
	}
	s.closed = true
	for name, o := range s.b.owner {
		if o == s {
			delete(s.b.m, name)
			delete(s.b.owner, name)
			s.b.pokeLocked(name)
		}
	}
	s.b.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}
