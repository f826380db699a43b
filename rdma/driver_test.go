package rdma

import (
	"testing"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// TestKeepPeer: a newer descriptor keeps rdma's Peer unless a rail or the
// keys of a buffer it already had changed (the engine asks through
// driver.PeerKeeper; no device needed).
func TestKeepPeer(t *testing.T) {
	base := func() *segment.Descriptor {
		return &segment.Descriptor{Name: "tgt", Epoch: 1, Version: 1,
			Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "10.0.0.2:7000"}},
			Devices:   []segment.Device{{Name: "rxe1", Port: 1, GID: "::ffff:10.0.1.2"}, {Name: "rxe3", Port: 1, GID: "::ffff:10.0.2.2"}},
			Buffers:   []segment.Buffer{{Addr: 0x1000, Length: 4096, RKeys: []uint32{1, 2}}},
		}
	}
	k, ok := New(Config{}).Driver().(driver.PeerKeeper)
	if !ok {
		t.Fatal("rdma's driver is not a PeerKeeper")
	}
	for _, c := range []struct {
		what   string
		change func(d *segment.Descriptor)
		keep   bool
	}{
		{"nothing", func(*segment.Descriptor) {}, true},
		{"buffer added", func(d *segment.Descriptor) {
			d.Buffers = append(d.Buffers, segment.Buffer{Addr: 0x9000, Length: 4096, RKeys: []uint32{3, 4}})
		}, true},
		{"buffer removed", func(d *segment.Descriptor) { d.Buffers = nil }, true},
		{"location", func(d *segment.Descriptor) { d.Buffers[0].Location = "cpu:1" }, true},
		{"rkey", func(d *segment.Descriptor) { d.Buffers[0].RKeys[1] = 5 }, false},
		{"rail GID", func(d *segment.Descriptor) { d.Devices[0].GID = "::ffff:10.0.9.2" }, false},
		{"rail MTU", func(d *segment.Descriptor) { d.Devices[1].MTU = 4096 }, false},
		{"rail removed", func(d *segment.Descriptor) { d.Devices = d.Devices[:1]; d.Buffers[0].RKeys = d.Buffers[0].RKeys[:1] }, false},
	} {
		d := base()
		c.change(d)
		d.Version++
		if got := k.KeepPeer(base(), d); got != c.keep {
			t.Errorf("%s: KeepPeer %v, want %v", c.what, got, c.keep)
		}
	}
}
