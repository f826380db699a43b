package rdma

import (
	"context"
	"slices"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// Driver returns the transport as the engine drives it: its
// implementation of the transport contract (package engine/driver).
// engine.Install calls it; programs have no need to. The contract's
// methods (Install, Connect, Submit, RegisterMemory, Close...) live on
// that value, not on Transport, so Transport's own methods are the ones a
// program uses: New and inspection.
func (t *Transport) Driver() driver.Transport {
	return drv{t}
}

// drv is a Transport behind the driver contract. Holding one pointer, it
// fits in an interface without allocating.
type drv struct{ t *Transport }

var _ driver.Transport = drv{}

func (d drv) Name() string                         { return d.t.proto() }
func (d drv) Install(h driver.Host) error          { return d.t.install(h) }
func (d drv) Describe(s *segment.Descriptor) error { return d.t.describe(s) }
func (d drv) RegisterMemory(r driver.Region) (any, error) {
	return d.t.registerMemory(r)
}
func (d drv) UnregisterMemory(r driver.Region, key any) error {
	return d.t.unregisterMemory(r, key)
}
func (d drv) Connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	return d.t.connect(ctx, remote)
}
func (d drv) SliceSize() uint64         { return d.t.sliceSize() }
func (d drv) Submit(ss []*driver.Slice) { d.t.submitSlices(ss, nil) }
func (d drv) Close() error              { return d.t.shutdown() }

// Inspect describes the rails and endpoints (driver.Inspector).
func (d drv) Inspect() driver.TransportState { return d.t.inspect() }

var _ driver.PeerKeeper = drv{}

func (d drv) KeepPeer(old, new *segment.Descriptor) bool {
	return keepPeer(d.t.proto(), old, new)
}

// keepPeer reports whether a peer connected for descriptor a still fits
// b, a later version of the same incarnation: the entry named proto is unchanged
// but for its keys (endpoint, rails: GIDs, LIDs, MTUs, fields a newer
// peer added), and every buffer both versions have at the same address
// kept its keys. Endpoints hold QPs connected to
// a rail and keys checked against it, so a change in either gets a fresh
// Connect; buffers only added or removed leave the peer alone (slices
// carry the current descriptor and their buffer's index in it).
func keepPeer(proto string, a, b *segment.Descriptor) bool {
	pa, _ := a.Protocol(proto)
	pb, _ := b.Protocol(proto)
	ra, rb := pa.RDMA, pb.RDMA
	if ra == nil || rb == nil {
		return ra == rb && pa.Equal(pb)
	}
	// The entry but for its keys (endpoint, version, rails, the fields
	// a newer peer added) must be the same.
	ka, kb := *ra, *rb
	ka.RKeys, kb.RKeys = nil, nil
	pa.RDMA, pb.RDMA = &ka, &kb
	if !pa.Equal(pb) {
		return false
	}
	keys := make(map[uint64][]uint32, len(a.Buffers))
	for i, buf := range a.Buffers {
		keys[buf.Addr] = ra.Keys(i)
	}
	for i, buf := range b.Buffers {
		if old, ok := keys[buf.Addr]; ok && !slices.Equal(old, rb.Keys(i)) {
			return false
		}
	}
	return true
}
