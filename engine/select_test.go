package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// TestSelectionPriority: with shm, rdma and tcp installed, a segment the
// shm transport reaches (same host) goes over shm; one it does not reach
// over rdma when the target has rdma, else over tcp; a request hint or
// OpenOptions forces one, but never one that does not reach the target.
// The choice does not allocate.
func TestSelectionPriority(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Targets install in the order that a first-offered rule would get
	// wrong: tcp before rdma before shm.
	near := func(d *segment.Descriptor) bool { return d.Name == "local-all" }
	target := func(name string, protos ...string) uint64 {
		trs := make([]engine.Transport, len(protos))
		for i, p := range protos {
			trs[i] = &fake{name: p}
			if p == segment.ProtoSHM {
				trs[i] = reacher{&fake{name: p, reaches: near}}
			}
		}
		n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 1<<16, trs...)
		return engine.AddrOf(n.Mem.Bytes())
	}
	addr := map[string]uint64{
		"local-all":  target("local-all", "tcp", "rdma", "shm"),
		"remote-all": target("remote-all", "tcp", "rdma", "shm"),
		"tcp-only":   target("tcp-only", "tcp"),
		"rdma-tcp":   target("rdma-tcp", "tcp", "rdma"),
	}
	shm := &fake{name: segment.ProtoSHM, reaches: near}
	rdma, tcp := &fake{name: segment.ProtoRDMA}, &fake{name: segment.ProtoTCP}
	// Installed here in yet another order.
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<16, tcp, reacher{shm}, rdma)
	e := ini.Engine
	counts := func() [3]int64 { return [3]int64{shm.slices.Load(), rdma.slices.Load(), tcp.slices.Load()} }
	b, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	run := func(seg engine.SegmentID, name, hint string) (string, error) {
		t.Helper()
		before := counts()
		err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: addr[name], Transport: hint}})
		if err != nil {
			return "", err
		}
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		if err := e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		if b, err = e.AllocateBatch(1); err != nil {
			t.Fatal(err)
		}
		after := counts()
		for i, p := range []string{"shm", "rdma", "tcp"} {
			if after[i] != before[i] {
				return p, nil
			}
		}
		return "none", nil
	}
	for _, c := range []struct{ seg, hint, want string }{
		{"local-all", "", "shm"},
		{"remote-all", "", "rdma"},
		{"tcp-only", "", "tcp"},
		{"rdma-tcp", "", "rdma"},
		{"local-all", "tcp", "tcp"},
		{"local-all", "rdma", "rdma"},
		{"remote-all", "tcp", "tcp"},
	} {
		seg, err := e.OpenSegment(ctx, c.seg, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := run(seg, c.seg, c.hint)
		if err != nil || got != c.want {
			t.Errorf("%s hint %q: went over %s (%v), want %s", c.seg, c.hint, got, err, c.want)
		}
	}
	// shm is never chosen for a target it does not reach, even when asked.
	seg, _ := e.OpenSegment(ctx, "remote-all", nil)
	if _, err := run(seg, "remote-all", "shm"); !errors.Is(err, engine.ErrNoTransport) {
		t.Errorf("shm hint to another host: %v", err)
	}
	if _, err := e.OpenSegment(ctx, "remote-all", &engine.OpenOptions{Transport: "shm"}); !errors.Is(err, engine.ErrNoTransport) {
		t.Errorf("open another host's segment over shm: %v", err)
	}
	seg, _ = e.OpenSegment(ctx, "tcp-only", nil)
	if _, err := run(seg, "tcp-only", "rdma"); !errors.Is(err, engine.ErrNoTransport) {
		t.Errorf("rdma hint to a tcp-only target: %v", err)
	}
	// OpenOptions forces a transport for every request of the segment.
	addr["forced"] = target("forced", "tcp", "rdma")
	fs, err := e.OpenSegment(ctx, "forced", &engine.OpenOptions{Transport: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := run(fs, "forced", ""); err != nil || got != "tcp" {
		t.Errorf("forced tcp: went over %s (%v)", got, err)
	}

	// Steady state: choosing among three transports allocates nothing.
	seg, _ = e.OpenSegment(ctx, "local-all", nil)
	reqs := []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: addr["local-all"]}}
	rseg, _ := e.OpenSegment(ctx, "rdma-tcp", nil)
	rreqs := []engine.Request{{Op: engine.Read, Local: ini.Mem.Bytes()[:64], Target: rseg, TargetAddr: addr["rdma-tcp"], Transport: "tcp"}}
	allocs := testing.AllocsPerRun(200, func() {
		for _, rs := range [][]engine.Request{reqs, rreqs} {
			if err := e.Submit(b, rs); err != nil {
				t.Fatal(err)
			}
			if err := e.Wait(ctx, b); err != nil {
				t.Fatal(err)
			}
			e.FreeBatch(b)
			b, _ = e.AllocateBatch(1)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per request pair", allocs)
	}
}
