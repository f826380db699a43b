package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// reportStore is a store whose watch reports are the test's to send, in
// the order and at the time it chooses.
type reportStore struct {
	segment.Store
	reports chan *segment.Descriptor
}

func (s *reportStore) Watch(context.Context, string) (<-chan *segment.Descriptor, error) {
	return s.reports, nil
}

// TestStaleWatchReport: a store reads a report before it sends it, so a
// report of an earlier incarnation can arrive after SyncSegment installed
// a later one (TestFallback saw this under load). The engine checks such a
// report against the store and keeps the current incarnation and its
// connection; a report of a real restart, or of the segment's end, is
// still installed, and a stale report of its end is not.
func TestStaleWatchReport(t *testing.T) {
	ms := enginetest.NewMemStore()
	defer ms.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := &reportStore{Store: ms, reports: make(chan *segment.Descriptor)}
	tr := &keyFake{fake: &fake{name: segment.ProtoRDMA}}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, tr)
	t.Cleanup(func() { close(st.reports) }) // before the engine closes
	e := ini.Engine

	owner := ms.Process()
	d := &segment.Descriptor{
		Name: "tgt", Epoch: 7, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "10.0.0.2:7000", RDMA: &segment.RDMA{
			Devices: []segment.Device{{Name: "rxe1", Port: 1, GID: "::ffff:10.0.1.2", MTU: 1024}},
			RKeys:   [][]uint32{{0x100}},
		}}},
		Buffers: []segment.Buffer{{Addr: 0x7f0000000000, Length: 1 << 20}},
	}
	publish := func(epoch uint64) *segment.Descriptor {
		t.Helper()
		d.Epoch = epoch
		if err := owner.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
		return d.Clone()
	}
	// report hands r to the engine's watch loop and returns once the loop
	// has handled it: the second send is taken only after that, and
	// handling a report twice is the same as once.
	report := func(r *segment.Descriptor) {
		t.Helper()
		for range 2 {
			select {
			case st.reports <- r:
			case <-ctx.Done():
				t.Fatal("the engine's watch loop does not take reports")
			}
		}
	}
	var id engine.SegmentID // opened once the target is published
	epoch := func() uint64 {
		t.Helper()
		cur, err := e.SegmentDescriptor(id)
		if err != nil {
			t.Fatal(err)
		}
		return cur.Epoch
	}
	write := func() *keyPeer {
		t.Helper()
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.FreeBatch(b)
		if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: id, TargetAddr: d.Buffers[0].Addr}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.last.peer.(*keyPeer)
	}

	first := publish(7)
	var err error
	if id, err = e.OpenSegment(ctx, "tgt", nil); err != nil {
		t.Fatal(err)
	}
	p7 := write()
	report(first) // the watch's first report: nothing changes
	second := publish(8)
	if err := e.SyncSegment(ctx, id); err != nil {
		t.Fatal(err)
	}
	p8 := write()
	if !p7.closed.Load() || p8 == p7 {
		t.Fatalf("the restart to epoch 8 kept epoch 7's Peer")
	}

	report(first) // read before the sync, sent after it
	if got := epoch(); got != 8 {
		t.Errorf("after a stale report of epoch 7: epoch %d, want 8", got)
	}
	if p8.closed.Load() {
		t.Errorf("a stale report closed the current incarnation's Peer")
	}
	if p := write(); p != p8 {
		t.Errorf("a stale report made the engine connect again")
	}
	report(nil) // a stale report of the segment's end
	if got := epoch(); got != 8 || p8.closed.Load() {
		t.Errorf("after a stale report of its end: epoch %d, Peer closed %v; want 8 and open", got, p8.closed.Load())
	}
	report(second) // the report of the sync's own incarnation

	third := publish(9) // a restart the store reports, with no sync
	report(third)
	if got := epoch(); got != 9 || !p8.closed.Load() {
		t.Errorf("after a reported restart: epoch %d, epoch 8's Peer closed %v; want 9 and closed", got, p8.closed.Load())
	}
	if err := owner.Unpublish(ctx, "tgt"); err != nil {
		t.Fatal(err)
	}
	report(nil)
	if _, err := e.SegmentDescriptor(id); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Errorf("after its end was reported: %v, want ErrSegmentNotFound", err)
	}
}
