package p2p

import (
	"context"
	"testing"
)

// BenchmarkGet fetches a peer's descriptor over the pooled handshake
// connection: the cost of one OpenSegment lookup or one Watch poll.
func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	a, err := New(ctx, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	c, err := New(ctx, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Get(ctx, a.Name()); err != nil {
			b.Fatal(err)
		}
	}
}
