package uverbs_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"net/netip"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}

func open(t *testing.T, name string) *uverbs.Context {
	t.Helper()
	c, err := uverbs.Open(name, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
	})
	return c
}

func TestDiscovery(t *testing.T) {
	topo := srenv.Require(t)
	devs, err := uverbs.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append(topo.Devs[:], topo.Lo) {
		d, err := uverbs.LookupDevice(want.Name)
		if err != nil {
			t.Fatalf("%s: %v (have %v)", want.Name, err, devs)
		}
		if d.DriverID != uverbs.DriverRXE || d.DriverIDFrom != "netlink" || d.ABIVersion != 2 || d.Ports != 1 {
			t.Errorf("%s: driver %s (from %s) abi %d ports %d, want rxe from netlink, abi 2, 1 port", d.Name, d.DriverID, d.DriverIDFrom, d.ABIVersion, d.Ports)
		}
		if d.Parent == "" {
			t.Errorf("%s: no parent netdev", d.Name)
		}
		ents, err := d.GIDs(1)
		if err != nil {
			t.Fatal(err)
		}
		g, err := uverbs.FindGID(ents, ipOf(t, want), uverbs.GIDTypeRoCEv2)
		if err != nil {
			t.Fatalf("%s: %v in %v", d.Name, err, ents)
		}
		if g.Index != want.GIDIndex || g.GID != uverbs.GID(want.GID) {
			t.Errorf("%s: sysfs GID index %d, harness found %d", d.Name, g.Index, want.GIDIndex)
		}
		// DeviceForAddr scans every device's 1024-entry sysfs GID table
		// (slow under TCG): check it for two devices only.
		if want.Name == topo.Lo.Name || want.Name == topo.Devs[0].Name {
			if dd, dg, err := uverbs.DeviceForAddr(ipOf(t, want)); err != nil || dd.Name != d.Name || dg.Index != g.Index {
				t.Errorf("DeviceForAddr(%s): %s %+v %v", want.IP, dd.Name, dg, err)
			}
		}
		c := open(t, d.Name)
		ge, err := c.FindRoCEv2GID(1, ipOf(t, want))
		if err != nil {
			t.Fatal(err)
		}
		if ge.Index != g.Index || ge.GID != g.GID || ge.Type != uverbs.GIDTypeRoCEv2 || ge.Ifindex != g.Ifindex || ge.Netdev != g.Netdev || ge.Netdev != want.Netdev {
			t.Errorf("%s: ioctl GID %+v, sysfs %+v", d.Name, ge, g)
		}
		t.Logf("%s: %s GID[%d] = %s (%s, ifindex %d)", d.Name, d.Path, g.Index, g.GID, g.Netdev, g.Ifindex)
	}
	if _, err := uverbs.LookupDevice("no-such-dev"); !errors.Is(err, uverbs.ErrNoDevice) {
		t.Errorf("lookup of a missing device: %v", err)
	}
	if _, err := uverbs.Open(topo.Devs[0].Name, &uverbs.Options{Providers: []uverbs.Provider{}}); err != nil && !errors.Is(err, uverbs.ErrNoProvider) {
		t.Errorf("open without provider: %v", err)
	}
}

func TestQueries(t *testing.T) {
	topo := srenv.Require(t)
	c := open(t, topo.Devs[0].Name)
	da, err := c.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if da.VendorID != 0xffffff || da.MaxQPWR == 0 || da.MaxCQE == 0 || da.MaxSGE == 0 || da.PhysPortCnt != 1 || da.AtomicCap == 0 {
		t.Errorf("unexpected rxe device attrs %+v", da)
	}
	dx, err := c.QueryDeviceEx()
	if err != nil {
		t.Fatal(err)
	}
	if dx.DeviceAttr != da || dx.CapFlagsEx&0xffffffff != uint64(da.DeviceCapFlags) {
		t.Errorf("extended query disagrees: %+v vs %+v", dx, da)
	}
	pa, err := c.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if pa.State != uverbs.PortActive || pa.LinkLayer != uverbs.LinkLayerEthernet || pa.ActiveMTU == 0 || pa.MaxMsgSize == 0 {
		t.Errorf("unexpected port attrs %+v", pa)
	}
	if _, err := c.QueryPort(9); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("query of port 9: %v, want EINVAL", err)
	}
	t.Logf("device %+v", da)
	t.Logf("port %+v", pa)
}

