package shm_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/shm"
	"github.com/rdmago/te/tcp"
)

// Two engines with tcp and shm installed: the target's memory comes from
// AllocShared, so an initiator on the same host (here, the same process)
// picks shm and the WRITE is one memory copy into the target's memfd,
// with no system call and no work by the target.
func Example() {
	ctx := context.Background()
	start := func() (*engine.Engine, *shm.Transport, *engine.Memory, func()) {
		// Each engine has its own embedded metadata store, as each
		// process would; it names the segment after its address.
		store, err := p2p.Open(ctx, "p2p://127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		e, err := engine.New(engine.Config{Name: store.Name(), Store: store})
		if err != nil {
			log.Fatal(err)
		}
		sh := shm.New(shm.Config{})
		for _, tr := range []engine.Transport{tcp.New(tcp.Config{}), sh} {
			if err := e.Install(tr); err != nil {
				log.Fatal(err)
			}
		}
		mem, err := engine.AllocShared(1 << 20) // memfd, mapped shared
		if err != nil {
			log.Fatal(err)
		}
		if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
			log.Fatal(err)
		}
		return e, sh, mem, func() { e.Close(); mem.Close(); store.Close() }
	}
	target, _, tmem, stopTarget := start()
	defer stopTarget()
	ini, ish, imem, stopIni := start()
	defer stopIni()

	seg, err := ini.OpenSegment(ctx, target.Name(), nil)
	if err != nil {
		log.Fatal(err)
	}
	desc, _ := ini.SegmentDescriptor(seg)
	copy(imem.Bytes(), "hello over shared memory")
	batch, _ := ini.AllocateBatch(1)
	defer ini.FreeBatch(batch)
	err = ini.Submit(batch, []engine.Request{
		{Op: engine.Write, Local: imem.Bytes()[:4096], Target: seg, TargetAddr: desc.Buffers[0].Addr},
	})
	if err == nil {
		err = ini.Wait(ctx, batch)
	}
	if err != nil {
		log.Fatal(err)
	}
	st := ish.Stats()
	fmt.Printf("%s (initiator maps %d region of %d KiB)\n", tmem.Bytes()[:24], st.Mapped, st.MappedBytes>>10)
	// Output: hello over shared memory (initiator maps 1 region of 1024 KiB)
}
