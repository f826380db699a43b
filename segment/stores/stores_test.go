package stores_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/segment/stores"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestOpenBuiltin: te's schemes open without any import or registration.
func TestOpenBuiltin(t *testing.T) {
	s, err := stores.Open(ctxT(t), "p2p://127.0.0.1:0?poll=10ms")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*p2p.Store); !ok {
		t.Errorf("p2p:// opened a %T", s)
	}
	// Consul without an agent: consul's own error, not an unknown scheme.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := stores.Open(ctxT(t), "consul://"+addr+"/te?timeout=500ms")
	if c != nil || !errors.Is(err, segment.ErrUnavailable) {
		t.Errorf("consul without an agent: %#v, %v; want a nil Store and ErrUnavailable", c, err)
	}
}

// TestOpenFailureIsNil: a store that cannot start comes back as a nil
// interface with the cause, so a caller's deferred Close cannot panic.
func TestOpenFailureIsNil(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err := stores.Open(ctxT(t), "p2p://"+busy.Addr().String())
	if s != nil || err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Open on a busy port = %#v, %v; want a nil Store and the cause", s, err)
	}
}

// TestOpenUnknown: an unknown scheme, or no URI at all, says which schemes
// exist.
func TestOpenUnknown(t *testing.T) {
	for _, uri := range []string{"etcd://127.0.0.1:2379", "127.0.0.1:2379", "", "p2p"} {
		s, err := stores.Open(ctxT(t), uri)
		if s != nil || !errors.Is(err, segment.ErrUnknownScheme) || !strings.Contains(err.Error(), "p2p://") || !strings.Contains(err.Error(), "consul://") {
			t.Errorf("Open(%q) = %#v, %v; want ErrUnknownScheme listing p2p:// and consul://", uri, s, err)
		}
	}
	// segment.Open alone knows no te store, and says where to find them.
	if _, err := segment.Open(ctxT(t), "p2p://"); !errors.Is(err, segment.ErrUnknownScheme) || !strings.Contains(err.Error(), "segment/stores") {
		t.Errorf("segment.Open(p2p://) = %v; want ErrUnknownScheme naming segment/stores", err)
	}
}

// TestOpenRegistered: a scheme registered by a store outside te opens
// through stores.Open too.
func TestOpenRegistered(t *testing.T) {
	want := errors.New("opened")
	segment.RegisterScheme("outside-te", func(_ context.Context, u *url.URL) (segment.Store, error) {
		return nil, want
	})
	if _, err := stores.Open(ctxT(t), "outside-te://x"); !errors.Is(err, want) {
		t.Errorf("registered scheme: %v", err)
	}
	found := false
	for _, s := range stores.Schemes() {
		found = found || s == "outside-te"
	}
	if !found {
		t.Errorf("Schemes() = %v, missing the registered one", stores.Schemes())
	}
}
