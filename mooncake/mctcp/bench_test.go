package mctcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
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

func newBenchPair(b testing.TB, op engine.Op, size int, tr func() engine.Transport) *benchPair {
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
func (p *benchPair) batch(b testing.TB) time.Duration {
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

// BenchmarkConnPerRequest: v2 requests sent the way Mooncake's initiator
// sends them in its default mode (MC_TCP_ENABLE_CONNECTION_POOL unset),
// each on a connection of its own (dial, header and a WRITE's payload,
// status and a READ's payload, close: the target reads EOF and closes
// too), next to the same requests on one persistent connection per
// client, one request at a time (its pooled lanes). 16 clients at once,
// as Mooncake's batches keep many connections open. ns/op is the
// target's time per request under that load; allocs/op count the
// client's dialling and Go's accepting a connection, none made by the
// target's serving (pooled shows it).
//
//	go test -run '^$' -bench ConnPerRequest -benchmem ./mooncake/mctcp
func BenchmarkConnPerRequest(b *testing.B) {
	const slots = 64
	for _, op := range []byte{opWrite, opRead} {
		for _, s := range []struct {
			name string
			size int
		}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
			for _, pooled := range []bool{false, true} {
				name := map[byte]string{opWrite: "write", opRead: "read"}[op]
				conn := map[bool]string{false: "per-request", true: "pooled"}[pooled]
				b.Run(fmt.Sprintf("op=%s/size=%s/conn=%s", name, s.name, conn), func(b *testing.B) {
					n := newNode(b, nil, "target", slots*s.size, Config{}, nil)
					addr, base := n.tr.Endpoint(), n.base()
					var next atomic.Int64
					b.SetBytes(int64(s.size))
					b.ReportAllocs()
					b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						slot := uint64(next.Add(1)-1) % slots
						var hb [headerLen]byte
						h := header{size: uint64(s.size), addr: base + slot*uint64(s.size), op: op | opV2}
						h.encode(hb[:])
						buf := make([]byte, s.size)
						var st [statusLen]byte
						var c net.Conn
						defer func() {
							if c != nil {
								c.Close()
							}
						}()
						for pb.Next() {
							if err := request(&c, addr, hb[:], st[:], buf, op); err != nil {
								b.Error(err)
								return
							}
							if !pooled {
								c.Close()
								c = nil
							}
						}
					})
				})
			}
		}
	}
}

// request sends one request on *c (dialled first if nil) and reads its
// answer.
func request(c *net.Conn, addr string, hb, st, buf []byte, op byte) error {
	if *c == nil {
		d, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		*c = d
	}
	if _, err := (*c).Write(hb); err != nil {
		return err
	}
	if op == opWrite {
		if _, err := (*c).Write(buf); err != nil {
			return err
		}
	}
	if _, err := io.ReadFull(*c, st); err != nil {
		return err
	}
	if code, err := decodeStatus(st); err != nil || code != statusOK {
		return fmt.Errorf("status %d, %v", code, err)
	}
	if op == opRead {
		if _, err := io.ReadFull(*c, buf); err != nil {
			return err
		}
	}
	return nil
}
