package mooncake

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCapturedTCPReply decodes the Metadata reply a Mooncake TCP target
// sent (reference: "Captured from a running Mooncake") and encodes it back
// to the same bytes: sorted keys, compact, one trailing newline.
func TestCapturedTCPReply(t *testing.T) {
	raw := readFile(t, "tcp.json")
	d, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := &Descriptor{
		Name: "127.0.0.1:15594", Protocols: []string{"tcp"}, TCPDataPort: 15934, TCPProtoVersion: 2,
		Timestamp: "2026-12-02 00:54:14.585488",
		Buffers:   []Buffer{{Name: "127.0.0.1:15594", Addr: 140679323844608, Length: 100663296}},
	}
	if diff := cmp.Diff(want, d, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("decoded (-want +got):\n%s", diff)
	}
	out, err := Encode(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, raw) {
		t.Fatalf("encoded\n%s\nwant\n%s", out, raw)
	}
}

// TestRDMADescriptor: devices, per-buffer keys, the priority matrix, and
// an address above 2^53 that a float64 decoder would round.
func TestRDMADescriptor(t *testing.T) {
	raw := readFile(t, "rdma.json")
	d, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Buffers[1].Addr; got != 18446744073709543424 {
		t.Fatalf("addr %d, want 18446744073709543424 exactly", got)
	}
	if got := d.Buffers[1].RKeys; !cmp.Equal(got, []uint32{4294967295, 3}) {
		t.Fatalf("rkeys %v", got)
	}
	if got := d.PriorityMatrix["cpu:1"]; !cmp.Equal(got, Priority{Preferred: []string{"mlx5_1"}, Other: []string{"rxe0"}}) {
		t.Fatalf("priority %v", got)
	}
	if d.Devices[1].LID != 7 || d.RDMAServerName != "10.0.0.2" {
		t.Fatalf("device %+v, rdma_server_name %q", d.Devices[1], d.RDMAServerName)
	}
	out, err := Encode(d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, raw) {
		t.Fatalf("encoded\n%s\nwant\n%s", out, raw)
	}
}

