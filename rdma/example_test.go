package rdma_test

import (
	"context"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// An engine that serves its memory over RDMA on two rails and over TCP:
// initiators whose descriptor lists rdma use it, the others TCP. Memory
// registered with a location tag prefers the rails listed for it.
func Example() {
	store, err := p2p.New(context.Background(), p2p.Options{Listen: "0.0.0.0:0"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	e, err := engine.New(engine.Config{Name: store.Name(), Store: store})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	// The rails open with the verbs providers te carries (rxe and mlx5,
	// uverbs/providers); Config.Options passes others.
	tr := rdma.New(rdma.Config{
		Devices:  []string{"mlx5_0", "mlx5_1"},
		Priority: map[string][]string{"cpu:0": {"mlx5_0"}, "cpu:1": {"mlx5_1"}},
	})
	for _, t := range []engine.Transport{tr, tcp.New(tcp.Config{Listen: "0.0.0.0:0"})} {
		if err := e.Install(t); err != nil {
			log.Fatal(err) // e.g. no such device
		}
	}
	mem, err := engine.Alloc(1 << 30)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	// One MR per rail; every rail's rkey goes into the descriptor.
	if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		log.Fatal(err)
	}
	for _, r := range tr.Stats() {
		log.Printf("rail %s up=%v", r.Device, r.Up)
	}
}
