package engine_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// Two engines on loopback, as two processes would run them: each with its
// own embedded metadata store (p2p, no server), which names the engine's
// segment after its address. The initiator WRITEs 4 KiB into the target's
// registered memory over TCP and READs it back.
func Example() {
	ctx := context.Background()
	start := func() (*engine.Engine, *engine.Memory, func()) {
		// p2p://127.0.0.1:0: listen on loopback, any free port; across
		// hosts, p2p://0.0.0.0:15001 or consul://host:8500 (stores.Open
		// opens either).
		store, err := p2p.Open(ctx, "p2p://127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		e, err := engine.New(engine.Config{Name: store.Name(), Store: store})
		if err != nil {
			log.Fatal(err)
		}
		if err := e.Install(tcp.New(tcp.Config{})); err != nil {
			log.Fatal(err)
		}
		mem, err := engine.Alloc(1 << 20) // mmap'd, never Go heap
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

	// The target's name (host:port) is all the initiator needs.
	seg, err := ini.OpenSegment(ctx, target.Name(), nil)
	if err != nil {
		log.Fatal(err)
	}
	// Target addresses are the target's own virtual addresses, as
	// published in its descriptor.
	desc, _ := ini.SegmentDescriptor(seg)
	remote := desc.Buffers[0].Addr

	copy(imem.Bytes(), "hello, segment")
	batch, _ := ini.AllocateBatch(2)
	defer ini.FreeBatch(batch)
	err = ini.Submit(batch, []engine.Request{
		{Op: engine.Write, Local: imem.Bytes()[:4096], Target: seg, TargetAddr: remote},
	})
	if err == nil {
		err = ini.Wait(ctx, batch)
	}
	if err == nil {
		err = ini.Submit(batch, []engine.Request{
			{Op: engine.Read, Local: imem.Bytes()[8192 : 8192+4096], Target: seg, TargetAddr: remote},
		})
	}
	if err == nil {
		err = ini.Wait(ctx, batch)
	}
	if err != nil {
		log.Fatal(err)
	}
	st, _ := ini.Status(batch, 1)
	fmt.Println(st.State, st.Transferred, string(imem.Bytes()[8192:8192+14]))
	// Output: COMPLETED 4096 hello, segment
}

// A Selector orders the transports a segment's requests may use (the
// candidates: installed here, offered by the segment, reaching it). Set
// one in Config.Selector; Prefer puts the named protocols first.
func ExamplePrefer() {
	candidates := []string{"tcp", "rdma", "shm"} // in the target's order
	fmt.Println(engine.DefaultSelector(nil, candidates))
	fmt.Println(engine.Prefer(segment.ProtoTCP)(nil, candidates))
	// Output:
	// [shm rdma tcp]
	// [tcp rdma shm]
}
