package tcp

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/cost"
)

const benchBatch = 128

var benchSizes = []struct {
	name string
	size int
}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}}

// benchEngine runs Mooncake's transfer_engine_bench loop: allocate a batch,
// submit benchBatch requests of size bytes at distinct offsets, wait, free.
func benchEngine(b *testing.B, op engine.Op, size int, cfg Config) {
	p := newPair(b, benchBatch*size, benchBatch*size, cfg)
	reqs := make([]engine.Request, benchBatch)
	for i := range reqs {
		reqs[i] = engine.Request{Op: op, Local: p.ini.buf()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*size)}
	}
	// Touch the memory once so page faults stay out of the measurement.
	fill(b, p.ini.buf())
	fill(b, p.tgt.buf())
	ctx := context.Background()
	b.SetBytes(int64(benchBatch * size))
	b.ReportAllocs()
	// Warm up: lanes dialled, buffers and rings sized.
	for range 3 {
		if err := p.ini.e.Transfer(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	start, cpu := time.Now(), cost.ProcessCPU()
	for b.Loop() {
		bid, err := p.ini.e.AllocateBatch(benchBatch)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.ini.e.Submit(bid, reqs); err != nil {
			b.Fatal(err)
		}
		if err := p.ini.e.Wait(ctx, bid); err != nil {
			b.Fatal(err)
		}
		if err := p.ini.e.FreeBatch(bid); err != nil {
			b.Fatal(err)
		}
	}
	el, cpu := time.Since(start).Seconds(), cost.ProcessCPU()-cpu
	b.ReportMetric(float64(b.N*benchBatch)/el, "req/s")
	b.ReportMetric(float64(b.N*benchBatch*size)/el/1e9, "GB/s")
	b.ReportMetric(float64(cpu)/float64(b.N*benchBatch), "proc-cpu-ns/req") // both sides: the target is in the process
}

// BenchmarkEngine: engine + tcp transport over loopback, default config,
// batch 128.
//
//	go test -run '^$' -bench 'Engine|RawLoopback' -benchmem ./tcp
func BenchmarkEngine(b *testing.B) {
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("op=%v/size=%s", op, s.name), func(b *testing.B) {
				benchEngine(b, op, s.size, Config{})
			})
		}
	}
}

// BenchmarkLanes sweeps lanes per peer and slice size (how the defaults
// were chosen).
func BenchmarkLanes(b *testing.B) {
	for _, lanes := range []int{1, 2, 4} {
		for _, op := range []engine.Op{engine.Write, engine.Read} {
			for _, s := range benchSizes {
				b.Run(fmt.Sprintf("lanes=%d/op=%v/size=%s", lanes, op, s.name), func(b *testing.B) {
					benchEngine(b, op, s.size, Config{Lanes: lanes})
				})
			}
		}
	}
}

// BenchmarkSliceSize: one 64 MiB request, cut into slices of various
// sizes, spread over the default lanes.
func BenchmarkSliceSize(b *testing.B) {
	for _, ss := range []uint64{256 << 10, 1 << 20, 4 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("slice=%dKiB", ss>>10), func(b *testing.B) {
			const size = 64 << 20
			p := newPair(b, size, size, Config{SliceSize: ss})
			fill(b, p.ini.buf())
			fill(b, p.tgt.buf())
			reqs := []engine.Request{{Op: engine.Write, Local: p.ini.buf(), Target: p.seg, TargetAddr: p.tgt.base()}}
			b.SetBytes(size)
			for b.Loop() {
				bid, _ := p.ini.e.AllocateBatch(1)
				p.ini.e.Submit(bid, reqs)
				if err := p.ini.e.Wait(context.Background(), bid); err != nil {
					b.Fatal(err)
				}
				p.ini.e.FreeBatch(bid)
			}
		})
	}
}

// BenchmarkRawLoopback is the ceiling: one loopback TCP connection, the
// sender writing 1 MiB per call, the receiver reading it into memory.
// span=1MiB reuses one cache-warm 1 MiB buffer on each side; span=128MiB
// walks 128 MiB on each side, the working set of BenchmarkEngine at 1 MiB.
func BenchmarkRawLoopback(b *testing.B) {
	for _, span := range []int{1 << 20, benchBatch << 20} {
		b.Run(fmt.Sprintf("span=%dMiB", span>>20), func(b *testing.B) { benchRaw(b, span) })
	}
}

