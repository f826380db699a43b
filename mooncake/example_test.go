package mooncake_test

import (
	"fmt"
	"log"

	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// A Mooncake TCP target's descriptor, as its P2PHANDSHAKE socket sends it,
// becomes te's view of the segment; te's local descriptor becomes what a
// Mooncake initiator expects.
func Example() {
	reply := []byte(`{"buffers":[{"addr":140679323844608,"length":100663296,"name":"127.0.0.1:15594"}],"name":"127.0.0.1:15594","protocol":"tcp","tcp_data_port":15934,"tcp_proto_version":2,"timestamp":"2026-12-02 00:54:14.585488"}` + "\n")
	md, err := mooncake.Decode(reply)
	if err != nil {
		log.Fatal(err)
	}
	d, err := mooncake.ToTE(md, mooncake.ToOptions{})
	if err != nil {
		log.Fatal(err)
	}
	p, _ := d.Protocol(mooncake.TEProtoTCP)
	fmt.Println(d.Name, p.Name, p.Endpoint, fmt.Sprintf("v%d", p.TCP.Wire), d.Buffers[0].Addr)

	local := &segment.Descriptor{Name: "10.0.0.7:15001", Epoch: 1, Version: 1,
		Protocols: []segment.Protocol{{Name: mooncake.TEProtoTCP, Endpoint: "10.0.0.7:16001", TCP: &segment.TCP{Wire: 2}}},
		Buffers:   []segment.Buffer{{Addr: 0x7f0000000000, Length: 1 << 30}}}
	out, err := mooncake.FromTE(local, mooncake.FromOptions{Timestamp: "2026-12-02 00:00:00.000000"})
	if err != nil {
		log.Fatal(err)
	}
	b, _ := mooncake.Encode(out)
	fmt.Print(string(b))
	// Output:
	// 127.0.0.1:15594 mooncake 127.0.0.1:15934 v2 140679323844608
	// {"buffers":[{"addr":139637976727552,"length":1073741824,"name":"10.0.0.7:15001"}],"name":"10.0.0.7:15001","protocol":"tcp","tcp_data_port":16001,"tcp_proto_version":2,"timestamp":"2026-12-02 00:00:00.000000"}
}
