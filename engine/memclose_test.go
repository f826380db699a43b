//go:build unix

package engine_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
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

// TestRemoteWriteAfterMemoryClose: a target that closes registered memory
// (without unregistering it first) refuses a peer's later WRITE to it with
// an error; before Close unregistered, the WRITE hit unmapped memory and
// killed the target process.
func TestRemoteWriteAfterMemoryClose(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 0, tcp.New(tcp.Config{}))
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, tcp.New(tcp.Config{}))
	mem, err := engine.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	addr := engine.AddrOf(mem.Bytes())
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	seg, err := ini.Engine.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	req := []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: addr}}
	if err := ini.Engine.Transfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := mem.Close(); err != nil {
		t.Fatal(err)
	}
	// The initiator may still hold the old descriptor: its WRITE reaches
	// the target, which must refuse it.
	err = ini.Engine.Transfer(ctx, req)
	if !errors.Is(err, engine.ErrOutOfRange) {
		t.Fatalf("WRITE to closed memory: %v, want ErrOutOfRange", err)
	}
	// The target is alive and serves its other memory.
	other, err := engine.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := tgt.Engine.RegisterLocalMemory(other.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	if err := ini.Engine.SyncSegment(ctx, seg); err != nil {
		t.Fatal(err)
	}
	req[0].TargetAddr = engine.AddrOf(other.Bytes())
	if err := ini.Engine.Transfer(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryCloseStoreClosed: a store that can no longer publish does not
// keep memory registered or mapped: unregistration and Memory.Close
// succeed (the failed publish is logged), and the region is gone.
func TestMemoryCloseStoreClosed(t *testing.T) {
	st := enginetest.NewMemStore()
	e, err := engine.New(engine.Config{Name: "n", Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a, err := engine.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := engine.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, m := range []*engine.Memory{a, b} {
		if err := e.RegisterLocalMemory(m.Bytes(), ""); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	if err := e.UnregisterLocalMemory(a.Bytes()); err != nil {
		t.Errorf("unregister with the store closed: %v", err)
	}
	if err := e.UnregisterLocalMemory(a.Bytes()); !errors.Is(err, engine.ErrNotRegistered) {
		t.Errorf("second unregister: %v, want ErrNotRegistered", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Memory.Close with the store closed: %v", err)
	}
	if b.Bytes() != nil {
		t.Error("memory still mapped after Close")
	}
	if d := e.LocalDescriptor(); len(d.Buffers) != 0 {
		t.Errorf("descriptor still lists %d buffers", len(d.Buffers))
	}
}
