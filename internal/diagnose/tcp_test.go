package diagnose_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/diagnose"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

// peer is a target engine serving tcp with one buffer.
func peer(t *testing.T, st *enginetest.MemStore, name string) *enginetest.Node {
	t.Helper()
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 1<<20, tcp.New(tcp.Config{}))
	for i := range n.Mem.Bytes() {
		n.Mem.Bytes()[i] = byte(i * 31)
	}
	return n
}

// initiator is an unlisted engine with tcp and a registered buffer.
func initiator(t *testing.T, st *enginetest.MemStore) *enginetest.Node {
	t.Helper()
	return enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st, Unlisted: true, MetadataTimeout: time.Second},
		64<<10, tcp.New(tcp.Config{DialOnly: true}))
}

func run(t *testing.T, cfg diagnose.Config) *diagnose.Report {
	t.Helper()
	if cfg.Timeout == 0 {
		// Generous: a test that expects a peer to answer must pass on a
		// loaded machine and in the emulated guest.
		cfg.Timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := diagnose.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := diagnose.Print(&b, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", b.String())
	return rep
}

// failedAt asserts that the first failure is layer l and wraps want.
func failedAt(t *testing.T, rep *diagnose.Report, l diagnose.Layer, want error, detail ...string) diagnose.Check {
	t.Helper()
	if rep.OK() {
		t.Fatalf("report OK, want a failure at %s", l)
	}
	f := rep.Failed()
	if len(f) == 0 {
		t.Fatalf("no FAIL in the report, want one at %s", l)
	}
	c := f[0]
	if c.Layer != l {
		t.Fatalf("first failure at %s %s (%s), want %s", c.Layer, c.Unit, c.Detail, l)
	}
	if want != nil && !errors.Is(c.Err, want) {
		t.Errorf("%s: error %v, want one wrapping %v", l, c.Err, want)
	}
	for _, d := range detail {
		if !strings.Contains(c.Detail, d) {
			t.Errorf("%s: detail %q does not say %q", l, c.Detail, d)
		}
	}
	if c.Fix == "" {
		t.Errorf("%s: no fix", l)
	}
	return c
}

func TestHealthyTCP(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	p := peer(t, st.Process(), "peer")
	ini := initiator(t, st)
	before := bytes.Clone(p.Mem.Bytes()[:64<<10])
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "peer", Local: ini.Mem.Bytes()})
	if !rep.OK() {
		t.Fatalf("a healthy peer failed: %+v", rep.Failed())
	}
	if rep.Protocol != "tcp" {
		t.Errorf("protocol %q, want tcp", rep.Protocol)
	}
	// Every lane passed: one line per layer for all of them.
	for _, l := range []diagnose.Layer{diagnose.LayerTCPDial, diagnose.LayerTCPHello, diagnose.LayerTCPRange, diagnose.LayerTCPProbe} {
		if got := rep.Find(l); len(got) != 1 || got[0].Unit != "lanes 0-3" {
			t.Errorf("%s: %+v, want one check for lanes 0-3", l, got)
		}
	}
	if c := rep.Find(diagnose.LayerTCPDial)[0]; !strings.Contains(c.Detail, "4 connections from 127.0.0.1") {
		t.Errorf("dial detail %q", c.Detail)
	}
	for _, l := range []diagnose.Layer{diagnose.LayerDescriptor, diagnose.LayerEpoch, diagnose.LayerTransport, diagnose.LayerLocal, diagnose.LayerTransfer} {
		if len(rep.Find(l)) != 1 {
			t.Errorf("%s: %d checks, want 1", l, len(rep.Find(l)))
		}
	}
	if c := rep.Find(diagnose.LayerTCPProbe)[0]; !strings.Contains(c.Detail, "4096 bytes per lane written, read back, verified") {
		t.Errorf("probe detail %q", c.Detail)
	}
	// The probes restore what they overwrote.
	if !bytes.Equal(p.Mem.Bytes()[:64<<10], before) {
		t.Error("the peer's bytes differ after the probes")
	}
}

