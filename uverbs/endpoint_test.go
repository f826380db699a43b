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

// TestEndpointLID: an InfiniBand endpoint (with a LID) travels as version
// 2; a RoCE one stays version 1, readable by peers that predate LIDs.
func TestEndpointLID(t *testing.T) {
	e := Endpoint{QPN: 0x42, PSN: 7, MTU: MTU4096, LID: 0x1234}
	b, err := e.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 28 || b[0] != 2 || b[26] != 0x12 || b[27] != 0x34 {
		t.Fatalf("encoding % x", b)
	}
	var d Endpoint
	if err := d.UnmarshalBinary(b); err != nil || d != e {
		t.Fatalf("round trip: %+v %v", d, err)
	}
	roce, _ := Endpoint{QPN: 0x42, PSN: 7, MTU: MTU4096}.MarshalBinary()
	if len(roce) != 26 || roce[0] != 1 {
		t.Fatalf("RoCE endpoint encoding % x", roce)
	}
	noLID := append(append([]byte{}, b[:26]...), 0, 0)
	for _, bad := range [][]byte{b[:26], append(append([]byte{}, b...), 0), noLID, append([]byte{1}, b[1:]...)} {
		if err := d.UnmarshalBinary(bad); err == nil {
			t.Errorf("accepted % x as %+v", bad, d)
		}
	}
}

func FuzzEndpoint(f *testing.F) {
	b, _ := Endpoint{QPN: 1, PSN: 2, MTU: MTU4096}.MarshalBinary()
	f.Add(b)
	b, _ = Endpoint{QPN: 1, PSN: 2, MTU: MTU4096, LID: 9}.MarshalBinary()
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
