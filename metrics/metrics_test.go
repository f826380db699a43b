package metrics_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/metrics"
	"github.com/rdmago/te/tcp"
)

type pair struct {
	ini, tgt *enginetest.Node
	seg      engine.SegmentID
	remote   uint64
}

func newPair(t *testing.T, size int) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &pair{}
	p.tgt = enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, size, tcp.New(tcp.Config{}))
	p.ini = enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, size, tcp.New(tcp.Config{}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if p.seg, err = p.ini.Engine.OpenSegment(ctx, "target", nil); err != nil {
		t.Fatal(err)
	}
	p.remote = engine.AddrOf(p.tgt.Mem.Bytes())
	return p
}

func (p *pair) requests(op engine.Op, n, size int) []engine.Request {
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Op: op, Local: p.ini.Mem.Bytes()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.remote + uint64(i*size)}
	}
	return reqs
}

// gather returns the registry's metrics by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// value is the sample of family name whose labels include want; ok is
// false when there is none.
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (v float64, ok bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// TestCollector moves known bytes over loopback TCP and reads them back
// as metrics on both sides: the initiator's per-peer and per-lane
// counters and histograms, the target's served counters per initiator.
func TestCollector(t *testing.T) {
	const n, size = 16, 64 << 10
	p := newPair(t, n*size)
	ctx := context.Background()
	if err := p.ini.Engine.Transfer(ctx, p.requests(engine.Write, n, size)); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.Engine.Transfer(ctx, p.requests(engine.Read, n/2, size)); err != nil {
		t.Fatal(err)
	}
	ini, err := metrics.Registry(metrics.NewCollector(p.ini.Engine, nil))
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := metrics.Registry(metrics.NewCollector(p.tgt.Engine, nil))
	if err != nil {
		t.Fatal(err)
	}
	im, tm := gather(t, ini), gather(t, tgt)
	for _, c := range []struct {
		mfs    map[string]*dto.MetricFamily
		name   string
		labels map[string]string
		want   float64
	}{
		{im, "te_bytes_total", map[string]string{"peer": "target", "protocol": "tcp", "op": "WRITE"}, n * size},
		{im, "te_bytes_total", map[string]string{"peer": "target", "protocol": "tcp", "op": "READ"}, n / 2 * size},
		{im, "te_slices_total", map[string]string{"peer": "target", "protocol": "tcp", "op": "WRITE"}, n},
		{im, "te_tasks_total", map[string]string{"peer": "target", "protocol": "tcp"}, n + n/2},
		{im, "te_failed_slices_total", map[string]string{"peer": "target", "protocol": "tcp"}, 0},
		{im, "te_retries_total", map[string]string{"protocol": "tcp", "cause": "connection"}, 0},
		// One slice in 8 of a batch is timed: slices 0 and 8 of the
		// writes, slice 0 of the reads.
		{im, "te_slice_latency_seconds", map[string]string{"protocol": "tcp"}, 3},
		{im, "te_batch_latency_seconds", nil, 2},
		{im, "te_tasks_in_flight", nil, 0},
		{im, "te_segment_tasks_in_flight", map[string]string{"peer": "target"}, 0},
		{tm, "te_served_bytes_total", map[string]string{"peer": "initiator", "protocol": "tcp", "op": "WRITE"}, n * size},
		{tm, "te_served_bytes_total", map[string]string{"peer": "initiator", "protocol": "tcp", "op": "READ"}, n / 2 * size},
		{tm, "te_served_slices_total", map[string]string{"peer": "initiator", "protocol": "tcp", "op": "WRITE"}, n},
	} {
		got, ok := value(c.mfs, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	// Per lane: the lanes' bytes add up to the peer's.
	var lanes float64
	for _, m := range im["te_rail_bytes_total"].GetMetric() {
		lanes += m.GetCounter().GetValue()
	}
	if lanes != n*size+n/2*size {
		t.Errorf("te_rail_bytes_total sums to %v over the lanes, want %v", lanes, n*size+n/2*size)
	}
	if v, ok := value(im, "te_endpoints", map[string]string{"protocol": "tcp", "state": "connected"}); !ok || v < 1 {
		t.Errorf("te_endpoints{tcp,connected} = %v (present %v), want at least 1", v, ok)
	}
	if v, ok := value(im, "te_descriptor_age_seconds", map[string]string{"peer": "target"}); !ok || v <= 0 || v > 60 {
		t.Errorf("te_descriptor_age_seconds{target} = %v (present %v)", v, ok)
	}
}

// TestPromtool checks the exposition (the handler's text format, with the
// Go and process collectors) with Prometheus's promtool check metrics.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Unavailable(t, "promtool not found (apt-get install prometheus, or make deps)")
	}
	p := newPair(t, 1<<20)
	if err := p.ini.Engine.Transfer(context.Background(), p.requests(engine.Write, 4, 4096)); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*engine.Engine{p.ini.Engine, p.tgt.Engine} {
		h, err := metrics.Handler(e)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if !bytes.Contains(text, []byte("te_bytes_total")) && !bytes.Contains(text, []byte("te_served_bytes_total")) {
			t.Fatalf("%s: exposition lacks te's metrics:\n%.2000s", e.Name(), text)
		}
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(text)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: promtool check metrics: %v\n%s", e.Name(), err, out)
		}
		if s := strings.TrimSpace(string(out)); s != "" {
			t.Fatalf("%s: promtool check metrics complains:\n%s", e.Name(), s)
		}
	}
}

