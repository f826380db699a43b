package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/leakcheck"
)

func TestMain(m *testing.M) {
	// The runnable examples need RDMA devices: outside the Soft-RoCE
	// guest, unless -run says otherwise, only tests and fuzz seeds run
	// (test/softroce/run.sh ./rdma runs the examples).
	flag.Parse()
	if !srenv.InGuest() && flag.Lookup("test.run").Value.String() == "" {
		fmt.Fprintln(os.Stderr, "rdma: SKIP examples (they need the Soft-RoCE guest: test/softroce/run.sh ./rdma)")
		flag.Set("test.run", "^(Test|Fuzz)")
	}
	// The scripted fabric's and the simulated ConnectX's tests need no
	// device and CI's unit tier runs them on the host (with -race); in the
	// guest, where the binary has a per-binary time limit under emulation,
	// only the device tests run unless -skip says otherwise.
	if srenv.InGuest() && flag.Lookup("test.skip").Value.String() == "" {
		fmt.Fprintln(os.Stderr, "rdma: the unit tier runs TestFake*, TestSim* and TestNoLostWakeup on the host; the guest runs the device tests")
		flag.Set("test.skip", "^(TestFake|TestSim|TestNoLostWakeup$)")
	}
	leakcheck.Main(m)
}

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider(), mlx5.Provider()}}

func names(ds []srenv.Dev) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

// factory returns transports on the given devices.
func factory(devs []string, cfg rdma.Config) transporttest.Factory {
	return func(testing.TB) engine.Transport {
		c := cfg
		c.Options, c.Devices = opts, devs
		return rdma.New(c)
	}
}

// TestConformance runs the engine's transport suite over RDMA between the
// two simulated hosts (both rails: initiator on host A's, target on host
// B's) and on the loopback device. test/softroce/rdmaconf runs it with the
// target in another process, rail cases included.
func TestConformance(t *testing.T) {
	topo := srenv.Require(t)
	t.Run("rails", func(t *testing.T) {
		transporttest.Run(t, factory(names(topo.HostA), rdma.Config{}),
			transporttest.Options{Target: factory(names(topo.HostB), rdma.Config{})})
	})
	t.Run("loopback", func(t *testing.T) {
		lo := []string{topo.Lo.Name}
		transporttest.Run(t, factory(lo, rdma.Config{}))
	})
}

type pair struct {
	ini, tgt *enginetest.Node
	it, tt   *rdma.Transport
	seg      engine.SegmentID
	store    segment.Store
}

func newPair(t testing.TB, size int, a, b []string, cfg rdma.Config) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	cfg.Options = opts
	tc, ic := cfg, cfg
	tc.Devices, ic.Devices = b, a
	p := &pair{tt: rdma.New(tc), it: rdma.New(ic), store: st}
	p.tgt = enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, size, p.tt)
	p.ini = enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st, Retries: 3}, size, p.it)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if p.seg, err = p.ini.Engine.OpenSegment(ctx, "target", nil); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pair) requests(op engine.Op, tasks, blk int) []engine.Request {
	tb := engine.AddrOf(p.tgt.Mem.Bytes())
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: op, Local: p.ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: p.seg, TargetAddr: tb + uint64(i*blk)}
	}
	return reqs
}

func (p *pair) run(t testing.TB, reqs []engine.Request, during func()) {
	t.Helper()
	b, err := p.ini.Engine.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ini.Engine.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := p.ini.Engine.Wait(ctx, b); err != nil {
		for i := range reqs {
			if st, _ := p.ini.Engine.Status(b, i); st.State != engine.StateCompleted {
				t.Errorf("task %d: %v %v", i, st.State, st.Err)
				break
			}
		}
		t.Fatal(err)
	}
	if err := p.ini.Engine.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}

// TestMultiRail moves one batch over both rails: both rails' byte
// counters grow and every byte arrives.
func TestMultiRail(t *testing.T) {
	topo := srenv.Require(t)
	const tasks, blk = 64, 256 << 10
	p := newPair(t, tasks*blk, names(topo.HostA), names(topo.HostB), rdma.Config{})
	rand.Read(p.ini.Mem.Bytes())
	p.run(t, p.requests(engine.Write, tasks, blk), nil)
	if !bytes.Equal(p.ini.Mem.Bytes(), p.tgt.Mem.Bytes()) {
		t.Fatal("target memory differs after the WRITE batch")
	}
	st := p.it.Stats()
	t.Logf("rails: %+v", st)
	if len(st) != 2 {
		t.Fatalf("%d rails, want 2", len(st))
	}
	var sum uint64
	for _, r := range st {
		if r.Bytes == 0 {
			t.Errorf("rail %s carried no bytes", r.Device)
		}
		sum += r.Bytes
	}
	if sum != tasks*blk {
		t.Errorf("rails carried %d bytes, want %d", sum, tasks*blk)
	}
	clear(p.ini.Mem.Bytes())
	p.run(t, p.requests(engine.Read, tasks, blk), nil)
	if !bytes.Equal(p.ini.Mem.Bytes(), p.tgt.Mem.Bytes()) {
		t.Fatal("local memory differs after the READ batch")
	}
}

