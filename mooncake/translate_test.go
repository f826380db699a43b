package mooncake

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/rdmago/te/segment"
)

func TestToTETCP(t *testing.T) {
	md, err := Decode(readFile(t, "tcp.json"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ToTE(md, ToOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := &segment.Descriptor{
		Name:      "127.0.0.1:15594",
		Epoch:     d.Epoch,
		Protocols: []segment.Protocol{{Name: TEProtoTCP, Endpoint: "127.0.0.1:15934", TCP: &segment.TCP{Wire: 2}}},
		Buffers:   []segment.Buffer{{Addr: 140679323844608, Length: 100663296}},
	}
	if diff := cmp.Diff(want, d, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if d.Epoch == 0 {
		t.Fatal("zero epoch")
	}
	// The data host comes from the name, or from DataHost (rpc_meta).
	d2, _ := ToTE(md, ToOptions{Name: "seg", DataHost: "10.1.2.3"})
	if p, _ := d2.Protocol(TEProtoTCP); p.Endpoint != "10.1.2.3:15934" || d2.Name != "seg" {
		t.Fatalf("%+v", d2)
	}
	// A restart (new data port) is a new epoch; a new buffer is not.
	md.TCPDataPort++
	d3, _ := ToTE(md, ToOptions{})
	md.TCPDataPort--
	md.Buffers = append(md.Buffers, Buffer{Name: md.Name, Addr: 1 << 20, Length: 4096})
	d4, _ := ToTE(md, ToOptions{})
	if d3.Epoch == d.Epoch || d4.Epoch != d.Epoch {
		t.Fatalf("epochs %x %x %x", d.Epoch, d3.Epoch, d4.Epoch)
	}
	// Version 1 of an old TCP target: no status frames.
	md.TCPProtoVersion = 1
	d5, _ := ToTE(md, ToOptions{})
	if p, _ := d5.Protocol(TEProtoTCP); p.TCP.Wire != 1 {
		t.Fatalf("%+v", p)
	}
}

func TestToTERDMA(t *testing.T) {
	md, err := Decode(readFile(t, "rdma.json"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := ToTE(md, ToOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Protocols) != 1 || d.Protocols[0].Name != TEProtoRDMA || d.Protocols[0].Endpoint != "10.0.0.2:15001" {
		t.Fatalf("protocols %+v", d.Protocols)
	}
	rails := d.Protocols[0].RDMA
	if rails == nil || rails.Devices[0].GID != "::ffff:192.168.0.2" || rails.Devices[1].LID != 7 {
		t.Fatalf("rdma part %+v", rails)
	}
	if b := d.Buffers[0]; b.Location != "cpu:0" || !cmp.Equal(rails.Keys(0), []uint32{514, 770}) {
		t.Fatalf("buffer %+v, keys %v", b, rails.Keys(0))
	}
	// NIC paths name rdma_server_name, which differs from the name.
	if s := NICServer(d.Protocols[0], d.Name); s != "10.0.0.2" {
		t.Fatalf("NIC server %q", s)
	}
	back, err := FromTE(d, FromOptions{Protocol: ProtoRDMA})
	if err != nil || back.RDMAServerName != "10.0.0.2" {
		t.Fatalf("back: %+v %v", back, err)
	}
	// Without rdma_server_name the NIC paths name the segment.
	md.RDMAServerName = ""
	if d, err = ToTE(md, ToOptions{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	if s := NICServer(d.Protocols[0], d.Name); s != "10.0.0.2:15001" {
		t.Fatalf("NIC server %q", s)
	}
	md.Name = "other"
	if d, err = ToTE(md, ToOptions{}); err != nil || d.Protocols[0].Extra != nil || NICServer(d.Protocols[0], d.Name) != "other" {
		t.Fatalf("same name: %+v %v", d.Protocols[0], err)
	}
}

// TestFromTE: te's local descriptor becomes what a Mooncake target would
// publish, and translating back gives the same memory.
func TestFromTE(t *testing.T) {
	d := &segment.Descriptor{
		Name: "127.0.0.1:15001", Epoch: 5, Version: 3,
		Protocols: []segment.Protocol{{Name: "tcp", Endpoint: "127.0.0.1:7"}, {Name: TEProtoTCP, Endpoint: "127.0.0.1:16000", TCP: &segment.TCP{Wire: 2}}},
		Buffers:   []segment.Buffer{{Addr: 1 << 30, Length: 1 << 20, Location: "cpu:0"}},
	}
	md, err := FromTE(d, FromOptions{Timestamp: "2026-12-02 00:00:00.000000"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Encode(md)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"buffers":[{"addr":1073741824,"length":1048576,"name":"127.0.0.1:15001"}],"name":"127.0.0.1:15001","protocol":"tcp","tcp_data_port":16000,"tcp_proto_version":2,"timestamp":"2026-12-02 00:00:00.000000"}` + "\n"
	if string(b) != want {
		t.Fatalf("got  %swant %s", b, want)
	}
	back, err := ToTE(md, ToOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := back.Protocol(TEProtoTCP); p.Endpoint != "127.0.0.1:16000" || !cmp.Equal(back.Buffers, []segment.Buffer{{Addr: 1 << 30, Length: 1 << 20}}) {
		t.Fatalf("%+v", back)
	}

	// RDMA: devices in Mooncake's GID form, keys per device, lkeys to
	// match, and a matrix in devices order.
	r := &segment.Descriptor{
		Name: "h:1", Protocols: []segment.Protocol{{Name: TEProtoRDMA, Endpoint: "h:1", RDMA: &segment.RDMA{
			Devices: []segment.Device{{Name: "rxe0", GID: "::ffff:10.0.0.1"}, {Name: "rxe1", GID: "fe80::1", LID: 3}},
			RKeys:   [][]uint32{{9, 10}},
		}}},
		Buffers: []segment.Buffer{{Addr: 4096, Length: 4096}},
	}
	mr, err := FromTE(r, FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mr.Devices[0].GID != "00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01" || mr.Buffers[0].Name != "cpu:0" ||
		!cmp.Equal(mr.Buffers[0].RKeys, []uint32{9, 10}) || !cmp.Equal(mr.Buffers[0].LKeys, []uint32{0, 0}) ||
		!cmp.Equal(mr.PriorityMatrix, map[string]Priority{"cpu:0": {Preferred: []string{"rxe0", "rxe1"}, Other: []string{}}}) {
		t.Fatalf("%+v", mr)
	}
	enc, err := Encode(mr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(enc), `"priority_matrix":{"cpu:0":[["rxe0","rxe1"],[]]}`) {
		t.Fatalf("%s", enc)
	}

	// Inconsistent or unsupported input is refused.
	r.Protocols[0].RDMA.RKeys[0] = []uint32{9}
	if _, err := FromTE(r, FromOptions{}); err == nil {
		t.Fatal("1 rkey for 2 devices accepted")
	}
	r.Protocols[0].RDMA.RKeys[0] = nil
	if _, err := FromTE(r, FromOptions{}); err == nil {
		t.Fatal("a buffer without keys accepted")
	}
	if _, err := FromTE(&segment.Descriptor{Name: "x", Protocols: []segment.Protocol{{Name: "tcp"}}}, FromOptions{}); !errors.Is(err, ErrInvalid) || !errors.Is(err, ErrNoProtocol) || !strings.Contains(err.Error(), "install the Mooncake transport") {
		t.Fatal(err)
	}
}

func TestVersions(t *testing.T) {
	var v Versions
	d := &segment.Descriptor{Name: "a", Epoch: 1, Buffers: []segment.Buffer{{Addr: 1, Length: 1}}}
	v.Stamp(d)
	if d.Version != 1 {
		t.Fatal(d.Version)
	}
	v.Stamp(d)
	if d.Version != 1 {
		t.Fatal("unchanged content changed the version", d.Version)
	}
	d.Buffers = append(d.Buffers, segment.Buffer{Addr: 8, Length: 1})
	v.Stamp(d)
	if d.Version != 2 {
		t.Fatal(d.Version)
	}
	d.Epoch = 2
	v.Stamp(d)
	if d.Version != 1 {
		t.Fatal(d.Version)
	}
}