// TestNoAllocsWithMetrics: with a Collector registered and scraped, a
// steady batch loop over loopback TCP still allocates nothing anywhere in
// the process, and every byte it moved shows in the next scrape.
func TestNoAllocsWithMetrics(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const batch, size = 128, 4096
	p := newPair(t, batch*size)
	reg, err := metrics.Registry(metrics.NewCollector(p.ini.Engine, nil))
	if err != nil {
		t.Fatal(err)
	}
	reqs := p.requests(engine.Write, batch, size)
	ctx := context.Background()
	var failed error
	runs := 0
	run := func() {
		runs++
		b, err := p.ini.Engine.AllocateBatch(batch)
		if err == nil {
			err = p.ini.Engine.Submit(b, reqs)
		}
		if err == nil {
			err = p.ini.Engine.Wait(ctx, b)
		}
		if err == nil {
			err = p.ini.Engine.FreeBatch(b)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	for range 10 {
		run()
	}
	labels := map[string]string{"peer": "target", "protocol": "tcp", "op": "WRITE"}
	before, _ := value(gather(t, reg), "te_bytes_total", labels)
	n0 := runs
	allocs := enginetest.AllocsPerRun(20, run)
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of %d with metrics on", allocs, batch)
	}
	after, _ := value(gather(t, reg), "te_bytes_total", labels)
	if want := float64((runs - n0) * batch * size); after-before != want {
		t.Fatalf("te_bytes_total rose by %v over %d batches, want %v", after-before, runs-n0, want)
	}
}

// BenchmarkScrape is one scrape of an engine with a tcp peer: snapshot,
// collect, the Go and process collectors, and the text encoding.
func BenchmarkScrape(b *testing.B) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt := enginetest.NewNode(b, engine.Config{Name: "target", Store: st}, 1<<20, tcp.New(tcp.Config{}))
	ini := enginetest.NewNode(b, engine.Config{Name: "initiator", Store: st}, 1<<20, tcp.New(tcp.Config{}))
	seg, err := ini.Engine.OpenSegment(context.Background(), "target", nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := ini.Engine.Transfer(context.Background(), []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: engine.AddrOf(tgt.Mem.Bytes())}}); err != nil {
		b.Fatal(err)
	}
	h, err := metrics.Handler(ini.Engine)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}
