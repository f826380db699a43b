package diagnose_test

// These tests need RDMA devices: they run in the Soft-RoCE guest
// (test/softroce/run.sh ./internal/diagnose) and skip loudly elsewhere.

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/diagnose"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

var verbs = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider(), mlx5.Provider()}}

func devNames(ds []srenv.Dev) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

// rdmaPeer is host B's engine: rdma on its rails, one buffer.
func rdmaPeer(t *testing.T, st *enginetest.MemStore, topo srenv.Topo, devs []srenv.Dev) *enginetest.Node {
	t.Helper()
	return enginetest.NewNode(t, engine.Config{Name: "peer", Store: st}, 1<<20,
		rdma.New(rdma.Config{Devices: devNames(devs), Options: verbs}))
}

// rdmaInitiator is host A's unlisted engine with cfg's rdma transport.
func rdmaInitiator(t *testing.T, st *enginetest.MemStore, cfg rdma.Config) *enginetest.Node {
	t.Helper()
	cfg.Options, cfg.Listen = verbs, "127.0.0.1:0"
	return enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st, Unlisted: true, MetadataTimeout: 3 * time.Second},
		64<<10, rdma.New(cfg))
}

// rdmaRun diagnoses "peer" from ini, whose rdma transport runs with cfg;
// cached is the descriptor ini holds (nil: none).
func rdmaRun(t *testing.T, st *enginetest.MemStore, ini *enginetest.Node, cfg rdma.Config, cached *segment.Descriptor) *diagnose.Report {
	t.Helper()
	cfg.Options = verbs
	return run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "peer", Local: ini.Mem.Bytes(), RDMA: &cfg, Timeout: 10 * time.Second, Cached: cached})
}

// setLink changes a netdev and waits until dev's port reaches want.
func setLink(t *testing.T, netdev string, change func(netlink.Link) error, dev string, want func(uverbs.PortAttr) bool) {
	t.Helper()
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		t.Fatal(err)
	}
	if err := change(l); err != nil {
		t.Fatalf("%s: %v", netdev, err)
	}
	d, err := uverbs.LookupDevice(dev)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Open(verbs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pa, err := c.QueryPort(1)
		if err == nil && want(pa) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s port: %+v, %v: not in the wanted state after changing %s", dev, pa, err, netdev)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRDMAHealthy(t *testing.T) {
	topo := srenv.Require(t)
	st := enginetest.NewMemStore()
	defer st.Close()
	rdmaPeer(t, st.Process(), topo, topo.HostB)
	cfg := rdma.Config{Devices: devNames(topo.HostA)}
	ini := rdmaInitiator(t, st, cfg)
	rep := rdmaRun(t, st, ini, cfg, nil)
	if !rep.OK() || rep.Protocol != "rdma" {
		t.Fatalf("a healthy peer over rdma: protocol %s, failed %+v", rep.Protocol, rep.Failed())
	}
	for _, l := range []diagnose.Layer{diagnose.LayerRDMAPort, diagnose.LayerRDMAGID, diagnose.LayerRDMAMTU, diagnose.LayerRDMARoute,
		diagnose.LayerRDMAQP, diagnose.LayerRDMATimeout, diagnose.LayerRDMARKey, diagnose.LayerRDMAProbe} {
		if got := rep.Find(l); len(got) != len(topo.HostA) {
			t.Errorf("%s: %d checks, want one per rail (%d)", l, len(got), len(topo.HostA))
		}
	}
	for i, c := range rep.Find(diagnose.LayerRDMARoute) {
		if !strings.Contains(c.Detail, "leaves through "+topo.HostA[i].Netdev) {
			t.Errorf("rail %d route: %s, want it through %s", i, c.Detail, topo.HostA[i].Netdev)
		}
	}
	for i, c := range rep.Find(diagnose.LayerRDMAProbe) {
		if !strings.Contains(c.Detail, topo.HostA[i].Name+" -> "+topo.HostB[i].Name) {
			t.Errorf("rail %d probe: %s", i, c.Detail)
		}
	}
}

// A GID index that picks the link-local GID (index 0 on rxe) cannot route.
func TestRDMAWrongGIDIndex(t *testing.T) {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	st := enginetest.NewMemStore()
	defer st.Close()
	rdmaPeer(t, st.Process(), topo, []srenv.Dev{b})
	zero := 0
	cfg := rdma.Config{Devices: []string{a.Name}, GIDIndex: &zero}
	ini := rdmaInitiator(t, st, cfg)
	rep := rdmaRun(t, st, ini, cfg, nil)
	failedAt(t, rep, diagnose.LayerRDMAGID, diagnose.ErrBadGID, "GID[0] fe80::", "link-local")
}

