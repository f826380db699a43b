package stores_test

import (
	"context"
	"testing"

	"github.com/rdmago/te/mooncake/httpmeta"
	mcp2p "github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment/stores"
)

// TestMooncakeSchemes: Mooncake's metadata opens by URI like te's own.
func TestMooncakeSchemes(t *testing.T) {
	for uri, check := range map[string]func(any) bool{
		"p2phandshake://127.0.0.1:0":   func(s any) bool { _, ok := s.(*mcp2p.Store); return ok },
		"http://127.0.0.1:1/metadata":  func(s any) bool { _, ok := s.(*httpmeta.Store); return ok },
		"https://127.0.0.1:1/metadata": func(s any) bool { _, ok := s.(*httpmeta.Store); return ok },
	} {
		s, err := stores.Open(context.Background(), uri)
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		if !check(s) {
			t.Errorf("%s opened a %T", uri, s)
		}
		s.Close()
	}
}
