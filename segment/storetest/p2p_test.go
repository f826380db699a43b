package storetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/segment/storetest"
)

// The embedded store runs the suite with owner-bound names (address/suffix),
// no global List and no conflicts.
func TestP2P(t *testing.T) {
	storetest.Run(t, func(t *testing.T) segment.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := p2p.New(ctx, p2p.Options{PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, storetest.Names(func(s segment.Store, i int) string {
		return fmt.Sprintf("%s/seg%d", s.(*p2p.Store).Name(), i)
	}))
}
