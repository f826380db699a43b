package engine_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

// Two engines on loopback: the initiator WRITEs 4 KiB into the target's
// registered memory over TCP and READs it back.
func Example() {
	ctx := context.Background()
	store := enginetest.NewMemStore() // in production: segment/p2p or segment/consul
	defer store.Close()

	start := func(name string) (*engine.Engine, *engine.Memory) {
		e, err := engine.New(engine.Config{Name: name, Store: store})
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
		return e, mem
	}
	target, tmem := start("target")
	defer tmem.Close()
	defer target.Close()
	ini, imem := start("initiator")
	defer imem.Close()
	defer ini.Close()

	seg, err := ini.OpenSegment(ctx, "target", nil)
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
