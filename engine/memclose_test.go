//go:build unix

package engine_test

import (
	"errors"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// TestMemoryCloseUnregisters: closing Memory that is still registered
// unregisters it first (peers see it gone from the descriptor; a later
// request for it is refused instead of faulting), and refuses with
// ErrMemoryBusy while a transfer pins it.
func TestMemoryCloseUnregisters(t *testing.T) {
	n := enginetest.NewNode(t, engine.Config{Name: "n"}, 0)
	e := n.Engine
	for _, shared := range []bool{false, true} {
		alloc := engine.Alloc
		if shared {
			alloc = engine.AllocShared
		}
		mem, err := alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if mem.Shared() != shared {
			t.Fatalf("Shared() = %v", mem.Shared())
		}
		if err := e.RegisterLocalMemory(mem.Bytes()[:4096], ""); err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterLocalMemory(mem.Bytes()[8192:], ""); err != nil {
			t.Fatal(err)
		}
		other, err := engine.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RegisterLocalMemory(other.Bytes(), ""); err != nil {
			t.Fatal(err)
		}
		if got := len(e.LocalDescriptor().Buffers); got != 3 {
			t.Fatalf("%d buffers", got)
		}
		if err := mem.Close(); err != nil {
			t.Fatal(err)
		}
		if mem.Bytes() != nil {
			t.Fatal("Bytes after Close")
		}
		d := e.LocalDescriptor()
		if len(d.Buffers) != 1 || d.Buffers[0].Addr != engine.AddrOf(other.Bytes()) {
			t.Fatalf("buffers after Close: %+v", d.Buffers)
		}
		if err := mem.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		if got := len(e.LocalDescriptor().Buffers); got != 0 {
			t.Fatalf("%d buffers left", got)
		}
	}
}

// TestMemoryCloseBusy: a pinned region keeps its memory mapped.
func TestMemoryCloseBusy(t *testing.T) {
	ft := &fake{name: "fake"}
	n := enginetest.NewNode(t, engine.Config{Name: "n"}, 0, ft)
	mem, err := engine.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	// An engine that is closed lets its memory go.
	defer func() {
		n.Engine.Close()
		if err := mem.Close(); err != nil {
			t.Error("Close after the engine closed:", err)
		}
	}()
	if err := n.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	// A local-segment transfer pins both sides only for its copy; pin
	// through Host.AcquireLocal instead, as a transport's target side does.
	_, r, err := ft.host.AcquireLocal(engine.AddrOf(mem.Bytes()), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := mem.Close(); !errors.Is(err, engine.ErrMemoryBusy) {
		t.Fatalf("Close of pinned memory: %v", err)
	}
	mem.Bytes()[0] = 1 // still mapped
	r.Release()
}
