package engine_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/tcp"
)

// p2pNode is an engine whose segment is served by its own embedded p2p
// store: its name is the store's address.
type p2pNode struct {
	st  *p2p.Store
	e   *engine.Engine
	mem *engine.Memory
}

func newP2PNode(t *testing.T, listen string, memSize int) *p2pNode {
	t.Helper()
	st, err := p2p.New(context.Background(), p2p.Options{Listen: listen, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Config{Name: st.Name(), Store: st})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	n := &p2pNode{st: st, e: e}
	if err := e.Install(tcp.New(tcp.Config{})); err != nil {
		t.Fatal(err)
	}
	if n.mem, err = engine.Alloc(memSize); err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterLocalMemory(n.mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.close)
	return n
}

func (n *p2pNode) close() {
	n.e.Close()
	n.st.Close()
	n.mem.Close()
}

// TestP2PEndToEnd runs the engine over the embedded p2p store: open a peer
// by its address, move data both ways, then restart the peer on the same
// address and see the initiator follow the new incarnation.
func TestP2PEndToEnd(t *testing.T) {
	const size = 4 << 20
	tgt := newP2PNode(t, "127.0.0.1:0", size)
	ini := newP2PNode(t, "127.0.0.1:0", size)
	ctx := ctxT(t, 20*time.Second)

	if _, err := ini.e.OpenSegment(ctx, "127.0.0.1:1", nil); err == nil {
		t.Fatal("opened a segment nobody serves")
	}
	seg, err := ini.e.OpenSegment(ctx, tgt.st.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := ini.mem.Bytes()
	fill(t, src[:size/2])
	b, _ := ini.e.AllocateBatch(8)
	reqs := make([]engine.Request, 4)
	for i := range reqs {
		blk := size / 2 / 4
		reqs[i] = engine.Request{Op: engine.Write, Local: src[i*blk : (i+1)*blk], Target: seg, TargetAddr: addr(tgt.mem.Bytes()) + uint64(i*blk)}
	}
	if err := ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		reqs[i].Op = engine.Read
		reqs[i].Local = src[size/2+i*(size/8) : size/2+(i+1)*(size/8)]
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if sum(src[size/2:]) != sum(src[:size/2]) || !bytes.Equal(tgt.mem.Bytes()[:size/2], src[:size/2]) {
		t.Fatal("data differs after WRITE and READ over p2p")
	}
	ini.e.FreeBatch(b)

	// Restart the target on the same address: a new epoch.
	name := tgt.st.Name()
	oldEpoch := tgt.e.Epoch()
	tgt.close()
	var tgt2 *p2pNode
	for tgt2 == nil {
		st, err := p2p.New(context.Background(), p2p.Options{Listen: name})
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("cannot listen again on %s: %v", name, err)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		st.Close()
		tgt2 = newP2PNode(t, name, size)
	}
	var d *segment.Descriptor
	for {
		d, err = ini.e.SegmentDescriptor(seg)
		if err == nil && d.Epoch == tgt2.e.Epoch() && len(d.Buffers) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("initiator never saw the new incarnation (epoch %x, old %x): %v %v", tgt2.e.Epoch(), oldEpoch, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, _ = ini.e.AllocateBatch(1)
	defer ini.e.FreeBatch(b)
	err = ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: src[:4096], Target: seg, TargetAddr: addr(tgt2.mem.Bytes())}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tgt2.mem.Bytes()[:4096], src[:4096]) {
		t.Fatal("new incarnation did not receive the data")
	}
	if _, err := ini.e.OpenSegment(ctx, name+"/nope", nil); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("unknown suffix segment on a live peer: %v", err)
	}
}
