package mctcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/mooncake/httpmeta"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment"
)

// mcNode is an engine that speaks only Mooncake's wire: the P2PHANDSHAKE
// store or HTTP metadata, and this transport.
type mcNode struct {
	e   *engine.Engine
	mem *engine.Memory
}

func newMCNode(t *testing.T, name string, st segment.Store, size int) *mcNode {
	t.Helper()
	e, err := engine.New(engine.Config{Name: name, Store: st, MetadataTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.Install(New(Config{})); err != nil {
		t.Fatal(err)
	}
	mem, err := engine.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := e.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	return &mcNode{e: e, mem: mem}
}

// roundTrip writes random bytes of each size to the target, reads them
// back into another buffer, and checks both the target's memory and what
// came back.
func roundTrip(t *testing.T, ini, tgt *mcNode, seg engine.SegmentID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	half := len(ini.mem.Bytes()) / 2
	for _, n := range []int{1, 4096, 1 << 20, half} {
		src, dst := ini.mem.Bytes()[:n], ini.mem.Bytes()[half:half+n]
		rand.Read(src)
		clear(dst)
		remote := engine.AddrOf(tgt.mem.Bytes())
		if err := ini.e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: src, Target: seg, TargetAddr: remote}}); err != nil {
			t.Fatalf("WRITE %d: %v", n, err)
		}
		if !bytes.Equal(tgt.mem.Bytes()[:n], src) {
			t.Fatalf("WRITE %d: target memory differs", n)
		}
		if err := ini.e.Transfer(ctx, []engine.Request{{Op: engine.Read, Local: dst, Target: seg, TargetAddr: remote}}); err != nil {
			t.Fatalf("READ %d: %v", n, err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("READ %d: bytes differ", n)
		}
	}
}

// TestP2PHandshakeEndToEnd: a te target and a te initiator that know only
// Mooncake's wire: the initiator opens the target by ip:port (its
// P2PHANDSHAKE socket), receives a Mooncake descriptor, and moves 1 B to
// 32 MiB over Mooncake's TCP protocol.
func TestP2PHandshakeEndToEnd(t *testing.T) {
	ctx := context.Background()
	tst, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tst.Close()
	ist, err := p2p.New(ctx, p2p.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ist.Close()
	tgt := newMCNode(t, tst.Name(), tst, 32<<20)
	ini := newMCNode(t, ist.Name(), ist, 64<<20)
	seg, err := ini.e.OpenSegment(ctx, tst.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, ini, tgt, seg)
}

// TestHTTPMetadataEndToEnd: the same through a Mooncake-compatible HTTP
// metadata server (te metadata serve's), with a cluster id.
func TestHTTPMetadataEndToEnd(t *testing.T) {
	ctx := context.Background()
	srv, err := httpmeta.Serve(ctx, httpmeta.ServerOptions{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	open := func() segment.Store {
		st, err := httpmeta.New(ctx, httpmeta.Options{URL: srv.URL(""), ClusterID: "e2e"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	tgt := newMCNode(t, "target-node", open(), 32<<20)
	ini := newMCNode(t, "initiator-node", open(), 64<<20)
	seg, err := ini.e.OpenSegment(ctx, "target-node", nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, ini, tgt, seg)
}
