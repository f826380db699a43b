package shm

import (
	"context"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// A DialOnly transport has no socket and describes nothing, yet maps a
// target's memory and copies into it.
func TestDialOnly(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 0, New(Config{}))
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	itr := New(Config{DialOnly: true})
	ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, 1<<20, itr)
	if itr.Endpoint() != "" || itr.ln != nil {
		t.Fatalf("a DialOnly transport listens on %q", itr.Endpoint())
	}
	if _, ok := ini.Engine.LocalDescriptor().Protocol(segment.ProtoSHM); ok {
		t.Fatal("a DialOnly transport described itself")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seg, err := ini.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	copy(ini.Mem.Bytes(), "hello from an initiator that serves nothing")
	if err := ini.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: engine.AddrOf(mem.Bytes())}}); err != nil {
		t.Fatal(err)
	}
	if string(mem.Bytes()[:64]) != string(ini.Mem.Bytes()[:64]) {
		t.Fatal("data differs")
	}
	if itr.Stats().Peers != 1 {
		t.Fatalf("stats %+v", itr.Stats())
	}
	if err := ini.Engine.Close(); err != nil {
		t.Fatal(err)
	}
}
