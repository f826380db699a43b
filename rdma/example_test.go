package rdma_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// Two engines, as two processes would run them, each with its own
// embedded metadata store: the initiator WRITEs 4 KiB into the target's
// memory over RDMA and READs it back. Both use rxelo, Soft-RoCE over the
// loopback interface (`sudo te rxe add lo --name rxelo`); on a real host
// name its NICs instead. This example runs in the Soft-RoCE guest tier.
func Example() {
	ctx := context.Background()
	start := func() (*engine.Engine, *engine.Memory, func()) {
		store, err := p2p.Open(ctx, "p2p://127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		e, err := engine.New(engine.Config{Name: store.Name(), Store: store})
		if err != nil {
			log.Fatal(err)
		}
		if err := e.Install(rdma.New(rdma.Config{Devices: []string{"rxelo"}})); err != nil {
			log.Fatal(err) // e.g. no such device: `te devices` says why
		}
		mem, err := engine.Alloc(1 << 20) // registered with the NIC: mmap'd, never Go heap
		if err != nil {
			log.Fatal(err)
		}
		if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
			log.Fatal(err)
		}
		return e, mem, func() { e.Close(); mem.Close(); store.Close() }
	}
	target, _, stopTarget := start()
	defer stopTarget()
	ini, imem, stopIni := start()
	defer stopIni()

	seg, err := ini.OpenSegment(ctx, target.Name(), nil)
	if err != nil {
		log.Fatal(err)
	}
	desc, err := ini.SegmentDescriptor(seg)
	if err != nil {
		log.Fatal(err)
	}
	remote := desc.Buffers[0].Addr // the target's own address of its buffer

	copy(imem.Bytes(), "hello, rdma")
	batch, err := ini.AllocateBatch(2) // room for both tasks
	if err != nil {
		log.Fatal(err)
	}
	defer ini.FreeBatch(batch)
	for _, r := range []engine.Request{
		{Op: engine.Write, Local: imem.Bytes()[:4096], Target: seg, TargetAddr: remote},
		{Op: engine.Read, Local: imem.Bytes()[8192 : 8192+4096], Target: seg, TargetAddr: remote},
	} {
		if err := ini.Submit(batch, []engine.Request{r}); err != nil {
			log.Fatal(err)
		}
		if err := ini.Wait(ctx, batch); err != nil {
			log.Fatal(err)
		}
	}
	st, err := ini.Status(batch, 1) // the READ
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, st.Transport, st.Transferred, string(imem.Bytes()[8192:8192+11]))
	// Output: COMPLETED rdma 4096 hello, rdma
}

// An engine that serves its memory over RDMA on two rails and over TCP:
// initiators whose descriptor lists rdma use it, the others TCP. Memory
// registered with a location tag prefers the rails listed for it. The
// rails here are the Soft-RoCE guest's rxe0 and rxe2 (on a ConnectX host,
// mlx5_0 and mlx5_1); this example runs in the guest tier.
func Example_rails() {
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
		Devices:  []string{"rxe0", "rxe2"},
		Priority: map[string][]string{"cpu:0": {"rxe0"}, "cpu:1": {"rxe2"}},
	})
	for _, t := range []engine.Transport{tr, tcp.New(tcp.Config{Listen: "0.0.0.0:0"})} {
		if err := e.Install(t); err != nil {
			log.Fatal(err) // e.g. no such device
		}
	}
	mem, err := engine.Alloc(1 << 20)
	if err != nil {
		log.Fatal(err)
	}
	defer mem.Close()
	// One MR per rail; every rail's rkey goes into the descriptor's rdma
	// entry.
	if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		log.Fatal(err)
	}
	for _, r := range tr.Stats() {
		fmt.Println("rail", r.Device, "up:", r.Up)
	}
	p, _ := e.LocalDescriptor().Protocol(segment.ProtoRDMA)
	fmt.Println("rkeys of the buffer:", len(p.RDMA.Keys(0)))
	// Output:
	// rail rxe0 up: true
	// rail rxe2 up: true
	// rkeys of the buffer: 2
}