func TestObjectLifecycle(t *testing.T) {
	topo := srenv.Require(t)
	c, err := uverbs.Open(topo.Devs[0].Name, opts)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(1<<20, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if mr.LKey() == 0 || mr.RKey() == 0 || mr.Len() != 1<<20 {
		t.Errorf("MR lkey %#x rkey %#x len %d", mr.LKey(), mr.RKey(), mr.Len())
	}
	local, err := pd.AllocMR(4096, uverbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if local.RKey() != 0 && false {
		t.Log("rkey without remote access", local.RKey())
	}
	// REMOTE_WRITE without LOCAL_WRITE is invalid.
	buf, err := uverbs.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(buf.Bytes(), uverbs.AccessRemoteWrite); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("reg_mr(REMOTE_WRITE) without LOCAL_WRITE: %v, want EINVAL", err)
	}
	ch, err := c.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(uverbs.CQConfig{Entries: 100, Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	if cq.Entries() < 100 {
		t.Errorf("CQ entries %d < 100", cq.Entries())
	}
	qp, err := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: uverbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	if err != nil {
		t.Fatal(err)
	}
	caps := qp.Caps()
	if caps.MaxSendWR < 16 || caps.MaxRecvWR < 16 || caps.MaxSendSGE < 2 || caps.MaxInlineData < 64 || qp.QPN() == 0 {
		t.Errorf("QP %#x caps %+v", qp.QPN(), caps)
	}
	a, err := qp.Query()
	if err != nil || a.State != uverbs.QPStateReset {
		t.Fatalf("query new QP: %v state %s", err, a.State)
	}
	// Posting in RESET/INIT is refused.
	if _, err := qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend}}); !errors.Is(err, uverbs.ErrQPState) {
		t.Errorf("post_send in RESET: %v", err)
	}
	if _, err := qp.PostRecv([]uverbs.RecvWR{{}}); !errors.Is(err, uverbs.ErrQPState) {
		t.Errorf("post_recv in RESET: %v", err)
	}
	if err := qp.ToInit(1, uverbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if a, err := qp.Query(); err != nil || a.State != uverbs.QPStateInit || a.Port != 1 || a.Access != uverbs.AccessRemoteWrite {
		t.Fatalf("after INIT: %v %+v", err, a)
	}
	if _, err := qp.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend}}); !errors.Is(err, uverbs.ErrQPState) {
		t.Errorf("post_send in INIT: %v", err)
	}
	// Children keep their parents busy.
	if err := pd.Close(); !errors.Is(err, uverbs.ErrBusy) {
		t.Errorf("PD close with children: %v", err)
	}
	if err := cq.Close(); !errors.Is(err, uverbs.ErrBusy) {
		t.Errorf("CQ close with a QP: %v", err)
	}
	if err := ch.Close(); !errors.Is(err, uverbs.ErrBusy) {
		t.Errorf("channel close with a CQ: %v", err)
	}
	// Arm + no completion: Wait times out.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	var wc [4]uverbs.WC
	if _, err := cq.Wait(ctx, wc[:]); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wait on an idle CQ: %v", err)
	}
	cancel()
	for i := 0; i < 2; i++ {
		for _, cl := range []interface{ Close() error }{qp, cq, ch, mr, local, pd, buf} {
			if err := cl.Close(); err != nil {
				t.Errorf("close #%d of %T: %v", i+1, cl, err)
			}
		}
	}
	if _, err := qp.Query(); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("query after close: %v", err)
	}
	if _, err := cq.Poll(wc[:]); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("poll after close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal("second close:", err)
	}
	for closed := false; !closed; {
		select {
		case ev, ok := <-c.Events():
			if ok {
				t.Logf("event %s", ev)
			}
			closed = !ok
		case <-time.After(5 * time.Second):
			t.Fatal("Events channel still open after Close")
		}
	}
	if _, err := c.AllocPD(); !errors.Is(err, uverbs.ErrClosed) {
		t.Errorf("alloc_pd on a closed context: %v", err)
	}
	if live := uverbs.LiveObjects(); len(live) != 0 {
		t.Errorf("live objects after close: %v", live)
	}
}

