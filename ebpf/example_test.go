package ebpf_test

import (
	"context"
	"fmt"
	"log"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// Trace the lanes of a TCP transport: select them by cookie, read their
// counters, and watch their state changes and retransmissions. Without
// root (or on a kernel without BTF) the transport's own TCP_INFO still
// gives the counters. Here two engines on loopback move 1 MiB first, so
// the initiator's transport has lanes to trace.
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
		tr := tcp.New(tcp.Config{Listen: "127.0.0.1:0"})
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
	target, _, _, stopTarget := start()
	defer stopTarget()
	ini, tr, imem, stopIni := start()
	defer stopIni()
	seg, err := ini.OpenSegment(ctx, target.Name(), nil)
	if err != nil {
		log.Fatal(err)
	}
	desc, err := ini.SegmentDescriptor(seg)
	if err != nil {
		log.Fatal(err)
	}
	batch, err := ini.AllocateBatch(1)
	if err != nil {
		log.Fatal(err)
	}
	defer ini.FreeBatch(batch)
	if err := ini.Submit(batch, []engine.Request{{Op: engine.Write, Local: imem.Bytes(), Target: seg, TargetAddr: desc.Buffers[0].Addr}}); err != nil {
		log.Fatal(err)
	}
	if err := ini.Wait(ctx, batch); err != nil {
		log.Fatal(err)
	}

	var cookies []uint64
	for _, l := range tr.Lanes() {
		cookies = append(cookies, l.Cookie)
	}
	fmt.Println("lanes to trace:", len(cookies) > 0)
	t, err := ebpf.Open(ebpf.Filter{Cookies: cookies})
	if err != nil { // ebpf.ErrPermission, ebpf.ErrUnsupported: say what is missing
		log.Println("untraced:", err)
		for _, l := range tr.Lanes() {
			log.Println(l.Peer, l.Index, l.Info.BytesAcked, l.Info.RTT)
		}
		return
	}
	defer t.Close()
	conns, err := t.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range conns {
		log.Println(c.Local, c.Remote, c.State, c.BytesAcked, c.BytesReceived, c.SRTT, c.Retransmits)
	}
	go func() {
		for e := range t.Events() { // closed by Close
			log.Println(e)
		}
	}()
	// Output: lanes to trace: true
}