// One end's netdev at MTU 9000 (RoCE 4096), the other's at 1500 (1024),
// or the other way round when the guest runs at 9000.
func TestRDMAMTUMismatch(t *testing.T) {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	st := enginetest.NewMemStore()
	defer st.Close()
	rdmaPeer(t, st.Process(), topo, []srenv.Dev{b})
	mtu, active, peer := 9000, 4096, 1024
	if topo.MTU >= 4200 {
		mtu, active, peer = 1500, 1024, 4096
	}
	setLink(t, a.Netdev, func(l netlink.Link) error { return netlink.LinkSetMTU(l, mtu) }, a.Name,
		func(pa uverbs.PortAttr) bool { return pa.ActiveMTU.Bytes() == active })
	defer setLink(t, a.Netdev, func(l netlink.Link) error { return netlink.LinkSetMTU(l, topo.MTU) }, a.Name,
		func(pa uverbs.PortAttr) bool { return pa.ActiveMTU.Bytes() == peer })
	cfg := rdma.Config{Devices: []string{a.Name}}
	ini := rdmaInitiator(t, st, cfg)
	rep := rdmaRun(t, st, ini, cfg, nil)
	failedAt(t, rep, diagnose.LayerRDMAMTU, diagnose.ErrMTU, "MTU mismatch", fmt.Sprintf("active MTU %d", active),
		fmt.Sprintf("MTU %d", mtu), fmt.Sprintf("%s %d", b.Name, peer))
}

// keepRoutes saves every IPv4 route out of netdev, in every table, and
// returns a function that puts back those its going down removed (the
// guest's per-rail policy routes live in their own tables).
func keepRoutes(t *testing.T, netdev string) func() {
	t.Helper()
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		t.Fatal(err)
	}
	const family4, allTables = 2, 0 // AF_INET, RT_TABLE_UNSPEC
	rs, err := netlink.RouteListFiltered(family4, &netlink.Route{LinkIndex: l.Attrs().Index, Table: allTables}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		for _, r := range rs {
			// EEXIST: the kernel put that one back itself (the
			// prefix and local routes of the netdev's address).
			if err := netlink.RouteReplace(&r); err != nil && !errors.Is(err, syscall.EEXIST) {
				t.Errorf("restoring route %v: %v", r, err)
			}
		}
	}
}

// The rail's interface goes down under a running engine.
func TestRDMARailDown(t *testing.T) {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	st := enginetest.NewMemStore()
	defer st.Close()
	rdmaPeer(t, st.Process(), topo, []srenv.Dev{b})
	cfg := rdma.Config{Devices: []string{a.Name}}
	ini := rdmaInitiator(t, st, cfg)
	restore := keepRoutes(t, a.Netdev)
	setLink(t, a.Netdev, netlink.LinkSetDown, a.Name, func(pa uverbs.PortAttr) bool { return pa.State != uverbs.PortActive })
	defer func() {
		setLink(t, a.Netdev, netlink.LinkSetUp, a.Name, func(pa uverbs.PortAttr) bool { return pa.State == uverbs.PortActive })
		restore()
	}()
	rep := rdmaRun(t, st, ini, cfg, nil)
	c := failedAt(t, rep, diagnose.LayerRDMAPort, diagnose.ErrRailDown, a.Name+" port 1 is DOWN", "netdev "+a.Netdev+" is down")
	if !strings.Contains(c.Fix, "ip link set "+a.Netdev+" up") {
		t.Errorf("fix %q", c.Fix)
	}
	if got := rep.Find(diagnose.LayerRDMAProbe); len(got) != 1 || got[0].Status != diagnose.Skip {
		t.Errorf("probe: %+v, want SKIP", got)
	}
}

// The peer restarts: the cached descriptor's epoch and rkeys are void.
func TestRDMAStaleEpoch(t *testing.T) {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	st := enginetest.NewMemStore()
	defer st.Close()
	old := st.Process()
	p := rdmaPeer(t, old, topo, []srenv.Dev{b})
	cached := p.Engine.LocalDescriptor()
	if err := p.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	old.Close()
	rdmaPeer(t, st.Process(), topo, []srenv.Dev{b})
	cfg := rdma.Config{Devices: []string{a.Name}}
	ini := rdmaInitiator(t, st, cfg)
	rep := rdmaRun(t, st, ini, cfg, cached)
	failedAt(t, rep, diagnose.LayerEpoch, engine.ErrPeerReset, "restarted since its descriptor was cached")
	rk := rep.Find(diagnose.LayerRDMARKey)
	if len(rk) != 1 || rk[0].Status != diagnose.Fail || !strings.Contains(rk[0].Detail, "the cached rkey") || !strings.Contains(rk[0].Detail, "is of epoch") {
		t.Errorf("rkey: %+v, want FAIL naming the cached rkey", rk)
	}
	if pr := rep.Find(diagnose.LayerRDMAProbe); len(pr) != 1 || pr[0].Status != diagnose.Pass {
		t.Errorf("probe with the store's descriptor: %+v, want PASS", pr)
	}
}