func benchRaw(b *testing.B, span int) {
	const size = 1 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		dst, _ := engine.Alloc(span)
		defer dst.Close()
		fill(b, dst.Bytes())
		var n int64
		for off := 0; ; off = (off + size) % span {
			k, err := io.ReadFull(c, dst.Bytes()[off:off+size])
			n += int64(k)
			if err != nil {
				got <- n
				return
			}
		}
	}()
	c, err := net.Dial("tcp", "127.0.0.1:"+fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	if err != nil {
		b.Fatal(err)
	}
	src, _ := engine.Alloc(span)
	defer src.Close()
	fill(b, src.Bytes())
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	off := 0
	for b.Loop() {
		_, err := c.Write(src.Bytes()[off : off+size])
		off = (off + size) % span
		if err != nil {
			b.Fatal(err)
		}
	}
	c.(*net.TCPConn).CloseWrite()
	n := <-got
	el := time.Since(start).Seconds()
	c.Close()
	if n != int64(b.N)*size {
		b.Fatalf("received %d of %d bytes", n, int64(b.N)*size)
	}
	b.ReportMetric(float64(n)/el/1e9, "GB/s")
}

// rawPipe is one loopback TCP connection whose receiver reads into a
// registered-size span of memory, for side-by-side ceilings.
type rawPipe struct {
	c      net.Conn
	src    *engine.Memory
	done   chan int64
	want   chan int64
	ln     net.Listener
	span   int
	srcOff int
}

func newRawPipe(b *testing.B, span int) *rawPipe {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	r := &rawPipe{ln: ln, span: span, done: make(chan int64), want: make(chan int64)}
	dst, _ := engine.Alloc(span)
	fill(b, dst.Bytes())
	go func() {
		defer dst.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		off := 0
		for n := range r.want {
			for got := int64(0); got < n; {
				k := min(int(n-got), span-off, 1<<20)
				if _, err := io.ReadFull(c, dst.Bytes()[off:off+k]); err != nil {
					r.done <- -1
					return
				}
				got += int64(k)
				off = (off + k) % span
			}
			r.done <- n
		}
	}()
	if r.c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		b.Fatal(err)
	}
	r.src, _ = engine.Alloc(span)
	fill(b, r.src.Bytes())
	return r
}

// copy sends n bytes (1 MiB writes) and waits until the receiver has them.
func (r *rawPipe) copy(b *testing.B, n int64) {
	r.want <- n
	for sent := int64(0); sent < n; {
		k := min(int(n-sent), r.span-r.srcOff, 1<<20)
		if _, err := r.c.Write(r.src.Bytes()[r.srcOff : r.srcOff+k]); err != nil {
			b.Fatal(err)
		}
		sent += int64(k)
		r.srcOff = (r.srcOff + k) % r.span
	}
	if <-r.done != n {
		b.Fatal("raw receiver failed")
	}
}

func (r *rawPipe) close() {
	close(r.want)
	r.c.Close()
	r.ln.Close()
	r.src.Close()
}

// BenchmarkVersusRaw alternates, iteration by iteration, one engine batch
// (128 × 1 MiB, the working set of BenchmarkEngine) with a raw copy of the
// same 128 MiB over one loopback connection walking a 128 MiB span, so
// both see the same machine load. It reports both rates and their ratio.
func BenchmarkVersusRaw(b *testing.B) {
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		b.Run(fmt.Sprintf("op=%v/size=1MiB", op), func(b *testing.B) {
			const size = 1 << 20
			p := newPair(b, benchBatch*size, benchBatch*size, Config{})
			fill(b, p.ini.buf())
			fill(b, p.tgt.buf())
			reqs := make([]engine.Request, benchBatch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: p.ini.buf()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*size)}
			}
			raw := newRawPipe(b, benchBatch*size)
			defer raw.close()
			ctx := context.Background()
			for range 2 {
				p.ini.e.Transfer(ctx, reqs)
				raw.copy(b, benchBatch*size)
			}
			var te, tr time.Duration
			b.SetBytes(benchBatch * size)
			for b.Loop() {
				t0 := time.Now()
				if err := p.ini.e.Transfer(ctx, reqs); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				raw.copy(b, benchBatch*size)
				te += t1.Sub(t0)
				tr += time.Since(t1)
			}
			bytes := float64(b.N) * benchBatch * size
			b.ReportMetric(bytes/te.Seconds()/1e9, "engine-GB/s")
			b.ReportMetric(bytes/tr.Seconds()/1e9, "raw-GB/s")
			b.ReportMetric(tr.Seconds()/te.Seconds(), "engine/raw")
		})
	}
}

