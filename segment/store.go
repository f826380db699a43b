package segment

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sync"
)

// Store keeps segment descriptors. Implementations: the embedded
// peer-to-peer store (no server; a name is the owner's host:port) and
// Consul. All methods are safe for concurrent use and honour ctx.
type Store interface {
	// Publish makes d the current descriptor of d.Name, owned by this
	// process. A store that can see other writers returns ErrConflict when
	// another process changed the key since this one last published it.
	// Published descriptors disappear when the owner's Store is closed or
	// its process dies (where the backend can detect that).
	Publish(ctx context.Context, d *Descriptor) error
	// Unpublish removes a descriptor this process published.
	Unpublish(ctx context.Context, name string) error
	// Get returns the current descriptor of a segment, or ErrNotFound.
	// ErrUnavailable means the store (or peer) could not be reached.
	Get(ctx context.Context, name string) (*Descriptor, error)
	// List returns the descriptors the store can enumerate.
	List(ctx context.Context) ([]*Descriptor, error)
	// Watch reports changes to a segment: a descriptor whose Epoch or
	// Version differs from the last one seen, or nil once it is gone. The
	// channel is closed when ctx ends or the store is closed.
	Watch(ctx context.Context, name string) (<-chan *Descriptor, error)
	// Close unpublishes this process's descriptors (where the backend
	// supports it) and releases resources. It is idempotent.
	Close() error
}

// Opener creates a Store from a metadata URI.
type Opener func(ctx context.Context, u *url.URL) (Store, error)

var (
	schemesMu sync.Mutex
	schemes   = map[string]Opener{}
)

// RegisterScheme makes Open (and stores.Open) understand metadata URIs with
// the given scheme: the hook for stores outside te. te's own stores (p2p,
// consul) register nothing; stores.Open (package segment/stores) knows
// them. It panics if the scheme is registered twice.
func RegisterScheme(scheme string, open Opener) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if _, dup := schemes[scheme]; dup {
		panic("segment: scheme registered twice: " + scheme)
	}
	schemes[scheme] = open
}

// Schemes lists the schemes registered with RegisterScheme.
func Schemes() []string {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	return slices.Sorted(maps.Keys(schemes))
}

// Open returns the Store for a metadata URI whose scheme was registered
// with RegisterScheme. For te's own stores (p2p://, consul://) use
// stores.Open (package segment/stores), which needs no registration. An
// unknown scheme fails with an error wrapping ErrUnknownScheme that says
// so.
func Open(ctx context.Context, uri string) (Store, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("segment: metadata %q: %w", uri, err)
	}
	schemesMu.Lock()
	open, ok := schemes[u.Scheme]
	schemesMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w %q in %q (registered: %v): open te's stores (p2p://, consul://) with stores.Open of package github.com/rdmago/te/segment/stores, or register the scheme with RegisterScheme",
			ErrUnknownScheme, u.Scheme, uri, Schemes())
	}
	st, err := open(ctx, u)
	if err != nil {
		// An opener that returned a typed nil inside the interface must
		// not hand callers a Store whose Close dereferences nil.
		return nil, err
	}
	return st, nil
}
