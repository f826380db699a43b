package segment

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func sample() *Descriptor {
	return &Descriptor{
		Name: "127.0.0.1:15001", Epoch: 0xfeedface, Version: 3,
		Protocols: []Protocol{
			{Name: ProtoTCP, Endpoint: "127.0.0.1:15002", TCP: &TCP{Wire: 1}},
			{Name: ProtoRDMA, Endpoint: "127.0.0.1:15003", RDMA: &RDMA{
				Devices: []Device{{Name: "rxe0", Port: 1, GID: "::ffff:10.0.0.1", MTU: 1024}},
				RKeys:   [][]uint32{{0x1234}, {0x5678}},
			}},
			{Name: ProtoSHM, Endpoint: "@te-1", SHM: &SHM{Host: "h1", UID: 1000, Wire: 1}},
		},
		Buffers: []Buffer{
			{Addr: 0x7f0000000000, Length: 1 << 20, Location: "cpu:0"},
			{Addr: 0x7f0000200000, Length: 4096, Location: "cpu:0"},
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
		"rkey count":    func(d *Descriptor) { d.Protocols[1].RDMA.RKeys[0] = []uint32{1, 2} },
		"rkey lists":    func(d *Descriptor) { d.Protocols[1].RDMA.RKeys = d.Protocols[1].RDMA.RKeys[:1] },
		"two parts":     func(d *Descriptor) { d.Protocols[0].SHM = &SHM{} },
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
		"schema":   `{"schema":3,"segment":{"name":"x","buffers":[]}}`,
		"unknown":  `{"schema":2,"segment":{"name":"x","bogus":1}}`,
		"trailing": `{"schema":2,"segment":{"name":"x"}} {}`,
		"null":     `{"schema":2,"segment":null}`,
		"old keys": `{"schema":2,"segment":{"name":"x","devices":[],"buffers":[]}}`,
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
	f.Add([]byte(`{"schema":2,"segment":{"name":"a","buffers":[{"addr":1,"length":18446744073709551615}]}}`))
	f.Add([]byte(`{"schema":2,"segment":{"name":"a","protocols":[{"name":"rdma","version":2,"rails":[{"gid":"fe80::1", "mtu":4096}],"x":"<\u00e9>"}],"buffers":[]}}`))
	f.Add([]byte(`{"schema":2,"segment":{"name":"a","protocols":[{"name":"rdma","rdma":{"devices":[{"name":"d","port":1,"gid":"fe80::1"}],"rkeys":[[7]],"lanes":[1]}}],"buffers":[{"addr":4096,"length":1}]}}`))
	f.Add([]byte(`{"schema":2,"segment":{"name":"a","protocols":[{"name":"shm","shm":{"host":"h","uid":0,"wire":1,"x":null}},{"name":"tcp","tcp":{"wire":1,"y":{}}}],"buffers":[]}}`))
	f.Add([]byte(`{"schema":1,"segment":{"name":"a","devices":[{"name":"d","port":1,"gid":"fe80::1"}],"buffers":[{"addr":4096,"length":1,"rkeys":[7]}]}}`))
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
	in := []byte(`{"schema":2,"segment":{"name":"a","protocols":[` +
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
		`{"schema":2,"segment":{"name":"a","protocols":[],"buffers":[],"newfield":1}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[{"name":"tcp","version":"2"}],"buffers":[]}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[{"name":7}],"buffers":[]}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[null],"buffers":[]}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[{"name":"tcp","tcp":{"wire":"1"}}],"buffers":[]}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[{"name":"rdma","rdma":{"devices":[{"name":"d","bogus":1}]}}],"buffers":[]}}`,
		`{"schema":2,"segment":{"name":"a","protocols":[{"name":"rdma","rdma":[]}],"buffers":[]}}`,
	} {
		if _, err := Unmarshal([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", bad, err)
		}
	}
}

// TestPartExtraKept: fields a newer peer adds inside a typed part are kept
// in that part's Extra and written back, next to the fields this build
// reads.
func TestPartExtraKept(t *testing.T) {
	in := []byte(`{"schema":2,"segment":{"name":"a","protocols":[` +
		`{"name":"rdma","endpoint":"h:1","version":3,"rdma":{"devices":[{"name":"d","port":1,"gid":"fe80::1"}],"rkeys":[[7]],"lanes":[2, 3]}},` +
		`{"name":"shm","endpoint":"@x","shm":{"host":"h","uid":0,"wire":1,"numa":"<1>"}},` +
		`{"name":"tcp","endpoint":"h:2","tcp":{"wire":1,"zerocopy":true}}],` +
		`"buffers":[{"addr":4096,"length":4096}]}}`)
	d, err := Unmarshal(in)
	if err != nil {
		t.Fatal(err)
	}
	r, s, c := d.Protocols[0].RDMA, d.Protocols[1].SHM, d.Protocols[2].TCP
	if r == nil || s == nil || c == nil {
		t.Fatalf("parts not decoded: %+v", d.Protocols)
	}
	if !cmp.Equal(r.Keys(0), []uint32{7}) || r.Keys(1) != nil || string(r.Extra["lanes"]) != `[2,3]` {
		t.Errorf("rdma part %+v", r)
	}
	if s.Host != "h" || s.Wire != 1 || string(s.Extra["numa"]) != `"\u003c1\u003e"` || !bytes.Equal(c.Extra["zerocopy"], []byte("true")) {
		t.Errorf("shm part %+v, tcp part %+v", s, c)
	}
	out, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"lanes":[2,3]`, `"numa":"\u003c1\u003e"`, `"zerocopy":true`, `"version":3`} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("re-encoded without %s: %s", want, out)
		}
	}
	d2, err := Unmarshal(out)
	if err != nil || !cmpEqual(d, d2) {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	for i := range d.Protocols {
		if !d2.Protocols[i].Equal(d.Protocols[i]) {
			t.Errorf("entry %d changed in the round trip", i)
		}
	}
	cl := d.Clone()
	cl.Protocols[0].RDMA.RKeys[0][0] = 8
	cl.Protocols[0].RDMA.Extra["lanes"][0] = 'x'
	cl.Protocols[1].SHM.Host = "other"
	if !d.Protocols[0].Equal(d2.Protocols[0]) || !d.Protocols[1].Equal(d2.Protocols[1]) || cl.Protocols[0].Equal(d.Protocols[0]) {
		t.Error("Clone shares a part with the original")
	}
}

// TestOldSchema: a descriptor written by a build before typed protocol
// entries (schema 1: rails and keys at the top level, settings as string
// attrs) is refused with ErrSchema, naming the segment and saying which
// side to upgrade; so is one from a newer schema.
func TestOldSchema(t *testing.T) {
	old := []byte(`{"schema":1,"segment":{"name":"10.0.0.1:15001","epoch":1,"version":1,` +
		`"protocols":[{"name":"rdma","endpoint":"10.0.0.1:7000"},{"name":"tcp","endpoint":"10.0.0.1:15002","attrs":{"wire":"1"}}],` +
		`"devices":[{"name":"rxe0","port":1,"gid":"::ffff:10.0.0.1"}],"buffers":[{"addr":4096,"length":4096,"rkeys":[7]}]}}`)
	_, err := Unmarshal(old)
	if !errors.Is(err, ErrSchema) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("schema 1: %v, want ErrSchema and ErrInvalid", err)
	}
	for _, want := range []string{"schema 1", `"10.0.0.1:15001" runs an older te; upgrade it`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("schema 1: %q does not say %q", err, want)
		}
	}
	_, err = Unmarshal([]byte(`{"schema":3,"segment":{"anything":[1]}}`))
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "the peer that published it runs a newer te; upgrade this one") {
		t.Errorf("schema 3: %v", err)
	}
}
