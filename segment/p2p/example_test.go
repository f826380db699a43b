package p2p_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
)

// Two processes' stores: the owner publishes its descriptor under its own
// address, the other fetches it by that name, straight from the owner.
func Example() {
	ctx := context.Background()
	owner, err := p2p.Open(ctx, "p2p://127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer owner.Close()
	name := owner.Name() // host:port of its handshake listener
	err = owner.Publish(ctx, &segment.Descriptor{
		Name: name, Epoch: 42, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: "127.0.0.1:15002"}},
		Buffers:   []segment.Buffer{{Addr: 0x7f0000000000, Length: 64 << 20, Location: "cpu:0"}},
	})
	if err != nil {
		log.Fatal(err)
	}

	initiator, err := p2p.Open(ctx, "p2p://")
	if err != nil {
		log.Fatal(err)
	}
	defer initiator.Close()
	d, err := initiator.Get(ctx, name)
	if err != nil {
		log.Fatal(err)
	}
	p, _ := d.Protocol(segment.ProtoTCP)
	fmt.Printf("epoch %d version %d, %d MiB over %s at %s\n", d.Epoch, d.Version, d.Buffers[0].Length>>20, p.Name, p.Endpoint)
	// Output: epoch 42 version 1, 64 MiB over tcp at 127.0.0.1:15002
}