// BenchmarkLatency: one request per batch, submitted and waited for: the
// round trip through engine, lane, receiver and back.
func BenchmarkLatency(b *testing.B) {
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("op=%v/size=%d", op, size), func(b *testing.B) {
				p := newPair(b, size, size, Config{})
				reqs := []engine.Request{{Op: op, Local: p.ini.buf()[:size], Target: p.seg, TargetAddr: p.tgt.base()}}
				ctx := context.Background()
				for range 10 {
					p.ini.e.Transfer(ctx, reqs)
				}
				b.ReportAllocs()
				for b.Loop() {
					if err := p.ini.e.Transfer(ctx, reqs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkAuth: the same batch loop (WRITE, 128 × 64 KiB) to a target
// without and one with a cluster secret, batch for batch in turn, so both
// see the same load on a shared machine; it reports each side's GB/s and
// on/off (each iteration runs one batch on each, the first alternating).
// The handshake is per connection (done in the warm-up), so on/off
// should be 1 within noise. test/auth/bench.sh runs it.
func BenchmarkAuth(b *testing.B) {
	const size = 64 << 10
	type side struct {
		p    *pair
		reqs []engine.Request
		dur  time.Duration
	}
	var sides [2]side
	for i, s := range []*auth.Secret{nil, testSecret(b)} {
		p := newPair(b, benchBatch*size, benchBatch*size, Config{Auth: s})
		reqs := make([]engine.Request, benchBatch)
		for j := range reqs {
			reqs[j] = engine.Request{Op: engine.Write, Local: p.ini.buf()[j*size : (j+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(j*size)}
		}
		fill(b, p.ini.buf())
		fill(b, p.tgt.buf())
		for range 3 {
			if err := p.ini.e.Transfer(context.Background(), reqs); err != nil {
				b.Fatal(err)
			}
		}
		sides[i] = side{p: p, reqs: reqs}
	}
	ctx := context.Background()
	b.SetBytes(int64(2 * benchBatch * size))
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		for k := range sides {
			// Alternate which goes first: the second of a pair runs
			// while the first one's goroutines still wind down.
			sd := &sides[k^(n&1)]
			start := time.Now()
			bid, err := sd.p.ini.e.AllocateBatch(benchBatch)
			if err == nil {
				err = sd.p.ini.e.Submit(bid, sd.reqs)
			}
			if err == nil {
				err = sd.p.ini.e.Wait(ctx, bid)
			}
			if err == nil {
				err = sd.p.ini.e.FreeBatch(bid)
			}
			if err != nil {
				b.Fatal(err)
			}
			sd.dur += time.Since(start)
		}
		n++
	}
	gbps := func(d time.Duration) float64 { return float64(n*benchBatch*size) / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(sides[0].dur), "off-GB/s")
	b.ReportMetric(gbps(sides[1].dur), "on-GB/s")
	b.ReportMetric(sides[0].dur.Seconds()/sides[1].dur.Seconds(), "on/off")
}

// BenchmarkCost is tcp's per-request cost, stage by stage
// (enginetest.BenchCost, docs/cost.md): batches of 128 × 4 KiB between two
// engines of this process over loopback; the target's work is the serve
// stage.
func BenchmarkCost(b *testing.B) {
	const size = 4 << 10
	batch := enginetest.CostBatch
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		b.Run(fmt.Sprintf("op=%v/size=4KiB", op), func(b *testing.B) {
			p := newPair(b, batch*size, batch*size, Config{})
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: op, Local: p.ini.buf()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*size)}
			}
			enginetest.BenchCost(b, p.ini.e, reqs)
		})
	}
}
