package rdma

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/httpmeta"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/uverbs"
)

// Mooncake's RDMA wire (Config.Mooncake) on the scripted fabric: the
// engines' metadata is Mooncake's P2PHANDSHAKE socket (package
// mooncake/p2p), whose Connection messages the target's transport
// answers. The same on Soft-RoCE is mooncake/p2p's rdma_guest_test.go.

// mcNode is a node whose segment is named by its handshake socket.
type mcNode struct {
	*fnode
	st *p2p.Store
}

func newMooncakeNode(t testing.TB, cfg Config, size int, devs ...*fakeDev) *mcNode {
	t.Helper()
	st, err := p2p.New(context.Background(), p2p.Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the engine's
	cfg.Mooncake = true
	tr := New(cfg)
	tr.open = opener(devs...)
	n := enginetest.NewNode(t, engine.Config{Name: st.Name(), Store: st, Retries: 3}, size, tr)
	st.HandleConnections(tr)
	return &mcNode{fnode: &fnode{Node: n, tr: tr, devs: devs}, st: st}
}

func mooncakePair(t testing.TB, f *fabric, size, rails int) (ini, tgt *mcNode, seg engine.SegmentID) {
	t.Helper()
	var a, b []*fakeDev
	for i := range rails {
		a = append(a, f.dev(fmt.Sprintf("a%d", i), -1))
		b = append(b, f.dev(fmt.Sprintf("b%d", i), -1))
	}
	tgt = newMooncakeNode(t, Config{}, size, b...)
	ini = newMooncakeNode(t, Config{}, size, a...)
	return ini, tgt, openSeg(t, ini.fnode, tgt.st.Name())
}

// TestFakeMooncakeWire: te to te over Mooncake's wire. The target serves a
// descriptor in Mooncake's RDMA form; WRITEs and READs of 1 B to 1 MiB
// move every byte over both rails; every endpoint has Mooncake's two QPs,
// connected with PSN 0 both ways and Mooncake's attributes; the target
// holds one passive endpoint per (rail, initiator NIC).
func TestFakeMooncakeWire(t *testing.T) {
	f := newFabric()
	const size = 4 << 20
	ini, tgt, seg := mooncakePair(t, f, size, 2)
	ctx := context.Background()

	md, err := p2p.Fetch(ctx, tgt.st.Name(), nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(md.Protocols, []string{mooncake.ProtoRDMA}) || len(md.Devices) != 2 || md.Devices[0].Name != "b0" || md.Devices[1].Name != "b1" ||
		len(md.Buffers) != 1 || md.Buffers[0].Name != "cpu:0" || len(md.Buffers[0].RKeys) != 2 || len(md.Buffers[0].LKeys) != 2 ||
		!slices.Equal(md.PriorityMatrix["cpu:0"].Preferred, []string{"b0", "b1"}) {
		t.Fatalf("target's Mooncake descriptor %+v", md)
	}
	if gid, err := mooncake.ParseGID(md.Devices[1].GID); err != nil || gid != netip.AddrFrom16(tgt.devs[1].port.GID.GID) {
		t.Fatalf("device GID %q: %v", md.Devices[1].GID, err)
	}

	ib, tb := ini.Mem.Bytes(), tgt.Mem.Bytes()
	rand.Read(ib)
	off := 0
	var reqs []engine.Request
	for _, n := range []int{1, 7, 4096, 64<<10 + 3, 1 << 20} {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: ib[off : off+n], Target: seg, TargetAddr: engine.AddrOf(tb) + uint64(off)})
		off += n + 13
	}
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		o := int(r.TargetAddr - engine.AddrOf(tb))
		if !bytes.Equal(tb[o:o+len(r.Local)], r.Local) {
			t.Fatalf("WRITE of %d bytes at %d differs", len(r.Local), o)
		}
	}
	// READ them back into the other half.
	for i := range reqs {
		o := int(reqs[i].TargetAddr - engine.AddrOf(tb))
		reqs[i].Op, reqs[i].Local = engine.Read, ib[size/2+o:size/2+o+len(reqs[i].Local)]
	}
	if err := transfer(t, ini.Engine, reqs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		o := int(r.TargetAddr - engine.AddrOf(tb))
		if !bytes.Equal(r.Local, tb[o:o+len(r.Local)]) {
			t.Fatalf("READ of %d bytes at %d differs", len(r.Local), o)
		}
	}

	// Both rails carried bytes; every QP of either side was connected as
	// Mooncake connects its own.
	for i, s := range ini.tr.Stats() {
		if s.Bytes == 0 {
			t.Errorf("rail %d carried nothing: %+v", i, s)
		}
	}
	eps, qps := tgt.tr.mc.count()
	if eps != 2 || qps != 4 {
		t.Fatalf("target holds %d endpoints, %d QPs; want 2 and 4", eps, qps)
	}
	f.mu.Lock()
	connected := 0
	for _, q := range f.qps {
		if q.closed.Load() || q.remote == 0 {
			continue
		}
		connected++
		c := q.conn
		if c.psn != 0 || c.remote.PSN != 0 || c.tune.Timeout != 14 || c.tune.RetryCnt != 7 || c.tune.RNRRetry != 7 || c.tune.MinRNRTimer != 12 ||
			c.tune.MaxRdAtomic != 16 || c.tune.MaxDestRdAtomic != 16 || c.tune.HopLimit != 16 || c.tune.MTU != uverbs.MTU1024 {
			t.Errorf("QP %#x connected with %+v", uint32(q.qpn), c)
		}
	}
	f.mu.Unlock()
	if connected != 8 {
		t.Fatalf("%d QPs connected, want 8 (2 endpoints × 2 QPs, both sides)", connected)
	}
	// A notified submission: the note arrives on the target's handshake
	// socket, after its data.
	for i := range reqs {
		reqs[i].Op = engine.Write
	}
	b, _ := ini.Engine.AllocateBatch(len(reqs))
	if err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: "kv", Msg: []byte("layer 7")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-tgt.Engine.Notifications():
		if n.Name != "kv" || string(n.Msg) != "layer 7" || n.From != p2p.NotifySender(netip.MustParseAddr("127.0.0.1")) {
			t.Fatalf("notification %+v", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after 10 s")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ini.Engine.Wait(wctx, b); err != nil {
		t.Fatal(err)
	}
	ini.Engine.FreeBatch(b)
}

