package bench

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

// TestRunNotify: with Notify every measured batch carries a notification;
// with the target in this process each is received there and its latency
// from submit is reported (at least the time the data takes, and within
// the batch latency's order).
func TestRunNotify(t *testing.T) {
	st := enginetest.NewMemStore()
	target := enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<20, tcp.New(tcp.Config{}))
	init := enginetest.NewNode(t, engine.Config{Name: "init", Store: st}, 1<<20, tcp.New(tcp.Config{}))
	seg, err := init.Engine.OpenSegment(ctxT(t), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{Engine: init.Engine, Local: init.Mem.Bytes(), Segment: seg, Remote: engine.AddrOf(target.Mem.Bytes()), Target: target.Engine}
	c := Config{Op: engine.Write, Block: 4096, Batch: 16, Threads: 2, Duration: 500 * time.Millisecond, Protocols: []string{"tcp"}, Notify: true}
	rs, err := Run(ctxT(t), env, c)
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	t.Logf("%+v", *r)
	if !r.Notify || r.Batches == 0 || r.Notified == 0 || r.Notified > r.Batches+2 {
		t.Fatalf("%d batches, %d notifications received", r.Batches, r.Notified)
	}
	if r.NotifyP50Micros <= 0 || r.NotifyP99Micros < r.NotifyP50Micros {
		t.Fatalf("notification latency p50 %v p99 %v", r.NotifyP50Micros, r.NotifyP99Micros)
	}
	if s := target.Engine.NotifyStats(); s.Accepted < r.Notified || s.Full != 0 {
		t.Fatalf("target: %+v", s)
	}
}
