package engine_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// keyFake is a transport that records each Peer it connects (with the
// descriptor it was given and whether the engine closed it) and, per
// slice, the Peer and the remote keys the engine handed over.
type keyFake struct {
	*fake
	mu    sync.Mutex
	peers []*keyPeer
	last  struct {
		peer  driver.Peer
		rkeys []uint32
	}
}

func (f *keyFake) Driver() driver.Transport { return f }

type keyPeer struct {
	desc   *segment.Descriptor
	closed atomic.Bool
}

func (p *keyPeer) Close() error {
	p.closed.Store(true)
	return nil
}

func (f *keyFake) Connect(_ context.Context, d *segment.Descriptor) (driver.Peer, error) {
	p := &keyPeer{desc: d.Clone()}
	f.mu.Lock()
	f.peers = append(f.peers, p)
	f.mu.Unlock()
	return p, nil
}

func (f *keyFake) Submit(ss []*driver.Slice) {
	for _, s := range ss {
		if p, ok := s.Peer.(*keyPeer); ok && p.closed.Load() {
			s.Done(0, engine.ErrPeerReset) // a closed Peer must never be used
			continue
		}
		f.mu.Lock()
		f.last.peer = s.Peer
		f.last.rkeys = append([]uint32(nil), rdmaPart(s.Remote).Keys(s.RemoteIndex)...)
		f.mu.Unlock()
		s.Done(uint64(len(s.Local)), nil)
	}
}

// TestRefreshReconnectsOnRailsAndKeys: inside one epoch, a descriptor
// update keeps the segment's Peer when only buffers were added or removed,
// and replaces it (old Peer closed, fresh Connect with the new descriptor)
// when the rails (Devices) or the keys of a buffer it already had change,
// as it does when the protocol entry changes. No slice reaches a closed
// Peer, and each slice carries the current keys. Buffers come and go under
// one Peer because the transport says so (driver.PeerKeeper, as rdma
// does); for one that does not, any change of its protocol entry (whose
// typed part holds the rails and keys) reconnects.
func TestRefreshReconnectsOnRailsAndKeys(t *testing.T) {
	t.Run("PeerKeeper", func(t *testing.T) { testRefreshReconnects(t, true) })
	t.Run("plain", func(t *testing.T) { testRefreshReconnects(t, false) })
}

// railFake is a keyFake whose Peers depend on the rails and keys, as
// rdma's do.
type railFake struct{ *keyFake }

func (r railFake) Driver() driver.Transport { return r }

func (railFake) KeepPeer(a, b *segment.Descriptor) bool {
	pa, pb := a.Protocols[0], b.Protocols[0]
	if pa.Endpoint != pb.Endpoint || !slices.Equal(rdmaPart(a).Devices, rdmaPart(b).Devices) {
		return false
	}
	for i, x := range a.Buffers {
		for j, y := range b.Buffers {
			if x.Addr == y.Addr && !slices.Equal(rdmaPart(a).Keys(i), rdmaPart(b).Keys(j)) {
				return false
			}
		}
	}
	return true
}

// rdmaPart returns the rails and keys of d's one protocol entry.
func rdmaPart(d *segment.Descriptor) *segment.RDMA { return d.Protocols[0].RDMA }