// crafted publishes a descriptor of name whose tcp endpoint is ep, as a
// store holds it for a peer whose listener is gone or broken.
func crafted(t *testing.T, st *enginetest.MemStore, name, ep string) {
	t.Helper()
	owner := st.Process()
	t.Cleanup(func() { owner.Close() })
	d := &segment.Descriptor{Name: name, Epoch: 0x1234, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ep, TCP: &segment.TCP{Wire: 2}}},
		Buffers:   []segment.Buffer{{Addr: 1 << 30, Length: 1 << 20, Location: "cpu"}}}
	if err := owner.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

func TestListenerGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := ln.Addr().String()
	ln.Close()
	st := enginetest.NewMemStore()
	defer st.Close()
	crafted(t, st, "gone", ep)
	ini := initiator(t, st)
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "gone", Local: ini.Mem.Bytes()})
	c := failedAt(t, rep, diagnose.LayerTCPDial, tcp.ErrConnection, "connection refused")
	if !strings.Contains(c.Fix, "nothing listens") {
		t.Errorf("fix %q does not say nothing listens", c.Fix)
	}
	if got := rep.Find(diagnose.LayerTCPDial); len(got) != 1 || got[0].Unit != "lanes 0-3" {
		t.Errorf("dial checks %+v, want one for lanes 0-3 (refused alike)", got)
	}
	if got := rep.Find(diagnose.LayerTransfer); len(got) != 1 || got[0].Status != diagnose.Skip {
		t.Errorf("transfer: %+v, want SKIP", got)
	}
}

func TestPeerNeverAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // accepted, never read, never answered
		}
	}()
	defer func() {
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	}()
	st := enginetest.NewMemStore()
	defer st.Close()
	crafted(t, st, "silent", ln.Addr().String())
	ini := initiator(t, st)
	start := time.Now()
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "silent", Local: ini.Mem.Bytes(), Timeout: 300 * time.Millisecond})
	c := failedAt(t, rep, diagnose.LayerTCPHello, tcp.ErrTimeout, "no handshake answer")
	if !strings.Contains(c.Fix, "stopped") {
		t.Errorf("fix %q does not name a stopped process", c.Fix)
	}
	if got := rep.Find(diagnose.LayerTCPDial); len(got) != 1 || got[0].Status != diagnose.Pass {
		t.Errorf("dial: %+v, want PASS on every lane", got)
	}
	// The lanes wait at once: one timeout, not one per lane.
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("took %v", el)
	}
}

func TestUnregisteredLocalRange(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	peer(t, st.Process(), "peer")
	ini := initiator(t, st)
	other, err := engine.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "peer", Local: other.Bytes()})
	failedAt(t, rep, diagnose.LayerLocal, engine.ErrNotRegistered, "is not inside registered memory", "registered: [")
	if got := rep.Find(diagnose.LayerTransfer); len(got) != 1 || got[0].Status != diagnose.Skip {
		t.Errorf("transfer: %+v, want SKIP", got)
	}
	// The peer itself is healthy: its lanes pass.
	for _, c := range rep.Find(diagnose.LayerTCPProbe) {
		if c.Status != diagnose.Pass {
			t.Errorf("%s %s: %s", c.Layer, c.Unit, c.Status)
		}
	}
}

func TestStaleEpoch(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	old := st.Process()
	p := enginetest.NewNode(t, engine.Config{Name: "peer", Store: old}, 1<<20, tcp.New(tcp.Config{}))
	cached := p.Engine.LocalDescriptor()
	// The peer restarts: a new engine (new epoch) under the same name.
	if err := p.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	old.Close()
	p2 := peer(t, st.Process(), "peer")
	ini := initiator(t, st)
	rep := run(t, diagnose.Config{Engine: ini.Engine, Store: st, Segment: "peer", Local: ini.Mem.Bytes(), Cached: cached})
	failedAt(t, rep, diagnose.LayerEpoch, engine.ErrPeerReset, "restarted since its descriptor was cached", "cached epoch", "refuses a hello for the cached epoch")
	if f := rep.Failed(); len(f) != 1 {
		t.Errorf("%d failures, want only the epoch's: %+v", len(f), f)
	}
	if p2.Engine.Epoch() == cached.Epoch {
		t.Fatal("the restarted peer kept its epoch")
	}
}
