package tcp

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// A DialOnly transport listens nowhere and describes nothing, yet carries
// an initiator's transfers.
func TestDialOnly(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := newNode(t, st, "target", 1<<20, Config{})
	ini := newNode(t, st, "initiator", 1<<20, Config{DialOnly: true, Listen: "0.0.0.0:0"})
	if ep := ini.tr.Endpoint(); ep != "" || ini.tr.ln != nil {
		t.Fatalf("a DialOnly transport listens on %q", ep)
	}
	if _, ok := ini.e.LocalDescriptor().Protocol(segment.ProtoTCP); ok {
		t.Fatalf("a DialOnly transport described itself: %+v", ini.e.LocalDescriptor())
	}
	ctx := ctxT(t, 10*time.Second)
	seg, err := ini.e.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ini.buf()[:8192])
	if err := ini.e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: ini.buf()[:8192], Target: seg, TargetAddr: tgt.base()}}); err != nil {
		t.Fatal(err)
	}
	if string(tgt.buf()[:8192]) != string(ini.buf()[:8192]) {
		t.Fatal("data differs")
	}
	if err := ini.e.Close(); err != nil {
		t.Fatal(err)
	}
}