func testRefreshReconnects(t *testing.T, keeper bool) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr := &keyFake{fake: &fake{name: segment.ProtoRDMA}}
	var install engine.Transport = tr
	if keeper {
		install = railFake{tr}
	}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, install)
	e := ini.Engine

	// The target is a descriptor published by hand: two rails, one
	// buffer, one key per rail.
	owner := st.Process()
	const base, other = 0x7f0000000000, 0x7f0000100000
	d := &segment.Descriptor{
		Name: "tgt", Epoch: 7, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "10.0.0.2:7000", RDMA: &segment.RDMA{
			Devices: []segment.Device{
				{Name: "rxe1", Port: 1, GID: "::ffff:10.0.1.2", MTU: 1024},
				{Name: "rxe3", Port: 1, GID: "::ffff:10.0.2.2", MTU: 1024},
			},
			RKeys: [][]uint32{{0x100, 0x200}},
		}}},
		Buffers: []segment.Buffer{{Addr: base, Length: 1 << 20}},
	}
	publish := func(change func(d *segment.Descriptor)) {
		t.Helper()
		change(d)
		d.Version++
		if err := owner.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.FreeBatch(b)
	// write syncs the segment with the store, moves one slice to addr and
	// returns the Peer and keys the transport saw.
	write := func(addr uint64) (*keyPeer, []uint32) {
		t.Helper()
		if err := e.SyncSegment(ctx, seg); err != nil {
			t.Fatal(err)
		}
		if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: addr}}); err != nil {
			t.Fatal(err)
		}
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		if b, err = e.AllocateBatch(1); err != nil {
			t.Fatal(err)
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.last.peer.(*keyPeer), tr.last.rkeys
	}
	p0, keys := write(base)
	if len(tr.peers) != 1 || keys[0] != 0x100 || keys[1] != 0x200 {
		t.Fatalf("first write: %d connects, keys %#x", len(tr.peers), keys)
	}

	steps := []struct {
		what      string
		change    func(d *segment.Descriptor)
		addr      uint64
		reconnect bool
		keys      []uint32
	}{
		{"buffer added", func(d *segment.Descriptor) {
			d.Buffers = append(d.Buffers, segment.Buffer{Addr: other, Length: 1 << 20})
			rdmaPart(d).RKeys = append(rdmaPart(d).RKeys, []uint32{0x300, 0x400})
		}, other, false, []uint32{0x300, 0x400}},
		{"rkey of a known buffer changed", func(d *segment.Descriptor) { rdmaPart(d).RKeys[0] = []uint32{0x101, 0x200} }, base, true, []uint32{0x101, 0x200}},
		{"buffer removed", func(d *segment.Descriptor) { d.Buffers, rdmaPart(d).RKeys = d.Buffers[:1], rdmaPart(d).RKeys[:1] }, base, false, []uint32{0x101, 0x200}},
		{"rail GID changed", func(d *segment.Descriptor) { rdmaPart(d).Devices[1].GID = "::ffff:10.0.3.2" }, base, true, []uint32{0x101, 0x200}},
		{"rail added", func(d *segment.Descriptor) {
			rdmaPart(d).Devices = append(rdmaPart(d).Devices, segment.Device{Name: "rxe5", Port: 1, GID: "::ffff:10.0.4.2"})
			rdmaPart(d).RKeys[0] = append(rdmaPart(d).RKeys[0], 0x500)
		}, base, true, []uint32{0x101, 0x200, 0x500}},
		{"buffer re-registered at the same address", func(d *segment.Descriptor) {
			d.Buffers[0] = segment.Buffer{Addr: base, Length: 1 << 19}
			rdmaPart(d).RKeys[0] = []uint32{0x111, 0x222, 0x555}
		}, base, true, []uint32{0x111, 0x222, 0x555}},
		{"protocol endpoint changed", func(d *segment.Descriptor) { d.Protocols[0].Endpoint = "10.0.0.2:7001" }, base, true, []uint32{0x111, 0x222, 0x555}},
		{"location only", func(d *segment.Descriptor) { d.Buffers[0].Location = "cpu:1" }, base, false, []uint32{0x111, 0x222, 0x555}},
	}
	prev := p0
	for _, s := range steps {
		n := len(tr.peers)
		publish(s.change)
		p, keys := write(s.addr)
		if !keeper {
			// The rails and keys are the protocol entry's part: any
			// change of them is a change of the entry.
			s.reconnect = s.what != "location only"
		}
		if got := len(tr.peers) - n; got != map[bool]int{false: 0, true: 1}[s.reconnect] {
			t.Errorf("%s: %d new Connects, want reconnect %v", s.what, got, s.reconnect)
		}
		if s.reconnect {
			if p == prev || !prev.closed.Load() {
				t.Errorf("%s: old Peer still used (same %v) or not closed (%v)", s.what, p == prev, prev.closed.Load())
			}
			if p.desc.Version != d.Version {
				t.Errorf("%s: Connect got version %d, want %d", s.what, p.desc.Version, d.Version)
			}
		} else if p != prev || prev.closed.Load() {
			t.Errorf("%s: Peer replaced (%v) or closed (%v)", s.what, p != prev, prev.closed.Load())
		}
		if !slices.Equal(keys, s.keys) {
			t.Errorf("%s: slice carried keys %#x, want %#x", s.what, keys, s.keys)
		}
		prev = p
	}
}
