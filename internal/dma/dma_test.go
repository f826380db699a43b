package dma

import (
	"bytes"
	"testing"
)

func TestAllocViewAtomics(t *testing.T) {
	r, err := Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	b := r.Bytes()
	if len(b) != 100 || Addr(b)%uint64(PageSize) != 0 {
		t.Fatalf("len %d addr %#x", len(b), Addr(b))
	}
	type pair struct{ A, B uint32 }
	p := View[pair](b, 8)
	p.A, p.B = 1, 2
	if LoadAcquire32(b, 8) != 1 || LoadAcquire32(b, 12) != 2 {
		t.Fatal("view and atomic load disagree")
	}
	StoreRelease32(b, 16, 7)
	if b[16] != 7 {
		t.Fatal("store not visible")
	}
	for _, f := range []func(){
		func() { View[pair](b, 96) },
		func() { View[pair](b, -1) },
		func() { LoadAcquire32(b, 2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("expected panic")
				}
			}()
			f()
		}()
	}
	if err := r.Unmap(); err != nil {
		t.Fatal(err)
	}
	if err := r.Unmap(); err != nil {
		t.Fatal("second Unmap:", err)
	}
	if r.Bytes() != nil {
		t.Fatal("Bytes after Unmap")
	}
	if _, err := Alloc(0); err == nil {
		t.Fatal("Alloc(0) succeeded")
	}
}

// TestAt: a slice made from an address (how providers read inline SGE
// payloads) aliases the mapped bytes at that address, and a zero length
// yields nil without touching the address.
func TestAt(t *testing.T) {
	r, err := Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unmap()
	b := r.Bytes()
	for i := range b {
		b[i] = byte(i * 13)
	}
	got := At(Addr(b)+4090, 10)
	if !bytes.Equal(got, b[4090:4100]) {
		t.Fatalf("At across a page boundary: % x, want % x", got, b[4090:4100])
	}
	got[0] = 0xee
	if b[4090] != 0xee {
		t.Fatal("At copied instead of aliasing the mapping")
	}
	if At(0, 0) != nil {
		t.Fatal("zero-length At is not nil")
	}
}
