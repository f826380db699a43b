package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

// BenchmarkFakeTransport is the engine's cost per request to a remote
// segment with a transport that completes every slice at once (fake): the
// resolution, slicing, completion and counting around a transport.
func BenchmarkFakeTransport(b *testing.B) {
	const batch, size = 128, 4096
	st := enginetest.NewMemStore()
	defer st.Close()
	enginetest.NewNode(b, engine.Config{Name: "target", Store: st}, batch*size, &fake{name: "fake"})
	ini := enginetest.NewNode(b, engine.Config{Name: "ini", Store: st}, batch*size, &fake{name: "fake"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seg, err := ini.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		b.Fatal(err)
	}
	d, _ := ini.Engine.SegmentDescriptor(seg)
	reqs := make([]engine.Request, batch)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*size : (i+1)*size], Target: seg, TargetAddr: d.Buffers[0].Addr + uint64(i*size)}
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		if err := ini.Engine.Transfer(context.Background(), reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*batch), "ns/req")
}
