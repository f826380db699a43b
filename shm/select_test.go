package shm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

// TestSelection: with shm and tcp installed on both sides, a target on
// this host goes over shm; one whose shm entry names another host, or
// that registered memory shm cannot hand out, goes over tcp, and shm
// cannot be forced onto it.
func TestSelection(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx := ctxT(t, 30*time.Second)
	newTarget := func(name string, sharedMem bool) uint64 {
		n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 0, tcp.New(tcp.Config{}), New(Config{}))
		alloc := engine.Alloc
		if sharedMem {
			alloc = engine.AllocShared
		}
		mem, err := alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		if err := n.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
			t.Fatal(err)
		}
		return engine.AddrOf(mem.Bytes())
	}
	addr := map[string]uint64{}
	addr["near"] = newTarget("near", true)
	addr["private-memory"] = newTarget("private-memory", false)
	hostID = func() (string, error) { return "another-boot/4026531840", nil }
	addr["far"] = newTarget("far", true)
	hostID = defaultHostID

	tr := New(Config{})
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 0, tcp.New(tcp.Config{}), tr)
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := ini.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	e := ini.Engine
	for _, c := range []struct {
		name string
		shm  bool
		why  string // what forcing shm says
	}{{"near", true, ""}, {"private-memory", false, "must come from engine.AllocShared"}, {"far", false, "runs on another host"}} {
		before := tr.Stats().Peers
		seg, err := e.OpenSegment(ctx, c.name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:4096], Target: seg, TargetAddr: addr[c.name]}}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := tr.Stats().Peers > before; got != c.shm {
			t.Errorf("%s: over shm %v, want %v", c.name, got, c.shm)
		}
		if !c.shm {
			err := e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:4096], Target: seg, TargetAddr: addr[c.name], Transport: segment.ProtoSHM}})
			if !errors.Is(err, engine.ErrNoTransport) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("%s: shm forced: %v, want ErrNoTransport saying %q", c.name, err, c.why)
			}
			d, _ := e.SegmentDescriptor(seg)
			if _, err := tr.Driver().Connect(ctx, d); !errors.Is(err, ErrNotReachable) {
				t.Errorf("%s: Connect: %v, want ErrNotReachable", c.name, err)
			}
		}
	}
	if st := tr.Stats(); st.Peers != 1 {
		t.Errorf("shm connected to %d targets, want 1 (near)", st.Peers)
	}
}

// TestUnreachable: each reason Reaches refuses a segment has its own
// explanation, and a reachable segment none.
func TestUnreachable(t *testing.T) {
	tr := New(Config{})
	tr.hostID = "boot/ns"
	attrs := func(change ...func(*segment.SHM)) *segment.Descriptor {
		a := &segment.SHM{Wire: wireVersion, Host: "boot/ns", UID: tr.uid}
		for _, f := range change {
			f(a)
		}
		return &segment.Descriptor{Name: "seg", Protocols: []segment.Protocol{{Name: segment.ProtoSHM, Endpoint: "@x", SHM: a}}}
	}
	if err := tr.unreachable(attrs()); err != nil || !tr.reaches(attrs()) {
		t.Errorf("reachable segment: %v", err)
	}
	for _, c := range []struct {
		d   *segment.Descriptor
		why string
	}{
		{&segment.Descriptor{Name: "seg", Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: "h:1"}}}, "does not serve shm"},
		{&segment.Descriptor{Name: "seg", Protocols: []segment.Protocol{{Name: segment.ProtoSHM, Endpoint: "@x"}}}, "no shm part"},
		{attrs(func(a *segment.SHM) { a.Host = "other/ns" }), "another host"},
		{attrs(func(a *segment.SHM) { a.UID = 4242 }), "uid 4242"},
		{attrs(func(a *segment.SHM) { a.Partial = 2 }), "engine.AllocShared"},
		{attrs(func(a *segment.SHM) { a.Wire = 9 }), "wire version"},
	} {
		if err := tr.unreachable(c.d); tr.reaches(c.d) || err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%v: Unreachable %v, want it to say %q", c.d.Protocols, err, c.why)
		}
	}
}
