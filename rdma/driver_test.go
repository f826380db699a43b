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
			Protocols: []segment.Protocol{{Name: segment.ProtoRDMA, Endpoint: "10.0.0.2:7000", RDMA: &segment.RDMA{
				Devices: []segment.Device{{Name: "rxe1", Port: 1, GID: "::ffff:10.0.1.2"}, {Name: "rxe3", Port: 1, GID: "::ffff:10.0.2.2"}},
				RKeys:   [][]uint32{{1, 2}},
			}}},
			Buffers: []segment.Buffer{{Addr: 0x1000, Length: 4096}},
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
			d.Buffers = append(d.Buffers, segment.Buffer{Addr: 0x9000, Length: 4096})
			part(d).RKeys = append(part(d).RKeys, []uint32{3, 4})
		}, true},
		{"buffer added before", func(d *segment.Descriptor) {
			d.Buffers = append([]segment.Buffer{{Addr: 0x9000, Length: 4096}}, d.Buffers...)
			part(d).RKeys = append([][]uint32{{3, 4}}, part(d).RKeys...)
		}, true},
		{"buffer removed", func(d *segment.Descriptor) { d.Buffers, part(d).RKeys = nil, nil }, true},
		{"location", func(d *segment.Descriptor) { d.Buffers[0].Location = "cpu:1" }, true},
		{"rkey", func(d *segment.Descriptor) { part(d).RKeys[0][1] = 5 }, false},
		{"rail GID", func(d *segment.Descriptor) { part(d).Devices[0].GID = "::ffff:10.0.9.2" }, false},
		{"rail MTU", func(d *segment.Descriptor) { part(d).Devices[1].MTU = 4096 }, false},
		{"rail removed", func(d *segment.Descriptor) {
			part(d).Devices, part(d).RKeys[0] = part(d).Devices[:1], part(d).RKeys[0][:1]
		}, false},
		{"endpoint", func(d *segment.Descriptor) { d.Protocols[0].Endpoint = "10.0.0.2:7001" }, false},
		{"entry version", func(d *segment.Descriptor) { d.Protocols[0].Version = 2 }, false},
		{"rdma part gone", func(d *segment.Descriptor) { d.Protocols[0].RDMA = nil }, false},
	} {
		d := base()
		c.change(d)
		d.Version++
		if got := k.KeepPeer(base(), d); got != c.keep {
			t.Errorf("%s: KeepPeer %v, want %v", c.what, got, c.keep)
		}
	}
}

// part returns d's rdma part.
func part(d *segment.Descriptor) *segment.RDMA { return d.Protocols[0].RDMA }
