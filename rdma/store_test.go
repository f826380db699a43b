package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/test/softroce/srenv"
)

// TestEndpointEviction bounds the initiator to one endpoint and talks to
// two targets in turn: each switch evicts the idle endpoint (the target
// it led to releases its QPs), and going back reconnects.
func TestEndpointEviction(t *testing.T) {
	topo := srenv.Require(t)
	lo := []string{topo.Lo.Name}
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	var tgts [2]*enginetest.Node
	var trs [2]*rdma.Transport
	for i, name := range []string{"target-a", "target-b"} {
		trs[i] = rdma.New(rdma.Config{Options: opts, Devices: lo})
		tgts[i] = enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 1<<20, trs[i])
	}
	it := rdma.New(rdma.Config{Options: opts, Devices: lo, MaxEndpoints: 1})
	ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 1<<20, it)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var segs [2]engine.SegmentID
	for i, name := range []string{"target-a", "target-b"} {
		var err error
		if segs[i], err = ini.Engine.OpenSegment(ctx, name, nil); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 4 {
		i := round % 2
		src := ini.Mem.Bytes()[:8192]
		rand.Read(src)
		b, _ := ini.Engine.AllocateBatch(1)
		if err := ini.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: src, Target: segs[i], TargetAddr: engine.AddrOf(tgts[i].Mem.Bytes())}}); err != nil {
			t.Fatal(err)
		}
		if err := ini.Engine.Wait(ctx, b); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		ini.Engine.FreeBatch(b)
		if !bytes.Equal(src, tgts[i].Mem.Bytes()[:8192]) {
			t.Fatalf("round %d: target memory differs", round)
		}
		held, evicted := it.Endpoints()
		if held != 1 || evicted != uint64(round) {
			t.Fatalf("round %d: %d endpoints held, %d evicted; want 1 and %d", round, held, evicted, round)
		}
		// The evicted endpoint's target drops its QPs.
		other := trs[1-i]
		deadline := time.Now().Add(20 * time.Second)
		for round > 0 && other.TargetQPs() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the evicted endpoint's target still holds %d QPs", round, other.TargetQPs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
