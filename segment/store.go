package segment

import (
	"context"
	"fmt"
	"net/url"
	"sort"
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

// RegisterScheme makes Open understand metadata URIs with the given
// scheme. Backends call it from init.
func RegisterScheme(scheme string, open Opener) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if _, dup := schemes[scheme]; dup {
		panic("segment: scheme registered twice: " + scheme)
	}
	schemes[scheme] = open
}

// Schemes lists the registered metadata URI schemes.
func Schemes() []string {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	out := make([]string, 0, len(schemes))
	for s := range schemes {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Open returns the Store named by a metadata URI such as
// "consul://127.0.0.1:8500/te" or "p2p://".
func Open(ctx context.Context, uri string) (Store, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("segment: metadata %q: %w", uri, err)
	}
	schemesMu.Lock()
	open, ok := schemes[u.Scheme]
	schemesMu.Unlock()
	if !ok {
		return nil, fmt.Errorf("segment: metadata %q: unknown scheme %q (known: %v)", uri, u.Scheme, Schemes())
	}
	st, err := open(ctx, u)
	if err != nil {
		// An opener that returned a typed nil inside the interface must
		// not hand callers a Store whose Close dereferences nil.
		return nil, err
	}
	return st, nil
}
