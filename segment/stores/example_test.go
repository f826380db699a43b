package stores_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/stores"
)

// One import opens any metadata store by its URI: here two embedded p2p
// stores, one publishing a segment under its own address, the other
// fetching it by that name.
func Example() {
	ctx := context.Background()
	owner, err := stores.Open(ctx, "p2p://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer owner.Close()
	// The p2p store names a process's segment after its listener.
	name := owner.(interface{ Name() string }).Name()
	err = owner.Publish(ctx, &segment.Descriptor{Name: name, Epoch: 1, Version: 1,
		Protocols: []segment.Protocol{}, Buffers: []segment.Buffer{{Addr: 0x10000, Length: 4096}}})
	if err != nil {
		log.Fatal(err)
	}
	reader, err := stores.Open(ctx, "p2p://")
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close()
	d, err := reader.Get(ctx, name)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Buffers[0].Length, "bytes at", fmt.Sprintf("%#x", d.Buffers[0].Addr))

	// A scheme no store handles says which ones exist.
	_, err = stores.Open(ctx, "etcd://127.0.0.1:2379")
	fmt.Println(errors.Is(err, segment.ErrUnknownScheme))
	// Output:
	// 4096 bytes at 0x10000
	// true
}
