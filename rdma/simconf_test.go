//go:build amd64 || arm64

package rdma

import (
	"context"
	"fmt"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/mlx5"
)

// TestSimConformance runs the engine's transport conformance suite over
// the RDMA transport on simulated ConnectX devices, two rails per host
// (the multi-rail cases take host A's ports down and up), on any host.
func TestSimConformance(t *testing.T) {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	opts := f.Options(mlx5.Provider())
	devs := func(host string) []string {
		return []string{f.AddDevice(host + "_mlx5_0").Name, f.AddDevice(host + "_mlx5_1").Name}
	}
	factory := func(devs []string) transporttest.Factory {
		return func(testing.TB) engine.Transport { return New(Config{Devices: devs, Options: opts}) }
	}
	a := devs("a")
	transporttest.Run(t, factory(a), transporttest.Options{Target: factory(devs("b")), Rails: &transporttest.Rails{
		Count: len(a),
		Bytes: func(tr engine.Transport) []uint64 {
			var out []uint64
			for _, r := range tr.(*Transport).Stats() {
				out = append(out, r.Bytes)
			}
			return out
		},
		SetLink: func(rail int, up bool) error { return f.SetPort(a[rail], up) },
	}})
}

// TestSimSteadyStateAllocs: a batch of WRITEs or READs through the real
// verbs path (the rail, uverbs, the mlx5 provider's rings and doorbells)
// allocates nothing once endpoints and pools are warm, on simulated
// ConnectX devices, on any host (TestSteadyStateAllocs is the same on
// Soft-RoCE in the guest). The simulated HCA allocates nothing per work
// request either: AllocsPerRun counts every goroutine.
func TestSimSteadyStateAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	for _, c := range []struct {
		op  engine.Op
		blk int
	}{{engine.Write, 4096}, {engine.Read, 4096}, {engine.Write, 64 << 10}, {engine.Read, 64 << 10}} {
		t.Run(fmt.Sprintf("%v/%d", c.op, c.blk), func(t *testing.T) {
			const tasks = 128
			f := mlx5sim.NewFabric()
			t.Cleanup(func() { f.Close() })
			st := enginetest.NewMemStore()
			t.Cleanup(func() { st.Close() })
			tgt := newSimNode(t, st, "target", f, mlx5.Provider(), nil, tasks*c.blk)
			ini := newSimNode(t, st, "initiator", f, mlx5.Provider(), nil, tasks*c.blk)
			reqs := fakeRequests(c.op, ini, tgt, openSeg(t, ini, "target"), tasks, c.blk)
			ctx := context.Background()
			run, failed := enginetest.BatchLoop(ctx, ini.Engine, reqs)
			for range 4 {
				run() // warm up: endpoints, queues, the engine's pools, the HCA's scratch
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
