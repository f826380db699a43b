package tcp_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// Two engines on loopback, each with its own TCP transport and embedded
// metadata store, as two processes would run them. The program holds the
// *tcp.Transport that New returned: engine.Install drives it, and its own
// methods show what it is doing (Endpoint, Lanes).
func Example() {
	ctx := context.Background()
	start := func() (*engine.Engine, *tcp.Transport, *engine.Memory, func()) {
		store, err := p2p.Open(ctx, "p2p://127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		e, err := engine.New(engine.Config{Name: store.Name(), Store: store})
		if err != nil {
			log.Fatal(err)
		}
		tr := tcp.New(tcp.Config{Lanes: 1}) // listens on 127.0.0.1 once installed
		if err := e.Install(tr); err != nil {
			log.Fatal(err)
		}
		mem, err := engine.Alloc(1 << 20)
		if err != nil {
			log.Fatal(err)
		}
		if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
			log.Fatal(err)
		}
		return e, tr, mem, func() { e.Close(); mem.Close(); store.Close() }
	}
	target, ttr, _, stopTarget := start()
	defer stopTarget()
	ini, itr, imem, stopIni := start()
	defer stopIni()

	seg, err := ini.OpenSegment(ctx, target.Name(), nil)
	if err != nil {
		log.Fatal(err)
	}
	desc, _ := ini.SegmentDescriptor(seg)
	b, _ := ini.AllocateBatch(1)
	defer ini.FreeBatch(b)
	if err := ini.Submit(b, []engine.Request{{Op: engine.Write, Local: imem.Bytes()[:64<<10], Target: seg, TargetAddr: desc.Buffers[0].Addr}}); err != nil {
		log.Fatal(err)
	}
	if err := ini.Wait(ctx, b); err != nil {
		log.Fatal(err)
	}
	st, _ := ini.BatchStatus(b)
	fmt.Println(st.State, st.Transferred, "bytes over", st.Transport)
	for _, l := range itr.Lanes() {
		fmt.Printf("lane %d to the target's endpoint: %v\n", l.Index, l.Remote.String() == ttr.Endpoint())
	}
	// Output:
	// COMPLETED 65536 bytes over tcp
	// lane 0 to the target's endpoint: true
}
