package p2p_test

// Mooncake's RDMA wire (package rdma with Config.Mooncake) on the
// Soft-RoCE guest, its endpoints set up on this package's handshake
// socket. It lives here rather than in package rdma so that its minute of
// guest time is this binary's, not added to rdma's long guest suite.

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/test/softroce/srenv"
)

// mcNode is an engine on Mooncake's wire: its metadata is Mooncake's
// P2PHANDSHAKE socket, which names the segment and carries the RDMA
// endpoint handshakes to its rdma transport (Config.Mooncake).
type mcNode struct {
	*enginetest.Node
	st *p2p.Store
	tr *rdma.Transport
}

func newMooncakeNode(t testing.TB, devs []string, size int, o p2p.Options) *mcNode {
	t.Helper()
	st, err := p2p.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the engine's
	tr := rdma.New(rdma.Config{Mooncake: true, Devices: devs})
	n := enginetest.NewNode(t, engine.Config{Name: st.Name(), Store: st, Retries: 3}, size, tr)
	st.HandleConnections(tr)
	return &mcNode{Node: n, st: st, tr: tr}
}

// TestMooncakeWire: on Soft-RoCE, two te engines speak Mooncake's RDMA
// wire to each other in both roles at once (each initiates to the other):
// descriptors from the P2PHANDSHAKE socket in Mooncake's RDMA form,
// endpoints from Mooncake's Connection messages, WRITEs and READs over
// both rails, every byte compared: 1 B to 64 MiB from A to B, 1 B to
// 1 MiB back from B to A (while A's endpoints to B stay up); then a
// notified WRITE each way, its note on the handshake socket after the
// data.
func TestMooncakeWire(t *testing.T) {
	topo := srenv.Require(t)
	const big = 64 << 20
	a := newMooncakeNode(t, names(topo.HostA), 2*big, p2p.Options{})
	b := newMooncakeNode(t, names(topo.HostB), big, p2p.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	md, err := p2p.Fetch(ctx, b.st.Name(), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(md.Protocols, []string{mooncake.ProtoRDMA}) || len(md.Devices) != 2 || md.Devices[0].Name != topo.HostB[0].Name ||
		len(md.Buffers) != 1 || len(md.Buffers[0].RKeys) != 2 {
		t.Fatalf("Mooncake descriptor of %s: %+v", b.st.Name(), md)
	}
	if gid, err := mooncake.ParseGID(md.Devices[1].GID); err != nil || gid.As16() != topo.HostB[1].GID {
		t.Fatalf("device %s's GID %q (%v), want %x", md.Devices[1].Name, md.Devices[1].GID, err, topo.HostB[1].GID)
	}
	for _, dir := range []struct {
		name     string
		ini, tgt *mcNode
		sizes    []int
	}{{"A->B", a, b, []int{1, 7, 4097, 64<<10 + 1, 1 << 20, big}}, {"B->A", b, a, []int{1, 4097, 1 << 20}}} {
		t.Run(dir.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			seg, err := dir.ini.Engine.OpenSegment(ctx, dir.tgt.st.Name(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ib, tb := dir.ini.Mem.Bytes(), dir.tgt.Mem.Bytes()
			top := dir.sizes[len(dir.sizes)-1]
			for _, n := range dir.sizes {
				src, back := ib[:n], ib[top:top+n]
				rand.Read(src)
				at := engine.AddrOf(tb) + uint64(top-n) // each size ends where the next begins: a stale byte shows
				one := func(op engine.Op, local []byte) {
					t.Helper()
					b, err := dir.ini.Engine.AllocateBatch(1)
					if err != nil {
						t.Fatal(err)
					}
					defer dir.ini.Engine.FreeBatch(b)
					if err := dir.ini.Engine.Submit(b, []engine.Request{{Op: op, Local: local, Target: seg, TargetAddr: at}}); err != nil {
						t.Fatal(err)
					}
					wctx, wcancel := context.WithTimeout(context.Background(), 120*time.Second)
					defer wcancel()
					if err := dir.ini.Engine.Wait(wctx, b); err != nil {
						st, _ := dir.ini.Engine.Status(b, 0)
						t.Fatalf("%v of %d bytes: %v (%v)", op, n, err, st.Err)
					}
				}
				one(engine.Write, src)
				if i := firstDiff(src, tb[top-n:top]); i >= 0 {
					t.Fatalf("WRITE of %d bytes: byte %d differs at the target", n, i)
				}
				clear(back)
				one(engine.Read, back)
				if !bytes.Equal(back, src) {
					t.Fatalf("READ of %d bytes: byte %d differs", n, firstDiff(back, src))
				}
			}
			// Both rails carried bytes.
			for _, s := range dir.ini.tr.Stats() {
				if s.Bytes == 0 {
					t.Errorf("rail %s carried nothing", s.Device)
				}
			}
			// A notified WRITE: the note reaches the target's handshake
			// socket once the bytes are in its memory.
			rand.Read(ib[:4096])
			b, err := dir.ini.Engine.AllocateBatch(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := dir.ini.Engine.SubmitNotify(b, []engine.Request{{Op: engine.Write, Local: ib[:4096], Target: seg, TargetAddr: engine.AddrOf(tb)}},
				engine.Notify{Name: dir.name, Msg: []byte("done")}); err != nil {
				t.Fatal(err)
			}
			select {
			case n := <-dir.tgt.Engine.Notifications():
				if n.Name != dir.name || string(n.Msg) != "done" || !bytes.Equal(tb[:4096], ib[:4096]) {
					t.Fatalf("notification %+v; data in place: %v", n, bytes.Equal(tb[:4096], ib[:4096]))
				}
			case <-time.After(60 * time.Second):
				t.Fatal("no notification after 60 s")
			}
			wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer wcancel()
			if err := dir.ini.Engine.Wait(wctx, b); err != nil {
				t.Fatal(err)
			}
			dir.ini.Engine.FreeBatch(b)
		})
	}
}

// TestMooncakeWireAllocs: over Mooncake's wire on Soft-RoCE, the te side
// allocates nothing per request once its endpoints are up.
func TestMooncakeWireAllocs(t *testing.T) {
	topo := srenv.Require(t)
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const tasks, blk = 64, 64 << 10
	// The initiator's store fetches the target's descriptor every
	// PollInterval to watch it (a JSON decode: hundreds of allocations a
	// second, whatever the traffic); here it polls once, so the windows
	// count the data path alone.
	o := p2p.Options{PollInterval: time.Hour}
	tgt := newMooncakeNode(t, names(topo.HostB), tasks*blk, o)
	ini := newMooncakeNode(t, names(topo.HostA), tasks*blk, o)
	ctx := context.Background()
	seg, err := ini.Engine.OpenSegment(ctx, tgt.st.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			reqs := make([]engine.Request, tasks)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes()) + uint64(i*blk)}
			}
			run, failed := enginetest.BatchLoop(ctx, ini.Engine, reqs)
			for range 4 {
				run()
			}
			allocs, all := enginetest.SteadyAllocs(8, 3, run)
			if err := failed(); err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per batch of %d (tries: %v)", allocs, tasks, all)
			}
		})
	}
}

func names(ds []srenv.Dev) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
