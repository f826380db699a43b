package segment

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func sample() *Descriptor {
	return &Descriptor{
		Name: "127.0.0.1:15001", Epoch: 0xfeedface, Version: 3,
		Protocols: []Protocol{{Name: ProtoTCP, Endpoint: "127.0.0.1:15002", Attrs: map[string]string{"wire": "1"}}},
		Devices:   []Device{{Name: "rxe0", Port: 1, GID: "::ffff:10.0.0.1", MTU: 1024}},
		Buffers: []Buffer{
			{Addr: 0x7f0000000000, Length: 1 << 20, Location: "cpu:0", RKeys: []uint32{0x1234}},
			{Addr: 0x7f0000200000, Length: 4096, Location: "cpu:0", RKeys: []uint32{0x5678}},
		},
	}
}

func TestRoundTrip(t *testing.T) {
	d := sample()
	b, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(d, got); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(d, d.Clone()); diff != "" {
		t.Fatalf("clone (-want +got):\n%s", diff)
	}
}

func TestInvalid(t *testing.T) {
	cases := map[string]func(d *Descriptor){
		"no name":       func(d *Descriptor) { d.Name = "" },
		"empty buffer":  func(d *Descriptor) { d.Buffers[0].Length = 0 },
		"overlap":       func(d *Descriptor) { d.Buffers[1].Addr = d.Buffers[0].Addr + 100 },
		"wrap":          func(d *Descriptor) { d.Buffers[1].Addr = ^uint64(0) - 10 },
		"rkey count":    func(d *Descriptor) { d.Buffers[0].RKeys = []uint32{1, 2} },
		"dup protocol":  func(d *Descriptor) { d.Protocols = append(d.Protocols, d.Protocols[0]) },
		"unnamed proto": func(d *Descriptor) { d.Protocols[0].Name = "" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			d := sample()
			mutate(d)
			if _, err := Marshal(d); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Marshal = %v, want ErrInvalid", err)
			}
		})
	}
	for name, in := range map[string]string{
		"schema":   `{"schema":2,"segment":{"name":"x","buffers":[]}}`,
		"unknown":  `{"schema":1,"segment":{"name":"x","bogus":1}}`,
		"trailing": `{"schema":1,"segment":{"name":"x"}} {}`,
		"null":     `{"schema":1,"segment":null}`,
		"garbage":  `\x00\x01`,
	} {
		if _, err := Unmarshal([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Unmarshal = %v, want ErrInvalid", name, err)
		}
	}
}

func TestFind(t *testing.T) {
	d := sample()
	base := d.Buffers[0].Addr
	for _, c := range []struct {
		addr, n uint64
		want    int
	}{
		{base, 1 << 20, 0},
		{base + 1, 1 << 20, -1},
		{base + (1 << 20) - 1, 1, 0},
		{base - 1, 2, -1},
		{d.Buffers[1].Addr + 10, 4086, 1},
		{d.Buffers[1].Addr + 10, ^uint64(0), -1},
		{^uint64(0), 2, -1},
	} {
		got, err := d.Find(c.addr, c.n)
		if got != c.want || (c.want < 0) != errors.Is(err, ErrOutOfRange) {
			t.Errorf("Find(%#x, %d) = %d, %v; want %d", c.addr, c.n, got, err, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Find(base, 64) }); n != 0 {
		t.Fatalf("Find allocates %v times", n)
	}
}

func FuzzUnmarshal(f *testing.F) {
	b, _ := Marshal(sample())
	f.Add(b)
	f.Add([]byte(`{"schema":1,"segment":{"name":"a","buffers":[{"addr":1,"length":18446744073709551615}]}}`))
	f.Add([]byte(`{"schema":1,"segment":{"name":"a","protocols":[{"name":"rdma","version":2,"rails":[{"gid":"fe80::1", "mtu":4096}],"x":"<\u00e9>"}],"buffers":[]}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		d, err := Unmarshal(in)
		if (d == nil) == (err == nil) {
			t.Fatalf("descriptor %v with error %v", d, err)
		}
		if err != nil {
			return
		}
		out, err := Marshal(d)
		if err != nil {
			t.Fatalf("valid decoded descriptor fails to encode: %v", err)
		}
		d2, err := Unmarshal(out)
		if err != nil || !cmpEqual(d, d2) {
			t.Fatalf("re-encode not stable: %v", err)
		}
	})
}

// cmpEqual treats nil and empty slices alike: omitempty drops empty ones.
func cmpEqual(a, b *Descriptor) bool { return cmp.Equal(a, b, cmpopts.EquateEmpty()) }

// TestProtocolExtraKept: a protocol entry from a newer peer (a version
// and fields this build does not know) decodes, and encodes again with
// those fields unchanged; unknown fields elsewhere are still refused, and
// the known fields of an entry keep their types.
func TestProtocolExtraKept(t *testing.T) {
	in := []byte(`{"schema":1,"segment":{"name":"a","protocols":[` +
		`{"name":"rdma","endpoint":"10.0.0.1:7000","version":2,"rails":[{"gid":"fe80::1", "mtu": 4096}],"note":"<b>"},` +
		`{"name":"tcp","endpoint":"10.0.0.1:7001"}],"buffers":[]}}`)
	d, err := Unmarshal(in)
	if err != nil {
		t.Fatal(err)
	}
	p := d.Protocols[0]
	if p.Version != 2 || len(p.Extra) != 2 || string(p.Extra["rails"]) != `[{"gid":"fe80::1","mtu":4096}]` {
		t.Fatalf("entry: version %d, extra %q", p.Version, p.Extra)
	}
	if d.Protocols[1].Extra != nil {
		t.Errorf("an entry without unknown fields got Extra %q", d.Protocols[1].Extra)
	}
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte(`"rails":[{"gid":"fe80::1","mtu":4096}]`)) || !bytes.Contains(out, []byte(`"version":2`)) {
		t.Fatalf("re-encoded without the entry's fields: %s", out)
	}
	d2, err := Unmarshal(out)
	if err != nil || !cmpEqual(d, d2) || !d2.Protocols[0].Equal(p) {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	c := d.Clone()
	c.Protocols[0].Extra["rails"][0] = 'x'
	if !d.Protocols[0].Equal(p) || c.Protocols[0].Equal(p) {
		t.Error("Clone shares Extra's bytes")
	}
	for _, bad := range []string{
		`{"schema":1,"segment":{"name":"a","protocols":[],"buffers":[],"newfield":1}}`,
		`{"schema":1,"segment":{"name":"a","protocols":[{"name":"tcp","version":"2"}],"buffers":[]}}`,
		`{"schema":1,"segment":{"name":"a","protocols":[{"name":7}],"buffers":[]}}`,
		`{"schema":1,"segment":{"name":"a","protocols":[null],"buffers":[]}}`,
	} {
		if _, err := Unmarshal([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		}
	}
}
