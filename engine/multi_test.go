package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

// named is a tcp transport under another protocol name, counting the
// slices it carries, so tests can see which transport the engine chose.
type named struct {
	driver.Transport
	name   string
	slices *atomic.Int64
}

func newNamed(name string) named {
	return named{Transport: tcp.New(tcp.Config{}).Driver(), name: name, slices: new(atomic.Int64)}
}

func (n named) Name() string { return n.name }

func (n named) Driver() driver.Transport { return n }

func (n named) Describe(d *segment.Descriptor) error {
	if err := n.Transport.Describe(d); err != nil {
		return err
	}
	d.Protocols[len(d.Protocols)-1].Name = n.name
	return nil
}

func (n named) Connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	p, ok := remote.Protocol(n.name)
	if !ok {
		return nil, errors.New("not offered")
	}
	r := remote.Clone()
	p.Name = segment.ProtoTCP
	r.Protocols = []segment.Protocol{p}
	return n.Transport.Connect(ctx, r)
}

func (n named) Submit(ss []*driver.Slice) {
	n.slices.Add(int64(len(ss)))
	n.Transport.Submit(ss)
}

func multiNode(t *testing.T, st *enginetest.MemStore, name string, trs ...named) (*engine.Engine, *engine.Memory) {
	t.Helper()
	ts := make([]engine.Transport, len(trs))
	for i, tr := range trs {
		ts[i] = tr
	}
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 1<<16, ts...)
	return n.Engine, n.Mem
}

// TestTransportSelection: the target's protocol order picks the default,
// a request hint or an OpenOptions override picks another, and
// uninstalling the default falls back to the next offered transport.
func TestTransportSelection(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	multiNode(t, st, "tgt", newNamed("tcp"), newNamed("alt"))
	_, tmem := multiNode(t, st, "tgt-alt-only", newNamed("alt"))
	a, b := newNamed("tcp"), newNamed("alt")
	ini, mem := multiNode(t, st, "ini", a, b)
	ctx := ctxT(t, 10*time.Second)

	d, _ := st.Get(ctx, "tgt")
	if len(d.Protocols) != 2 || d.Protocols[0].Name != "tcp" || d.Protocols[1].Name != "alt" {
		t.Fatalf("target protocols: %+v", d.Protocols)
	}
	seg, err := ini.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	taddr := d.Buffers[0].Addr
	run := func(id engine.SegmentID, hint string, at uint64) error {
		bid, _ := ini.AllocateBatch(1)
		defer ini.FreeBatch(bid)
		if err := ini.Submit(bid, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:512], Target: id, TargetAddr: at, Transport: hint}}); err != nil {
			return err
		}
		return ini.Wait(ctx, bid)
	}
	check := func(what string, wantA, wantB int64) {
		t.Helper()
		if a.slices.Load() != wantA || b.slices.Load() != wantB {
			t.Fatalf("%s: tcp carried %d, alt %d; want %d, %d", what, a.slices.Load(), b.slices.Load(), wantA, wantB)
		}
	}
	if err := run(seg, "", taddr); err != nil {
		t.Fatal(err)
	}
	check("default", 1, 0)
	if err := run(seg, "alt", taddr); err != nil {
		t.Fatal(err)
	}
	check("hint", 1, 1)
	if err := run(seg, "rdma", taddr); !errors.Is(err, engine.ErrNoTransport) {
		t.Fatalf("hint for a missing transport: %v", err)
	}
	// An override at open time.
	if _, err := ini.OpenSegment(ctx, "tgt", &engine.OpenOptions{Transport: "alt"}); !errors.Is(err, engine.ErrNoTransport) {
		t.Fatalf("reopen with another transport: %v", err)
	}
	ini.CloseSegment(seg)
	seg, err = ini.OpenSegment(ctx, "tgt", &engine.OpenOptions{Transport: "alt"})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(seg, "", taddr); err != nil {
		t.Fatal(err)
	}
	check("override", 1, 2)
	ini.CloseSegment(seg)
	// Uninstalling the preferred transport falls back to the next.
	seg, err = ini.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.Uninstall("tcp"); err != nil {
		t.Fatal(err)
	}
	if err := run(seg, "", taddr); err != nil {
		t.Fatal(err)
	}
	check("fallback", 1, 3)
	if err := run(seg, "tcp", taddr); !errors.Is(err, engine.ErrNoTransport) {
		t.Fatalf("hint for an uninstalled transport: %v", err)
	}
	// A segment offering only what is not installed cannot be opened.
	lone, _ := multiNode(t, st, "ini-tcp-only", newNamed("tcp"))
	if _, err := lone.OpenSegment(ctx, "tgt-alt-only", nil); !errors.Is(err, engine.ErrNoTransport) || !errors.Is(err, segment.ErrNoProtocol) {
		t.Fatalf("no common transport: %v", err)
	}
	_ = tmem
}
