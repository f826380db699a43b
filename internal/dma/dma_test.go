package dma

import (
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
