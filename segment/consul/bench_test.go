package consul_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/storetest"
)

func benchStores(b *testing.B) (owner, reader *consul.Store, ctx context.Context) {
	a := agent(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	p := "te-bench/" + b.Name()
	var err error
	owner, err = consul.New(ctx, consul.Config{Address: a.Addr(), Prefix: p, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { owner.Close() })
	reader, err = consul.New(ctx, consul.Config{Address: a.Addr(), Prefix: p, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { reader.Close() })
	return owner, reader, ctx
}

// Publish of a new version: one Consul transaction (check-index + lock).
func BenchmarkPublish(b *testing.B) {
	owner, _, ctx := benchStores(b)
	d := storetest.Descriptor("bench", 1, 1)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		d.Version = uint64(i + 1)
		if err := owner.Publish(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
}

// Get from another store: one consistent KV read and a decode.
func BenchmarkGet(b *testing.B) {
	owner, reader, ctx := benchStores(b)
	if err := owner.Publish(ctx, storetest.Descriptor("bench", 1, 1)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := reader.Get(ctx, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}

// Publish by the owner until a watcher in another store reports it.
func BenchmarkPublishToWatch(b *testing.B) {
	owner, reader, ctx := benchStores(b)
	if err := owner.Publish(ctx, storetest.Descriptor("bench", 1, 1)); err != nil {
		b.Fatal(err)
	}
	ch, err := reader.Watch(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	<-ch
	d := storetest.Descriptor("bench", 1, 1)
	for i := 0; b.Loop(); i++ {
		d.Version = uint64(i + 2)
		if err := owner.Publish(ctx, d); err != nil {
			b.Fatal(err)
		}
		for got := range ch {
			if got != nil && got.Version == d.Version {
				break
			}
		}
	}
}
