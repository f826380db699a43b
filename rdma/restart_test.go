package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/test/softroce/srenv"
)

// posted is one work request as rdma built it.
type posted struct {
	epoch    uint64
	rkey     uint32
	addr, n  uint64
	restarts int // target restarts before it was built
}

// TestRestartRKeys restarts the target engine (new epoch, new memory, new
// MRs on both rails) between batches and checks every work request the
// initiator built, before, across and after the restart: its rkey is one
// the incarnation its QP is connected to published for the buffer holding
// the remote range. A request for the old incarnation may fail, never
// reach the new one; after the restart the initiator connects anew and
// the bytes land in the new memory.
func TestRestartRKeys(t *testing.T) {
	topo := srenv.Require(t)
	var (
		mu       sync.Mutex
		posts    []posted
		restarts int
	)
	rdma.SetPostHook(func(epoch uint64, rkey uint32, addr, n uint64) {
		mu.Lock()
		posts = append(posts, posted{epoch, rkey, addr, n, restarts})
		mu.Unlock()
	})
	t.Cleanup(func() { rdma.SetPostHook(nil) }) // after the engines close
	const size, blk, tasks = 1 << 20, 64 << 10, 16
	p := newPair(t, size, names(topo.HostA), names(topo.HostB), rdma.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	descs := map[uint64]*segment.Descriptor{}
	remember := func() *segment.Descriptor {
		d, err := p.ini.Engine.SegmentDescriptor(p.seg)
		if err != nil {
			t.Fatal(err)
		}
		descs[d.Epoch] = d
		return d
	}
	transfer := func(tgt []byte) {
		t.Helper()
		rand.Read(p.ini.Mem.Bytes()[:tasks*blk])
		p.run(t, p.requests(engine.Write, tasks, blk), nil)
		if !bytes.Equal(tgt[:tasks*blk], p.ini.Mem.Bytes()[:tasks*blk]) {
			t.Fatal("the target does not hold the written bytes")
		}
	}
	old := remember()
	transfer(p.tgt.Mem.Bytes())

	// Restart: the old engine closes (its QPs and MRs go) with a batch in
	// flight, whose slices fail or are retried; a new engine under the
	// same name registers other memory.
	oldAddr := engine.AddrOf(p.tgt.Mem.Bytes())
	inflight, err := p.ini.Engine.AllocateBatch(4 * tasks)
	if err != nil {
		t.Fatal(err)
	}
	reqs := p.requests(engine.Write, tasks, blk)
	if err := p.ini.Engine.Submit(inflight, slices.Concat(reqs, reqs, reqs, reqs)); err != nil {
		t.Fatal(err)
	}
	if err := p.tgt.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	ierr := p.ini.Engine.Wait(ctx, inflight)
	if ctx.Err() != nil {
		t.Fatal("a batch in flight when the target closed never finished")
	}
	t.Logf("batch in flight when the target closed: %v", ierr)
	p.ini.Engine.FreeBatch(inflight)
	mu.Lock()
	restarts++
	mu.Unlock()
	p.tt = rdma.New(rdma.Config{Options: opts, Devices: names(topo.HostB)})
	p.tgt = enginetest.NewNode(t, engine.Config{Name: "target", Store: p.store}, size+blk, p.tt)
	guard := bytes.Repeat([]byte{0xa5}, size+blk)
	copy(p.tgt.Mem.Bytes(), guard)

	// At once, with what the initiator knows of the old incarnation: it
	// may fail; if it succeeds it went to the new one.
	b, err := p.ini.Engine.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	// The engine may already know the new incarnation (its store watch)
	// and refuse the old address at Submit, know it before its
	// transports are installed and refuse it as offering none yet, or
	// see the descriptor change under a connect it started and report
	// the peer reset.
	werr := p.ini.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: p.ini.Mem.Bytes()[:4096], Target: p.seg, TargetAddr: oldAddr}})
	if werr != nil && !errors.Is(werr, engine.ErrOutOfRange) && !errors.Is(werr, engine.ErrNoTransport) && !errors.Is(werr, engine.ErrPeerReset) {
		t.Fatal(werr)
	}
	if werr == nil {
		werr = p.ini.Engine.Wait(ctx, b)
		if ctx.Err() != nil {
			t.Fatal("a write to the restarted target is still pending")
		}
	}
	t.Logf("write to the old incarnation's address right after the restart: %v", werr)
	p.ini.Engine.FreeBatch(b)

	for {
		if d, err := p.ini.Engine.SegmentDescriptor(p.seg); err == nil && d.Epoch != old.Epoch && len(d.Buffers) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the initiator never saw the new incarnation")
		}
		p.ini.Engine.SyncSegment(ctx, p.seg)
		time.Sleep(20 * time.Millisecond)
	}
	cur := remember()
	if werr == nil && !bytes.Equal(p.tgt.Mem.Bytes(), guard) && !cur.Buffers[0].Contains(oldAddr, 4096) {
		t.Fatal("a write to the old address changed the new incarnation's memory")
	}
	transfer(p.tgt.Mem.Bytes())
	if err := p.ini.Engine.Close(); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	var after int
	for _, w := range posts {
		d := descs[w.epoch]
		if d == nil {
			t.Fatalf("a request went to epoch %#x, neither the old %#x nor the new %#x", w.epoch, old.Epoch, cur.Epoch)
		}
		i, err := d.Find(w.addr, w.n)
		if err != nil {
			t.Fatalf("a request for epoch %#x carries range %#x+%d outside its buffers: %v", w.epoch, w.addr, w.n, err)
		}
		if !slices.Contains(bufferKeys(d, i), w.rkey) {
			t.Fatalf("a request for epoch %#x carries rkey %#x; that incarnation published %#x for the buffer", w.epoch, w.rkey, bufferKeys(d, i))
		}
		if w.restarts > 0 && w.epoch == cur.Epoch {
			after++
		}
	}
	if after < tasks {
		t.Fatalf("%d requests to the new incarnation after the restart, want at least %d", after, tasks)
	}
	t.Logf("%d work requests checked (old rkeys %#x, new %#x)", len(posts), bufferKeys(old, 0), bufferKeys(cur, 0))
}

// bufferKeys returns buffer i's keys in d's rdma entry.
func bufferKeys(d *segment.Descriptor, i int) []uint32 {
	p, _ := d.Protocol(segment.ProtoRDMA)
	return p.RDMA.Keys(i)
}
