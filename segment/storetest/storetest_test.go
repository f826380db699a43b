package storetest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is a minimal shared in-memory namespace: the reference the suite
// itself is checked against, so a failure in a real backend's run points at
// the backend, not the suite.
type backend struct {
	mu      sync.Mutex
	segs    map[string]entry
	changed chan struct{}
}

type entry struct {
	owner *memStore
	b     []byte
}

func newBackend() *backend {
	return &backend{segs: map[string]entry{}, changed: make(chan struct{})}
}

func (b *backend) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

type memStore struct {
	b      *backend
	mu     sync.Mutex
	closed bool
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (b *backend) open() *memStore {
	s := &memStore{b: b}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

func (s *memStore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *memStore) Publish(ctx context.Context, d *segment.Descriptor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return segment.ErrClosed
	}
	enc, err := segment.Marshal(d)
	if err != nil {
		return err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if e, ok := s.b.segs[d.Name]; ok && e.owner != s {
		return fmt.Errorf("%w: %s", segment.ErrConflict, d.Name)
	}
	s.b.segs[d.Name] = entry{owner: s, b: enc}
	s.b.notifyLocked()
	return nil
}

func (s *memStore) Unpublish(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.isClosed() {
		return segment.ErrClosed
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if e, ok := s.b.segs[name]; !ok || e.owner != s {
		return fmt.Errorf("%w: %s", segment.ErrNotFound, name)
	}
	delete(s.b.segs, name)
	s.b.notifyLocked()
	return nil
}

func (s *memStore) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, segment.ErrClosed
	}
	s.b.mu.Lock()
	e, ok := s.b.segs[name]
	s.b.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", segment.ErrNotFound, name)
	}
	return segment.Unmarshal(e.b)
}

func (s *memStore) List(ctx context.Context) ([]*segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, segment.ErrClosed
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var out []*segment.Descriptor
	for _, e := range s.b.segs {
		d, err := segment.Unmarshal(e.b)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (s *memStore) Watch(ctx context.Context, name string) (<-chan *segment.Descriptor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	ch := make(chan *segment.Descriptor, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(ch)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel) // the store closed
		defer stop()
		rep := segment.NewWatchReport(ch)
		for {
			s.b.mu.Lock()
			changed := s.b.changed
			e, ok := s.b.segs[name]
			s.b.mu.Unlock()
			var cur *segment.Descriptor
			if ok {
				cur, _ = segment.Unmarshal(e.b)
			}
			if !rep.Send(ctx, cur) {
				return
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func (s *memStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	s.mu.Unlock()
	s.wg.Wait()
	s.b.mu.Lock()
	for name, e := range s.b.segs {
		if e.owner == s {
			delete(s.b.segs, name)
		}
	}
	s.b.notifyLocked()
	s.b.mu.Unlock()
	return nil
}

func TestMemoryReference(t *testing.T) {
	b := newBackend()
	storetest.Run(t, func(t *testing.T) segment.Store { return b.open() },
		storetest.ListsAll(), storetest.Conflicts())
}

// Owner-bound names, without List of others or conflicts: the p2p shape.
func TestMemoryOwnerNames(t *testing.T) {
	b := newBackend()
	storetest.Run(t, func(t *testing.T) segment.Store { return b.open() },
		storetest.Names(func(s segment.Store, i int) string { return fmt.Sprintf("%p/%d", s, i) }))
}