// TestFakeMooncakeHTTPMetadata: through Mooncake's HTTP metadata (no
// P2PHANDSHAKE socket), the target's transport opens a handshake socket of
// its own (Config.Listen), published as its rpc_meta, where the
// initiator sets up endpoints and sends its notification; the bytes
// arrive.
func TestFakeMooncakeHTTPMetadata(t *testing.T) {
	ctx := context.Background()
	srv, err := httpmeta.Serve(ctx, httpmeta.ServerOptions{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	f := newFabric()
	node := func(name string, cfg Config, devs ...*fakeDev) *fnode {
		st, err := httpmeta.New(ctx, httpmeta.Options{URL: srv.URL("")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		cfg.Mooncake = true
		tr := New(cfg)
		tr.open = opener(devs...)
		return &fnode{Node: enginetest.NewNode(t, engine.Config{Name: name, Store: st, Retries: 3}, 1<<20, tr), tr: tr, devs: devs}
	}
	tgt := node("te_target", Config{Listen: "127.0.0.1:0"}, f.dev("b0", -1), f.dev("b1", -1))
	ini := node("te_init", Config{}, f.dev("a0", -1), f.dev("a1", -1))
	c, _ := httpmeta.NewClient(srv.URL(""))
	meta, err := c.Get(ctx, httpmeta.RPCMetaKey("", "te_target"))
	want := fmt.Sprintf(`{"ip_or_host_name":"127.0.0.1","rpc_port":%d}`, tgt.tr.hs.ListenAddr().(*net.TCPAddr).Port)
	if err != nil || string(meta) != want {
		t.Fatalf("rpc_meta %s (%v), want %s", meta, err, want)
	}
	seg := openSeg(t, ini, "te_target")
	ib, tb := ini.Mem.Bytes(), tgt.Mem.Bytes()
	rand.Read(ib)
	reqs := fakeRequests(engine.Write, ini, tgt, seg, 16, 64<<10)
	b, _ := ini.Engine.AllocateBatch(len(reqs))
	if err := ini.Engine.SubmitNotify(b, reqs, engine.Notify{Name: "http", Msg: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-tgt.Engine.Notifications():
		if n.Name != "http" || !bytes.Equal(ib, tb) {
			t.Fatalf("notification %+v; bytes in place: %v", n, bytes.Equal(ib, tb))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after 10 s")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ini.Engine.Wait(wctx, b); err != nil {
		t.Fatal(err)
	}
	ini.Engine.FreeBatch(b)
	if eps, _ := tgt.tr.mc.count(); eps != 2 {
		t.Fatalf("target holds %d endpoints, want 2", eps)
	}
}

// TestFakeMooncakeHandshake plays Mooncake's active side against the
// target's handshake socket with records written from the documented
// format: a fresh record gets QPs, a repeat the same ones, the ready ack
// is taken for those and refused for others, a new record for the same
// NIC pair replaces the endpoint, and records te cannot serve are refused
// in reply_msg with the NIC paths swapped.
func TestFakeMooncakeHandshake(t *testing.T) {
	f := newFabric()
	tgt := newMooncakeNode(t, Config{MaxInitiatorQPs: 4}, 1<<20, f.dev("b0", -1), f.dev("b1", -1))
	addr := tgt.st.Name()
	ctx := context.Background()
	peer := "10.0.1.1:15001@mlx5_0"
	local := tgt.st.Name() + "@b1"
	// Two QPs of a Mooncake process on the fabric.
	a := f.dev("mlx5_0", -1)
	q1, _ := a.CreateQP(4, 1)
	q2, _ := a.CreateQP(4, 1)
	req := &mooncake.Handshake{LocalNICPath: peer, PeerNICPath: local, LocalGID: netip.MustParseAddr("::ffff:10.0.1.1"),
		QPNums: []uint32{uint32(q1.QPN()), uint32(q2.QPN())}, ReadyAckSupported: true}
	send := func(r *mooncake.Handshake) *mooncake.Handshake {
		t.Helper()
		rep, err := p2p.SendConnection(ctx, addr, r, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if rep.LocalNICPath != r.PeerNICPath || rep.PeerNICPath != r.LocalNICPath || !rep.ReadyAckSupported {
			t.Fatalf("reply %+v to %+v", rep, r)
		}
		return rep
	}
	rep := send(req)
	if rep.ReplyMsg != "" || len(rep.QPNums) != 2 || rep.LocalGID != netip.AddrFrom16(tgt.devs[1].port.GID.GID) {
		t.Fatalf("reply %+v", rep)
	}
	if again := send(req); again.ReplyMsg != "" || !slices.Equal(again.QPNums, rep.QPNums) {
		t.Fatalf("repeat %+v, first %v", again, rep.QPNums)
	}
	ack := *req
	ack.ReadyAck = true
	if r := send(&ack); r.ReplyMsg != "" {
		t.Fatalf("ready ack refused: %q", r.ReplyMsg)
	}
	stale := ack
	stale.QPNums = []uint32{1, 2}
	if r := send(&stale); r.ReplyMsg == "" {
		t.Fatal("stale ready ack taken")
	}
	// The same NIC pair with new QPs: the endpoint is replaced.
	q3, _ := a.CreateQP(4, 1)
	next := *req
	next.QPNums = []uint32{uint32(q3.QPN()), uint32(q1.QPN())}
	if r := send(&next); r.ReplyMsg != "" || slices.Equal(r.QPNums, rep.QPNums) {
		t.Fatalf("replacement %+v", r)
	}
	if eps, qps := tgt.tr.mc.count(); eps != 1 || qps != 2 {
		t.Fatalf("%d endpoints, %d QPs after the replacement", eps, qps)
	}
	// A second NIC of the same source: its bound (4 QPs) holds both.
	other := *req
	other.LocalNICPath = "10.0.1.1:15001@mlx5_1"
	other.PeerNICPath = tgt.st.Name() + "@b0"
	if r := send(&other); r.ReplyMsg != "" {
		t.Fatal(r.ReplyMsg)
	}
	// A third: the oldest endpoint of that source makes room.
	third := other
	third.LocalNICPath = "10.0.1.1:15001@mlx5_2"
	if r := send(&third); r.ReplyMsg != "" {
		t.Fatal(r.ReplyMsg)
	}
	if eps, qps := tgt.tr.mc.count(); eps != 2 || qps != 4 {
		t.Fatalf("%d endpoints, %d QPs at the bound", eps, qps)
	}
	for name, bad := range map[string]*mooncake.Handshake{
		"unknown device": {LocalNICPath: peer, PeerNICPath: tgt.st.Name() + "@mlx5_9", LocalGID: req.LocalGID, QPNums: req.QPNums},
		"no QPs":         {LocalNICPath: peer, PeerNICPath: local, LocalGID: req.LocalGID},
		"no GID":         {LocalNICPath: peer, PeerNICPath: local, QPNums: []uint32{7, 8}},
		"too many QPs":   {LocalNICPath: peer, PeerNICPath: local, LocalGID: req.LocalGID, QPNums: make([]uint32, 5)},
	} {
		if r := send(bad); r.ReplyMsg == "" || len(r.QPNums) != 0 {
			t.Errorf("%s: %+v", name, r)
		}
	}
	// A NIC path Mooncake would not write is closed unanswered.
	if _, err := p2p.SendConnection(ctx, addr, &mooncake.Handshake{LocalNICPath: "nodevice", PeerNICPath: local, QPNums: req.QPNums}, time.Second); err == nil {
		t.Fatal("malformed NIC path answered")
	}
	// After Close every passive QP is gone and handshakes are refused.
	tgt.Engine.Close()
	if eps, _ := tgt.tr.mc.count(); eps != 0 {
		t.Fatalf("%d endpoints after Close", eps)
	}
	if r := send(req); r.ReplyMsg == "" {
		t.Fatal("handshake taken after Close")
	}
}

// TestFakeMooncakeAllocs: the te side allocates nothing per request over
// Mooncake's wire once its endpoints are up.
func TestFakeMooncakeAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates on its own")
	}
	f := newFabric()
	const tasks, blk = 128, 4096
	ini, tgt, seg := mooncakePair(t, f, tasks*blk, 2)
	reqs := fakeRequests(engine.Write, ini.fnode, tgt.fnode, seg, tasks, blk)
	ctx := context.Background()
	run, failed := enginetest.BatchLoop(ctx, ini.Engine, reqs)
	for range 8 {
		run()
	}
	allocs := enginetest.AllocsPerRun(20, run)
	if err := failed(); err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d", allocs, tasks)
	}
}

// FuzzHandleConnection feeds the passive side of Mooncake's handshake any
// record its socket would decode: it never panics, always answers with
// the NIC paths swapped, grants QPs only with an empty reply_msg, and
// stays within its QP bounds.
func FuzzHandleConnection(f *testing.F) {
	f.Add([]byte(`{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:01","local_lid":0,"local_nic_path":"10.0.1.1:15001@rxe0","payload":"","peer_nic_path":"x:1@b0","qp_num":[17,18],"ready_ack":false,"reply_msg":""}`))
	f.Add([]byte(`{"local_gid":"fe80::1","local_nic_path":"a:1@d","peer_nic_path":"x:1@b1","qp_num":[1,2,3],"ready_ack":true}`))
	f.Add([]byte(`{"local_nic_path":"a@d","peer_nic_path":"x@b9","qp_num":[]}`))
	fab := newFabric()
	tgt := newMooncakeNode(f, Config{MaxInitiatorQPs: 8, MaxTargetQPs: 12}, 1<<16, fab.dev("b0", -1), fab.dev("b1", -1))
	from := []netip.Addr{netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.1.2")}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := mooncake.DecodeHandshake(b)
		if err != nil {
			return
		}
		rep := tgt.tr.HandleConnection(context.Background(), from[len(b)%2], req)
		if rep == nil || rep.LocalNICPath != req.PeerNICPath || rep.PeerNICPath != req.LocalNICPath {
			t.Fatalf("reply %+v to %+v", rep, req)
		}
		if rep.ReplyMsg == "" && len(rep.QPNums) != len(req.QPNums) {
			t.Fatalf("accepted %d QPs with %d", len(req.QPNums), len(rep.QPNums))
		}
		if rep.ReplyMsg != "" && len(rep.QPNums) != 0 {
			t.Fatalf("refused (%q) with QPs %v", rep.ReplyMsg, rep.QPNums)
		}
		if _, err := rep.Encode(); err != nil {
			t.Fatalf("reply does not encode: %v", err)
		}
		tgt.tr.mc.mu.Lock()
		total, per := tgt.tr.mc.total, tgt.tr.mc.perSrc
		over := total > 12 || per[from[0]] > 8 || per[from[1]] > 8
		tgt.tr.mc.mu.Unlock()
		if over {
			t.Fatalf("bounds exceeded: %d QPs, per source %v", total, per)
		}
	})
}
