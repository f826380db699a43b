package uverbs

import (
	"bytes"
	"net/netip"
	"testing"
)

func TestEndpointRoundTrip(t *testing.T) {
	e := Endpoint{QPN: 0x123456, PSN: 0xabcdef, GID: GIDFromAddr(netip.MustParseAddr("10.0.1.2")), MTU: MTU1024}
	b, err := e.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var d Endpoint
	if err := d.UnmarshalBinary(b); err != nil || d != e {
		t.Fatalf("round trip: %+v %v", d, err)
	}
	for _, bad := range [][]byte{nil, b[:10], append([]byte{2}, b[1:]...), append(append([]byte{}, b[:25]...), 9)} {
		if err := d.UnmarshalBinary(bad); err == nil {
			t.Errorf("accepted % x", bad)
		}
	}
}

func FuzzEndpoint(f *testing.F) {
	b, _ := Endpoint{QPN: 1, PSN: 2, MTU: MTU4096}.MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var e Endpoint
		if err := e.UnmarshalBinary(b); err != nil {
			return
		}
		again, _ := e.MarshalBinary()
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs: % x vs % x", again, b)
		}
	})
}
