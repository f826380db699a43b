package mctcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

const benchBatch = 128

// benchPair is an initiator engine and a target engine over one
// transport, with the requests of one batch ready.
type benchPair struct {
	e    *engine.Engine
	reqs []engine.Request
}

func newBenchPair(b *testing.B, op engine.Op, size int, tr func() engine.Transport) *benchPair {
	st := enginetest.NewMemStore()
	b.Cleanup(func() { st.Close() })
	cfg := func(name string) engine.Config {
		return engine.Config{Name: name, Store: st, MetadataTimeout: 5 * time.Second}
	}
	tgt := enginetest.NewNode(b, cfg("target"), benchBatch*size, tr())
	ini := enginetest.NewNode(b, cfg("initiator"), benchBatch*size, tr())
	rand.Read(tgt.Mem.Bytes())
	rand.Read(ini.Mem.Bytes())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seg, err := ini.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		b.Fatal(err)
	}
	p := &benchPair{e: ini.Engine, reqs: make([]engine.Request, benchBatch)}
	base := engine.AddrOf(tgt.Mem.Bytes())
	for i := range p.reqs {
		p.reqs[i] = engine.Request{Op: op, Local: ini.Mem.Bytes()[i*size : (i+1)*size], Target: seg, TargetAddr: base + uint64(i*size)}
	}
	for range 3 { // warm up: lanes dialled, rings sized
		p.batch(b)
	}
	return p
}

// batch runs one batch the way Mooncake's transfer_engine_bench does and
// returns how long it took.
func (p *benchPair) batch(b *testing.B) time.Duration {
	ctx := context.Background()
	start := time.Now()
	bid, err := p.e.AllocateBatch(benchBatch)
	if err == nil {
		err = p.e.Submit(bid, p.reqs)
	}
	if err == nil {
		err = p.e.Wait(ctx, bid)
	}
	if err == nil {
		err = p.e.FreeBatch(bid)
	}
	if err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkVsTE: engine + this transport (Mooncake's wire) next to engine
// + te's own tcp transport over loopback, batch for batch in turn (so
// both see the same load), batch 128: GB/s of each and their ratio.
//
//	go test -run '^$' -bench VsTE -benchmem ./mooncake/mctcp
func BenchmarkVsTE(b *testing.B) {
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		for _, s := range []struct {
			name string
			size int
		}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
			b.Run(fmt.Sprintf("op=%v/size=%s", op, s.name), func(b *testing.B) {
				mc := newBenchPair(b, op, s.size, func() engine.Transport { return New(Config{}) })
				te := newBenchPair(b, op, s.size, func() engine.Transport { return tcp.New(tcp.Config{}) })
				var tm, tt time.Duration
				b.SetBytes(int64(benchBatch * s.size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					tm += mc.batch(b)
					b.StopTimer()
					tt += te.batch(b)
					b.StartTimer()
				}
				bytes := float64(b.N * benchBatch * s.size)
				b.ReportMetric(bytes/tm.Seconds()/1e9, "mooncake-GB/s")
				b.ReportMetric(bytes/tt.Seconds()/1e9, "te-tcp-GB/s")
				b.ReportMetric(tt.Seconds()/tm.Seconds(), "mooncake/te")
			})
		}
	}
}
