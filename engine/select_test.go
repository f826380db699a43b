package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment"
)

// TestSelectionPriority: with shm, rdma and tcp installed, a segment the
// shm transport reaches (same host) goes over shm; one it does not reach
// over rdma when the target has rdma, else over tcp; a request hint or
// OpenOptions forces one, but never one that does not reach the target.
// The choice, and the status naming it, do not allocate.
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
	allocs := enginetest.AllocsPerRun(200, func() {
		for _, rs := range [][]engine.Request{reqs, rreqs} {
			if err := e.Submit(b, rs); err != nil {
				t.Fatal(err)
			}
			if err := e.Wait(ctx, b); err != nil {
				t.Fatal(err)
			}
			if bs, _ := e.BatchStatus(b); bs.Transport == "" {
				t.Fatal("batch status names no transport")
			}
			e.FreeBatch(b)
			b, _ = e.AllocateBatch(1)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per request pair", allocs)
	}
}

// TestSelector: Config.Selector orders the transports a segment's
// requests use; names it returns that are not candidates are ignored, and
// returning none leaves the segment without a transport.
func TestSelector(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 1<<16, &fake{name: "tcp"}, &fake{name: "rdma"}, &fake{name: "x"})
	taddr := engine.AddrOf(tgt.Mem.Bytes())
	for _, c := range []struct {
		name string
		sel  engine.Selector
		want []string // nil: no transport
	}{
		{"default", nil, []string{"rdma", "tcp", "x"}},
		{"prefer tcp", engine.Prefer("tcp"), []string{"tcp", "rdma", "x"}},
		{"prefer unknown", engine.Prefer("shm", "x"), []string{"x", "tcp", "rdma"}},
		{"only x", func(*segment.Descriptor, []string) []string { return []string{"bogus", "x", "x"} }, []string{"x"}},
		{"none", func(*segment.Descriptor, []string) []string { return nil }, nil},
	} {
		trs := map[string]*fake{"tcp": {name: "tcp"}, "rdma": {name: "rdma"}, "x": {name: "x"}}
		ini := enginetest.NewNode(t, engine.Config{Name: "ini-" + c.name, Store: st, Selector: c.sel}, 1<<16, trs["tcp"], trs["rdma"], trs["x"])
		seg, err := ini.Engine.OpenSegment(ctx, "tgt", nil)
		if c.want == nil {
			if !errors.Is(err, engine.ErrNoTransport) {
				t.Errorf("%s: open: %v, want ErrNoTransport", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := ini.Engine.SegmentTransports(seg)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: SegmentTransports = %v (%v), want %v", c.name, got, err, c.want)
		}
		b, _ := ini.Engine.AllocateBatch(1)
		if err := ini.Engine.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: taddr}}); err != nil {
			t.Fatal(err)
		}
		if err := ini.Engine.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		if bs, _ := ini.Engine.BatchStatus(b); bs.Transport != c.want[0] || trs[c.want[0]].slices.Load() != 1 {
			t.Errorf("%s: batch went over %q, want %s", c.name, bs.Transport, c.want[0])
		}
	}
}

// TestFallback: when the preferred transport's Connect fails (a target
// that refuses: too many peers, wrong secret), the segment falls back to
// the next transport of its route, on OpenSegment and on the first
// request after a restart alike; it is logged once per transport, and the
// task and batch status name the transport that carried the bytes. A
// forced transport does not fall back, and one that connects again is
// used again.
func TestFallback(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	near := func(*segment.Descriptor) bool { return true }
	tgt := enginetest.NewNode(t, engine.Config{Name: "tgt", Store: st}, 1<<16, &fake{name: "tcp"}, &fake{name: "rdma"}, reacher{&fake{name: "shm", reaches: near}})
	taddr := engine.AddrOf(tgt.Mem.Bytes())

	var log testenv.Buffer
	shm, rdma, tcp := &fake{name: "shm", reaches: near}, &fake{name: "rdma"}, &fake{name: "tcp"}
	shm.refuse.Store(true)
	rdma.refuse.Store(true)
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st, Logger: slog.New(slog.NewTextHandler(&log, nil))}, 1<<16, tcp, rdma, reacher{shm})
	e := ini.Engine
	fallbacks := func() int { return strings.Count(log.String(), "falling back") }

	if _, err := e.OpenSegment(ctx, "tgt", &engine.OpenOptions{Transport: "shm"}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("forced shm that refuses: %v", err)
	}
	if n := fallbacks(); n != 0 {
		t.Fatalf("a forced transport fell back (%d log lines)", n)
	}
	seg, err := e.OpenSegment(ctx, "tgt", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := e.SegmentTransports(seg); !slices.Equal(got, []string{"tcp", "shm", "rdma"}) {
		t.Errorf("SegmentTransports after two refusals = %v", got)
	}
	transfer := func(hints ...string) engine.TaskStatus {
		t.Helper()
		b, _ := e.AllocateBatch(len(hints))
		defer e.FreeBatch(b)
		reqs := make([]engine.Request, len(hints))
		for i, h := range hints {
			reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: taddr, Transport: h}
		}
		if err := e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		if err := e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
		ts, _ := e.Status(b, 0)
		bs, _ := e.BatchStatus(b)
		if len(hints) == 1 && ts.Transport != bs.Transport {
			t.Errorf("task over %q, its batch over %q", ts.Transport, bs.Transport)
		}
		return bs
	}
	for range 3 {
		if bs := transfer(""); bs.Transport != "tcp" || bs.Transferred != 64 {
			t.Errorf("after fallback: %+v, want 64 bytes over tcp", bs)
		}
	}
	if n := fallbacks(); n != 2 || tcp.slices.Load() != 3 {
		t.Errorf("%d fallback log lines (want 2: shm, then rdma), %d slices over tcp (want 3)\n%s", n, tcp.slices.Load(), log.String())
	}

	// The target restarts: the first request connects again, on the
	// Submit path, and falls back past shm once more.
	d, err := st.Get(ctx, "tgt")
	if err != nil {
		t.Fatal(err)
	}
	rdma.refuse.Store(false)
	d.Epoch++
	if err := st.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := e.SyncSegment(ctx, seg); err != nil {
		t.Fatal(err)
	}
	if bs := transfer(""); bs.Transport != "rdma" {
		t.Errorf("after restart: over %q, want rdma", bs.Transport)
	}
	if n := fallbacks(); n != 3 {
		t.Errorf("%d fallback log lines after a restart, want 3", n)
	}
	if bs := transfer("tcp", "rdma", "tcp"); bs.Transport != "tcp,rdma" {
		t.Errorf("mixed batch over %q, want tcp,rdma", bs.Transport)
	}
	// shm comes back: forcing it connects, and then it is the first
	// choice again.
	shm.refuse.Store(false)
	if bs := transfer("shm"); bs.Transport != "shm" {
		t.Errorf("shm hint: over %q", bs.Transport)
	}
	if bs := transfer(""); bs.Transport != "shm" {
		t.Errorf("after shm connected: over %q, want shm", bs.Transport)
	}
	// The local segment is copied in process: no transport.
	if bs := func() engine.TaskStatus {
		b, _ := e.AllocateBatch(1)
		defer e.FreeBatch(b)
		e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: engine.LocalSegment, TargetAddr: engine.AddrOf(ini.Mem.Bytes()[4096:])}})
		e.Wait(ctx, b)
		bs, _ := e.BatchStatus(b)
		return bs
	}(); bs.State != engine.StateCompleted || bs.Transport != "" {
		t.Errorf("local segment: %+v", bs)
	}
}