// TestContextCloseReportsLeaks: closing a context with open children destroys
// them and says so.
func TestContextCloseReportsLeaks(t *testing.T) {
	topo := srenv.Require(t)
	c, err := uverbs.Open(topo.Lo.Name, opts)
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(uverbs.CQConfig{Entries: 8})
	if _, err := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: uverbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.AllocMR(4096, uverbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	err = c.Close()
	if !errors.Is(err, uverbs.ErrLeak) {
		t.Fatalf("close with children: %v", err)
	}
	t.Log(err)
	if live := uverbs.LiveObjects(); len(live) != 0 {
		t.Errorf("live objects after forced close: %v", live)
	}
}

func ipOf(t *testing.T, d srenv.Dev) netip.Addr {
	t.Helper()
	a, ok := netip.AddrFromSlice(d.IP)
	if !ok {
		t.Fatalf("%s: bad IP %v", d.Name, d.IP)
	}
	return a.Unmap()
}

// TestWaitersParkWithoutThreads: goroutines blocked on completion channels
// wait in the Go netpoller, not in read(2) on an OS thread each.
func TestWaitersParkWithoutThreads(t *testing.T) {
	topo := srenv.Require(t)
	c := open(t, topo.Lo.Name)
	const n = 64
	threads := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				k, _ := strconv.Atoi(strings.TrimSpace(v))
				return k
			}
		}
		t.Fatal("no Threads line")
		return 0
	}
	var cqs []*uverbs.CQ
	var chs []*uverbs.CompChannel
	for i := 0; i < n; i++ {
		ch, err := c.CreateCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := c.CreateCQ(uverbs.CQConfig{Entries: 4, Channel: ch})
		if err != nil {
			t.Fatal(err)
		}
		chs, cqs = append(chs, ch), append(cqs, cq)
	}
	base := threads()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, n)
	for _, cq := range cqs {
		go func() {
			_, err := cq.Wait(ctx, make([]uverbs.WC, 1))
			errs <- err
		}()
	}
	time.Sleep(300 * time.Millisecond)
	during := threads()
	cancel()
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("waiter: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter did not return after cancel")
		}
	}
	t.Logf("threads: %d before, %d with %d blocked waiters", base, during, n)
	if during-base >= n/2 {
		t.Errorf("%d blocked waiters used %d extra OS threads", n, during-base)
	}
	for i := range cqs {
		if err := cqs[i].Close(); err != nil {
			t.Error(err)
		}
		if err := chs[i].Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestWriteFallback runs CQ create/destroy and QP destroy through the legacy
// write() commands (the path taken on kernels without those ioctl methods)
// and moves data over the result.
func TestWriteFallback(t *testing.T) {
	topo := srenv.Require(t)
	uverbs.SetUseIoctl(false)
	defer uverbs.SetUseIoctl(true)
	c := open(t, topo.Lo.Name)
	gid, err := c.FindRoCEv2GID(1, ipOf(t, topo.Lo))
	if err != nil {
		t.Fatal(err)
	}
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	mr, err := pd.AllocMR(8192, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	ch, err := c.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	cq, err := c.CreateCQ(uverbs.CQConfig{Entries: 16, Channel: ch})
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	caps := uverbs.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	qa, err := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: caps})
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb, err := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: caps})
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	ea, _ := qa.LocalEndpoint(1, gid.GID, 1)
	eb, _ := qb.LocalEndpoint(1, gid.GID, 2)
	if err := qa.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(gid.Index), LocalPSN: 1, Remote: eb}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(gid.Index), LocalPSN: 2, Remote: ea}); err != nil {
		t.Fatal(err)
	}
	copy(mr.Bytes(), "write path")
	if _, err := qa.PostSend([]uverbs.SendWR{{ID: 5, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{mr.SGE(0, 10)}, RemoteAddr: mr.Addr() + 4096, RKey: mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]uverbs.WC, 1)
	if _, err := cq.Wait(ctx, wc); err != nil || wc[0].Status != uverbs.WCSuccess || wc[0].ID != 5 {
		t.Fatalf("completion %+v %v", wc[0], err)
	}
	if got := string(mr.Bytes()[4096:4106]); got != "write path" {
		t.Fatalf("data %q", got)
	}
	for _, cl := range []interface{ Close() error }{qa, qb, cq} {
		if err := cl.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
