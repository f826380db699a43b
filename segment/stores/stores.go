// Package stores opens a metadata store from its URI with every store te
// carries, so a program needs no blank import and no registration:
//
//	st, err := stores.Open(ctx, "p2p://")                        // embedded, no server
//	st, err := stores.Open(ctx, "consul://127.0.0.1:8500/te")    // Consul
//	st, err := stores.Open(ctx, "http://10.0.0.1:8080/metadata") // Mooncake's HTTP metadata
//	st, err := stores.Open(ctx, "p2phandshake://")               // Mooncake's P2PHANDSHAKE
//
// Schemes registered with segment.RegisterScheme (stores outside te) are
// opened as well.
package stores

import (
	"context"
	"fmt"
	"net/url"
	"slices"

	"github.com/rdmago/te/mooncake/httpmeta"
	mcp2p "github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/p2p"
)

// builtin maps te's schemes to their stores' constructors.
var builtin = map[string]func(ctx context.Context, uri string) (segment.Store, error){
	"p2p": func(ctx context.Context, uri string) (segment.Store, error) {
		s, err := p2p.Open(ctx, uri)
		if err != nil {
			return nil, err // not a typed nil inside the interface
		}
		return s, nil
	},
	"consul": func(ctx context.Context, uri string) (segment.Store, error) {
		s, err := consul.Open(ctx, uri)
		if err != nil {
			return nil, err
		}
		return s, nil
	},
	// Mooncake's metadata: its HTTP server's URL, and its P2PHANDSHAKE
	// socket (package mooncake).
	"http":         openHTTPMeta,
	"https":        openHTTPMeta,
	"p2phandshake": openP2PHandshake,
}

func openHTTPMeta(ctx context.Context, uri string) (segment.Store, error) {
	s, err := httpmeta.Open(ctx, uri)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func openP2PHandshake(ctx context.Context, uri string) (segment.Store, error) {
	s, err := mcp2p.Open(ctx, uri)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Schemes lists the schemes Open knows: te's own and the registered ones.
func Schemes() []string {
	out := append([]string{"consul", "http", "https", "p2p", "p2phandshake"}, segment.Schemes()...)
	slices.Sort(out)
	return slices.Compact(out)
}

// Open returns the Store a metadata URI names: p2p://[host[:port]][?...]
// (package segment/p2p), consul://host:port[/prefix][?...] (package
// segment/consul), or a scheme registered with segment.RegisterScheme. A
// string that is no URI, or an unknown scheme, fails with an error wrapping
// segment.ErrUnknownScheme that lists the known ones.
func Open(ctx context.Context, uri string) (segment.Store, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme == "" {
		return nil, fmt.Errorf("%w: metadata %q is not a URI: want one of %v, e.g. p2p:// or consul://127.0.0.1:8500", segment.ErrUnknownScheme, uri, schemeForms())
	}
	if open, ok := builtin[u.Scheme]; ok {
		return open(ctx, uri)
	}
	if slices.Contains(segment.Schemes(), u.Scheme) {
		return segment.Open(ctx, uri)
	}
	return nil, fmt.Errorf("%w %q in %q: want one of %v", segment.ErrUnknownScheme, u.Scheme, uri, schemeForms())
}

func schemeForms() []string {
	ss := Schemes()
	for i, s := range ss {
		ss[i] = s + "://"
	}
	return ss
}