// TestAccepted: inputs a Mooncake initiator accepts are accepted too.
func TestAccepted(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		check    func(*Descriptor) bool
	}{
		{"reordered, pretty, trailing text", "{\n  \"tcp_data_port\": 1,\n  \"protocol\": \"tcp\",\n  \"name\": \"h\",\n  \"buffers\": []\n} junk", func(d *Descriptor) bool { return d.TCPDataPort == 1 }},
		{"no tcp_proto_version means v1", `{"name":"h","protocol":"tcp","tcp_data_port":5}`, func(d *Descriptor) bool { return d.TCPProtoVersion == 1 }},
		{"integral float address", `{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":1.4e+14,"length":4096}]}`, func(d *Descriptor) bool { return d.Buffers[0].Addr == 140000000000000 }},
		{"protocol array", `{"name":"h","protocol":["rdma","tcp"],"buffers":[{"name":"h","addr":4096,"length":1,"protocol":"tcp"}]}`, func(d *Descriptor) bool {
			return d.ProtocolArray && d.Has("rdma") && d.Has("tcp") && d.Buffers[0].Protocol == "tcp"
		}},
		{"unknown keys", `{"name":"h","protocol":"tcp","extra":{"a":[1]},"buffers":[{"name":"h","addr":1,"length":1,"x":1}]}`, func(d *Descriptor) bool { return len(d.Buffers) == 1 }},
		{"IPv6 GID", `{"name":"h","protocol":"rdma","devices":[{"name":"a","lid":0,"gid":"fe80::1"}]}`, func(d *Descriptor) bool { return d.Devices[0].GID == "fe80::1" }},
	} {
		d, err := Decode([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !tc.check(d) {
			t.Errorf("%s: decoded %+v", tc.name, d)
		}
	}
}

// TestRejected: each bad descriptor gets an error wrapping ErrInvalid that
// names the problem.
func TestRejected(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, "not a JSON object"},
		{`null`, "null"},
		{`[]`, "not a JSON object"},
		{`{}`, `"name" missing`},
		{`{"name":"h"}`, "no protocol"},
		{`{"name":"h","protocol":7}`, "string or an array"},
		{`{"name":"h","protocol":""}`, "empty protocol"},
		{`{"name":"h","protocol":"tcp","tcp_data_port":"15000"}`, "must not be quoted"},
		{`{"name":"h","protocol":"tcp","tcp_data_port":70000}`, "exceeds 65535"},
		{`{"name":"h","protocol":"tcp","tcp_data_port":-1}`, "tcp_data_port"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":"1","length":1}]}`, "must not be quoted"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":1.5,"length":1}]}`, "not an unsigned integer"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":1e30,"length":1}]}`, "not an unsigned integer"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":0,"length":1}]}`, "both must be non-zero"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":1,"length":0}]}`, "both must be non-zero"},
		{`{"name":"h","protocol":"tcp","buffers":[{"addr":1,"length":1}]}`, `"name" missing`},
		{`{"name":"h","protocol":"tcp","buffers":[null]}`, "is null"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":18446744073709551615,"length":2}]}`, "wraps"},
		{`{"name":"h","protocol":"tcp","buffers":[{"name":"h","addr":4096,"length":4096},{"name":"h","addr":8191,"length":1}]}`, "overlap"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"}],"buffers":[{"name":"cpu:0","addr":1,"length":1,"rkey":[1,2],"lkey":[1,2]}]}`, "2 rkeys for 1 devices"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"}],"buffers":[{"name":"cpu:0","addr":1,"length":1,"rkey":[1],"lkey":[]}]}`, "1 rkeys and 0 lkeys"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"}],"buffers":[{"name":"cpu:0","addr":1,"length":1,"rkey":[4294967296],"lkey":[1]}]}`, "exceeds 4294967295"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"zz"}]}`, "gid"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1","lid":65536}]}`, "lid"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"},{"name":"a","gid":"fe80::2"}]}`, "listed twice"},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"}],"priority_matrix":{"cpu:0":[["b"],[]]}}`, `names NIC "b"`},
		{`{"name":"h","protocol":"rdma","devices":[{"name":"a","gid":"fe80::1"}],"priority_matrix":{"cpu:0":[["a"]]}}`, "has 1 lists, want 2"},
	} {
		_, err := Decode([]byte(tc.in))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s) = %v; want ErrInvalid mentioning %q", tc.in, err, tc.want)
		}
	}
	if _, err := Decode(make([]byte, MaxDescriptorSize+1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("oversized: %v", err)
	}
}

// TestEncodeV1 leaves tcp_proto_version out for v1 (how Mooncake reads v1).
func TestEncodeV1(t *testing.T) {
	b, err := Encode(&Descriptor{Name: "h:1", Protocols: []string{"tcp"}, TCPDataPort: 9, TCPProtoVersion: 1, Timestamp: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"buffers":[],"name":"h:1","protocol":"tcp","tcp_data_port":9,"timestamp":"t"}` + "\n"; string(b) != want {
		t.Fatalf("got %s want %s", b, want)
	}
	d, err := Decode(b)
	if err != nil || d.TCPProtoVersion != 1 {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestGID(t *testing.T) {
	a, err := ParseGID("fe:80:00:00:00:00:00:00:02:00:00:ff:fe:00:00:01")
	if err != nil || a.String() != "fe80::200:ff:fe00:1" {
		t.Fatalf("%v %v", a, err)
	}
	if got := FormatGID(a); got != "fe:80:00:00:00:00:00:00:02:00:00:ff:fe:00:00:01" {
		t.Fatal(got)
	}
	for _, bad := range []string{"", "1.2.3.4", "fe:80", "fe:80:00:00:00:00:00:00:02:00:00:ff:fe:00:00:0g", "fe80::1%eth0"} {
		if _, err := ParseGID(bad); err == nil {
			t.Errorf("ParseGID(%q) succeeded", bad)
		}
	}
}