func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// TestRailDown takes rail 2's link down in the middle of a batch: the
// batch completes on rail 1 with every byte verified, and rail 2 carries
// traffic again once its link is back.
func TestRailDown(t *testing.T) {
	topo := srenv.Require(t)
	const tasks, blk = 256, 256 << 10
	p := newPair(t, tasks*blk, names(topo.HostA), names(topo.HostB), rdma.Config{})
	dev := topo.HostA[1].Netdev
	t.Cleanup(func() { exec.Command("ip", "link", "set", dev, "up").Run() })
	rand.Read(p.ini.Mem.Bytes())
	p.run(t, p.requests(engine.Write, tasks, blk), func() {
		time.Sleep(50 * time.Millisecond)
		ip(t, "link", "set", dev, "down")
	})
	if !bytes.Equal(p.ini.Mem.Bytes(), p.tgt.Mem.Bytes()) {
		t.Fatal("target memory differs after the batch that lost a rail")
	}
	st := p.it.Stats()
	t.Logf("after down: %+v", st)
	if st[1].Up {
		t.Error("rail 2 still reported up")
	}
	ip(t, "link", "set", dev, "up")
	deadline := time.Now().Add(20 * time.Second)
	for !p.it.Stats()[1].Up {
		if time.Now().After(deadline) {
			t.Fatal("rail 2 not up again 20 s after its link came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := p.it.Stats()[1].Bytes
	rand.Read(p.ini.Mem.Bytes())
	p.run(t, p.requests(engine.Write, 64, blk), nil)
	if !bytes.Equal(p.ini.Mem.Bytes()[:64*blk], p.tgt.Mem.Bytes()[:64*blk]) {
		t.Fatal("target memory differs after the rail came back")
	}
	if after := p.it.Stats()[1].Bytes; after == before {
		t.Errorf("rail 2 carried nothing after it came back: %+v", p.it.Stats())
	}
}

// TestSteadyStateAllocs: a batch of 128 slices submitted, completed and
// freed allocates nothing, initiator and target included.
func TestSteadyStateAllocs(t *testing.T) {
	topo := srenv.Require(t)
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, c := range []struct {
		op  engine.Op
		blk int
	}{{engine.Write, 4096}, {engine.Read, 4096}, {engine.Write, 64 << 10}, {engine.Read, 64 << 10}} {
		t.Run(fmt.Sprintf("%v/%d", c.op, c.blk), func(t *testing.T) {
			const tasks = 128
			p := newPair(t, tasks*c.blk, names(topo.HostA), names(topo.HostB), rdma.Config{})
			reqs := p.requests(c.op, tasks, c.blk)
			ctx := context.Background()
			var failed error
			run := func() {
				b, err := p.ini.Engine.AllocateBatch(tasks)
				if err == nil {
					err = p.ini.Engine.Submit(b, reqs)
				}
				if err == nil {
					err = p.ini.Engine.Wait(ctx, b)
				}
				if err == nil {
					err = p.ini.Engine.FreeBatch(b)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			for range 4 {
				run() // warm up: endpoints, queues, the engine's pools
			}
			allocs, all := enginetest.SteadyAllocs(8, 3, run)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per batch of %d (tries: %v)", allocs, tasks, all)
			}
		})
	}
}

// TestLocationPriority: memory whose location prefers rail 2 (Config.
// Priority, Mooncake's NIC priority matrix) moves only over rail 2 while
// it is up, and over rail 1 while it is down.
func TestLocationPriority(t *testing.T) {
	topo := srenv.Require(t)
	const tasks, blk = 32, 64 << 10
	a, b := names(topo.HostA), names(topo.HostB)
	p := newPair(t, tasks*blk, a, b, rdma.Config{Priority: map[string][]string{"cpu:0": {a[1]}}})
	rand.Read(p.ini.Mem.Bytes())
	p.run(t, p.requests(engine.Write, tasks, blk), nil)
	if st := p.it.Stats(); st[0].Bytes != 0 || st[1].Bytes != tasks*blk {
		t.Fatalf("preferred rail 2: %+v", st)
	}
	dev := topo.HostA[1].Netdev
	t.Cleanup(func() { exec.Command("ip", "link", "set", dev, "up").Run() })
	ip(t, "link", "set", dev, "down")
	waitUp(t, p.it, 1, false)
	p.run(t, p.requests(engine.Write, tasks, blk), nil)
	if !bytes.Equal(p.ini.Mem.Bytes(), p.tgt.Mem.Bytes()) {
		t.Fatal("target memory differs")
	}
	if st := p.it.Stats(); st[0].Bytes != tasks*blk {
		t.Fatalf("preferred rail down, rail 1 should carry the batch: %+v", st)
	}
	ip(t, "link", "set", dev, "up")
	waitUp(t, p.it, 1, true)
}

func waitUp(t *testing.T, tr *rdma.Transport, rail int, up bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for tr.Stats()[rail].Up != up {
		if time.Now().After(deadline) {
			t.Fatalf("rail %d not up=%v after 20 s", rail, up)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
