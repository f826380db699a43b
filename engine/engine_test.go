package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/tcp"
)

func TestWriteReadRoundTrip(t *testing.T) {
	const size = 1 << 20
	p := newPair(t, size, size, tcp.Config{})
	src := p.ini.buf()
	fill(t, src[:size/2])
	b, err := p.ini.e.AllocateBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	// WRITE the first half to the target, READ it back into the second.
	if err := p.ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: src[:size/2], Target: p.seg, TargetAddr: p.tgt.base() + 4096}}); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.tgt.buf()[4096:4096+size/2], src[:size/2]) {
		t.Fatal("target memory differs after WRITE")
	}
	if err := p.ini.e.Submit(b, []engine.Request{{Op: engine.Read, LocalAddr: p.ini.base() + size/2, Length: size / 2, Target: p.seg, TargetAddr: p.tgt.base() + 4096}}); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if sum(src[size/2:]) != sum(src[:size/2]) {
		t.Fatal("READ back differs")
	}
	for i := range 2 {
		st, err := p.ini.e.Status(b, i)
		if err != nil || st.State != engine.StateCompleted || st.Transferred != size/2 || st.Err != nil {
			t.Fatalf("task %d: %+v, %v", i, st, err)
		}
	}
	bs, err := p.ini.e.BatchStatus(b)
	if err != nil || bs.State != engine.StateCompleted || bs.Transferred != size {
		t.Fatalf("batch: %+v %v", bs, err)
	}
	if err := p.ini.e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.FreeBatch(b); !errors.Is(err, engine.ErrInvalidBatch) {
		t.Fatalf("double free: %v", err)
	}
	if _, err := p.ini.e.Status(b, 0); !errors.Is(err, engine.ErrInvalidBatch) {
		t.Fatalf("status after free: %v", err)
	}
}

// TestIntegritySizes writes random patterns of 1 B ... 64 MiB, reads them
// back elsewhere, and compares checksums.
func TestIntegritySizes(t *testing.T) {
	const max = 64 << 20
	p := newPair(t, 2*max, max+8192, tcp.Config{})
	ctx := ctxT(t, 60*time.Second)
	b, _ := p.ini.e.AllocateBatch(2)
	defer p.ini.e.FreeBatch(b)
	sizes := []int{1, 2, 7, 63, 4095, 4096, 4097, 65535, 65536, 1<<20 - 1, 1 << 20, 1<<20 + 1, 3<<20 + 17, 16 << 20, max}
	for _, n := range sizes {
		src := p.ini.buf()[:n]
		dst := p.ini.buf()[max : max+n]
		fill(t, src)
		clear(dst)
		off := uint64(n % 8191) // unaligned target offsets too
		if err := p.ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: src, Target: p.seg, TargetAddr: p.tgt.base() + off}}); err != nil {
			t.Fatal(err)
		}
		if err := p.ini.e.Wait(ctx, b); err != nil {
			t.Fatalf("%d: write: %v", n, err)
		}
		if err := p.ini.e.Submit(b, []engine.Request{{Op: engine.Read, Local: dst, Target: p.seg, TargetAddr: p.tgt.base() + off}}); err != nil {
			t.Fatal(err)
		}
		if err := p.ini.e.Wait(ctx, b); err != nil {
			t.Fatalf("%d: read: %v", n, err)
		}
		if sum(dst) != sum(src) || sum(p.tgt.buf()[off:off+uint64(n)]) != sum(src) {
			t.Fatalf("size %d: checksum mismatch", n)
		}
		for i := range 2 {
			if st, _ := p.ini.e.Status(b, i); st.State != engine.StateCompleted || st.Transferred != uint64(n) {
				t.Fatalf("size %d task %d: %+v", n, i, st)
			}
		}
		if err := p.ini.e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		b, _ = p.ini.e.AllocateBatch(2)
	}
}

// TestBatch4096 moves 4096 tasks of mixed sizes in one batch.
func TestBatch4096(t *testing.T) {
	const tasks, blk = 4096, 1024
	p := newPair(t, 2*tasks*blk, tasks*blk, tcp.Config{})
	ctx := ctxT(t, 60*time.Second)
	src := p.ini.buf()[:tasks*blk]
	fill(t, src)
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		n := 1 + (i*37)%blk
		reqs[i] = engine.Request{Op: engine.Write, Local: src[i*blk : i*blk+n], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*blk)}
	}
	b, _ := p.ini.e.AllocateBatch(tasks)
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		n := 1 + (i*37)%blk
		if !bytes.Equal(p.tgt.buf()[i*blk:i*blk+n], src[i*blk:i*blk+n]) {
			t.Fatalf("task %d: target differs", i)
		}
		reqs[i].Op = engine.Read
		reqs[i].Local = p.ini.buf()[tasks*blk+i*blk : tasks*blk+i*blk+n]
	}
	p.ini.e.FreeBatch(b)
	b, _ = p.ini.e.AllocateBatch(tasks)
	defer p.ini.e.FreeBatch(b)
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	bs, _ := p.ini.e.BatchStatus(b)
	var want uint64
	for i := range reqs {
		n := 1 + (i*37)%blk
		want += uint64(n)
		if !bytes.Equal(reqs[i].Local, src[i*blk:i*blk+n]) {
			t.Fatalf("task %d: read back differs", i)
		}
	}
	if bs.State != engine.StateCompleted || bs.Transferred != want {
		t.Fatalf("batch %+v, want %d bytes", bs, want)
	}
}

// TestConcurrentSubmitters runs many goroutines, each with its own batch
// and region, against one target.
func TestConcurrentSubmitters(t *testing.T) {
	const workers, rounds, blk, per = 16, 20, 8192, 16
	p := newPair(t, workers*per*blk, workers*per*blk, tcp.Config{})
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			region := p.ini.buf()[w*per*blk : (w+1)*per*blk]
			taddr := p.tgt.base() + uint64(w*per*blk)
			reqs := make([]engine.Request, per)
			for r := range rounds {
				fill(t, region)
				want := sum(region)
				for i := range reqs {
					reqs[i] = engine.Request{Op: engine.Write, Local: region[i*blk : (i+1)*blk], Target: p.seg, TargetAddr: taddr + uint64(i*blk)}
				}
				b, err := p.ini.e.AllocateBatch(per)
				if err != nil {
					errs <- err
					return
				}
				if err := p.ini.e.Submit(b, reqs); err != nil {
					errs <- err
					return
				}
				if err := p.ini.e.Wait(ctx, b); err != nil {
					errs <- fmt.Errorf("worker %d round %d write: %w", w, r, err)
					return
				}
				clear(region)
				for i := range reqs {
					reqs[i].Op = engine.Read
				}
				p.ini.e.FreeBatch(b)
				b, _ = p.ini.e.AllocateBatch(per)
				if err := p.ini.e.Submit(b, reqs); err != nil {
					errs <- err
					return
				}
				if err := p.ini.e.Wait(ctx, b); err != nil {
					errs <- fmt.Errorf("worker %d round %d read: %w", w, r, err)
					return
				}
				if err := p.ini.e.FreeBatch(b); err != nil {
					errs <- err
					return
				}
				if sum(region) != want {
					errs <- fmt.Errorf("worker %d round %d: checksum mismatch", w, r)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestLocalSegment(t *testing.T) {
	n := newNode(t, nil, "solo", 1<<16, tcp.Config{})
	fill(t, n.buf()[:4096])
	b, _ := n.e.AllocateBatch(2)
	defer n.e.FreeBatch(b)
	err := n.e.Submit(b, []engine.Request{
		{Op: engine.Write, Local: n.buf()[:4096], Target: engine.LocalSegment, TargetAddr: n.base() + 8192},
		{Op: engine.Read, Local: n.buf()[16384 : 16384+4096], Target: engine.LocalSegment, TargetAddr: n.base() + 8192},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.e.Wait(ctxT(t, time.Second), b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(n.buf()[16384:16384+4096], n.buf()[:4096]) {
		t.Fatal("local copy differs")
	}
	if id, err := n.e.OpenSegment(ctxT(t, time.Second), "solo", nil); err != nil || id != engine.LocalSegment {
		t.Fatalf("open own name: %v %v", id, err)
	}
}

func TestRegistration(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	n := newNode(t, st, "reg", 0, tcp.Config{})
	mem, err := engine.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	b := mem.Bytes()
	d0, _ := st.Get(context.Background(), "reg")
	if len(d0.Buffers) != 0 {
		t.Fatalf("buffers before registration: %v", d0.Buffers)
	}
	if p, ok := d0.Protocol(segment.ProtoTCP); !ok || p.Endpoint != n.tr.Endpoint() {
		t.Fatalf("tcp protocol entry: %+v", d0.Protocols)
	}
	if err := n.e.RegisterLocalMemory(b[:1<<19], "cpu:1"); err != nil {
		t.Fatal(err)
	}
	d1, _ := st.Get(context.Background(), "reg")
	if d1.Version <= d0.Version || d1.Epoch != d0.Epoch || len(d1.Buffers) != 1 ||
		d1.Buffers[0].Addr != addr(b) || d1.Buffers[0].Length != 1<<19 || d1.Buffers[0].Location != "cpu:1" {
		t.Fatalf("after register: %+v (before v%d)", d1, d0.Version)
	}
	for _, c := range []struct {
		name string
		mem  []byte
	}{{"same", b[:1<<19]}, {"inside", b[4096:8192]}, {"straddle", b[1<<18 : 1<<19+4096]}} {
		if err := n.e.RegisterLocalMemory(c.mem, ""); !errors.Is(err, engine.ErrOverlap) {
			t.Errorf("%s: got %v, want ErrOverlap", c.name, err)
		}
	}
	if err := n.e.RegisterLocalMemory(nil, ""); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Errorf("empty: %v", err)
	}
	// The raw address form, adjacent (not overlapping).
	if err := n.e.RegisterLocalAddr(uintptr(addr(b)+1<<19), 1<<19, ""); err != nil {
		t.Fatal(err)
	}
	if err := n.e.UnregisterLocalMemory(b[4096:]); !errors.Is(err, engine.ErrNotRegistered) {
		t.Errorf("unregister mid-region: %v", err)
	}
	if err := n.e.UnregisterLocalMemory(b); err != nil {
		t.Fatal(err)
	}
	if err := n.e.UnregisterLocalAddr(uintptr(addr(b) + 1<<19)); err != nil {
		t.Fatal(err)
	}
	d2, _ := st.Get(context.Background(), "reg")
	if len(d2.Buffers) != 0 || d2.Version <= d1.Version {
		t.Fatalf("after unregister: %+v", d2)
	}
	if err := n.e.UnregisterLocalMemory(b); !errors.Is(err, engine.ErrNotRegistered) {
		t.Errorf("double unregister: %v", err)
	}
}

func TestOpenSegmentErrors(t *testing.T) {
	p := newPair(t, 4096, 4096, tcp.Config{})
	_, err := p.ini.e.OpenSegment(ctxT(t, time.Second), "nobody", nil)
	if !errors.Is(err, engine.ErrSegmentNotFound) || !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("unknown segment: %v", err)
	}
	if _, err := p.ini.e.OpenSegment(ctxT(t, time.Second), "target", &engine.OpenOptions{Transport: "rdma"}); !errors.Is(err, engine.ErrNoTransport) {
		t.Fatalf("forced transport not installed: %v", err)
	}
	// Same name again: same ID, reference counted.
	id2, err := p.ini.e.OpenSegment(ctxT(t, time.Second), "target", nil)
	if err != nil || id2 != p.seg {
		t.Fatalf("reopen: %v %v", id2, err)
	}
	if err := p.ini.e.CloseSegment(id2); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.CloseSegment(p.seg); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.CloseSegment(p.seg); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("double close: %v", err)
	}
	noStore := newNode(t, nil, "lonely", 0, tcp.Config{})
	if _, err := noStore.e.OpenSegment(ctxT(t, time.Second), "target", nil); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("no store: %v", err)
	}
}

// TestSubmitErrors checks that every invalid request is refused with its
// own error before anything moves: the valid request submitted alongside
// does not run either.
func TestSubmitErrors(t *testing.T) {
	const size = 1 << 16
	p := newPair(t, size, size, tcp.Config{})
	fill(t, p.ini.buf())
	stray, _ := engine.Alloc(4096)
	defer stray.Close()
	good := engine.Request{Op: engine.Write, Local: p.ini.buf()[:4096], Target: p.seg, TargetAddr: p.tgt.base()}
	tb := p.tgt.base()
	cases := []struct {
		name string
		req  engine.Request
		want error
	}{
		{"remote past end", engine.Request{Op: engine.Write, Local: p.ini.buf()[:4096], Target: p.seg, TargetAddr: tb + size - 4095}, engine.ErrOutOfRange},
		{"remote before start", engine.Request{Op: engine.Read, Local: p.ini.buf()[:16], Target: p.seg, TargetAddr: tb - 1}, segment.ErrOutOfRange},
		{"remote wraps", engine.Request{Op: engine.Read, Local: p.ini.buf()[:16], Target: p.seg, TargetAddr: ^uint64(0) - 3}, engine.ErrInvalidRequest},
		{"local unregistered", engine.Request{Op: engine.Write, Local: stray.Bytes(), Target: p.seg, TargetAddr: tb}, engine.ErrNotRegistered},
		{"local heap", engine.Request{Op: engine.Write, Local: make([]byte, 64), Target: p.seg, TargetAddr: tb}, engine.ErrNotRegistered},
		{"local raw past end", engine.Request{Op: engine.Read, LocalAddr: p.ini.base() + size - 8, Length: 16, Target: p.seg, TargetAddr: tb}, engine.ErrNotRegistered},
		{"unknown segment", engine.Request{Op: engine.Write, Local: p.ini.buf()[:16], Target: 999, TargetAddr: tb}, engine.ErrSegmentNotFound},
		{"local segment out of range", engine.Request{Op: engine.Write, Local: p.ini.buf()[:16], Target: engine.LocalSegment, TargetAddr: tb}, engine.ErrOutOfRange},
		{"zero length", engine.Request{Op: engine.Write, LocalAddr: p.ini.base(), Target: p.seg, TargetAddr: tb}, engine.ErrInvalidRequest},
		{"length beyond local", engine.Request{Op: engine.Write, Local: p.ini.buf()[:16], Length: 17, Target: p.seg, TargetAddr: tb}, engine.ErrInvalidRequest},
		{"bad op", engine.Request{Op: 9, Local: p.ini.buf()[:16], Target: p.seg, TargetAddr: tb}, engine.ErrInvalidRequest},
		{"transport not installed", engine.Request{Op: engine.Write, Local: p.ini.buf()[:16], Target: p.seg, TargetAddr: tb, Transport: "rdma"}, engine.ErrNoTransport},
	}
	b, _ := p.ini.e.AllocateBatch(4)
	defer p.ini.e.FreeBatch(b)
	for _, c := range cases {
		err := p.ini.e.Submit(b, []engine.Request{good, c.req})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := p.ini.e.Status(b, 0); !errors.Is(err, engine.ErrInvalidTask) {
		t.Errorf("status of never-submitted task: %v", err)
	}
	if bytes.Equal(p.tgt.buf()[:4096], p.ini.buf()[:4096]) {
		t.Fatal("a refused submission moved data")
	}
	// Nothing is pinned: the memory can be unregistered and registered.
	if err := p.ini.e.UnregisterLocalMemory(p.ini.buf()); err != nil {
		t.Fatalf("pins leaked by refused submissions: %v", err)
	}
	if err := p.ini.e.RegisterLocalMemory(p.ini.buf(), ""); err != nil {
		t.Fatal(err)
	}
	// Capacity.
	reqs := []engine.Request{good, good, good}
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Submit(b, reqs[:2]); !errors.Is(err, engine.ErrBatchFull) {
		t.Fatalf("over capacity: %v", err)
	}
	if err := p.ini.e.Wait(ctxT(t, 5*time.Second), b); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Submit(engine.BatchID(12345), reqs); !errors.Is(err, engine.ErrInvalidBatch) {
		t.Fatalf("unknown batch: %v", err)
	}
	if _, err := p.ini.e.AllocateBatch(0); !errors.Is(err, engine.ErrInvalidRequest) {
		t.Fatalf("zero capacity: %v", err)
	}
	if _, err := p.ini.e.Status(b, 3); !errors.Is(err, engine.ErrInvalidTask) {
		t.Fatalf("task past submitted: %v", err)
	}
}

// blackhole publishes a segment whose tcp endpoint accepts connections,
// completes their handshake and never answers a request, so transfers to
// it stay in flight.
func blackhole(t *testing.T, st *enginetest.MemStore, name string) (seg segment.Buffer, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go control.TCP.Accept(control.Stream(c, c, control.TCP.Frames()), nil, auth.Party{Name: name, Epoch: 7}, nil)
		}
	}()
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	d := &segment.Descriptor{Name: name, Epoch: 7, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}},
		Buffers:   []segment.Buffer{buf}}
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	return buf, func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}
}

// TestBusyRefusals: with a task in flight, the batch cannot be freed, its
// local memory cannot be unregistered, its segment cannot be closed and
// its transport cannot be uninstalled; once the task fails (the peer's
// I/O timeout), all of them succeed.
func TestBusyRefusals(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	buf, stop := blackhole(t, st, "hole")
	defer stop()
	// The I/O timeout is what ends the task: long enough that a loaded
	// machine still checks every refusal while it is in flight.
	n := newNode(t, st, "ini", 1<<16, tcp.Config{IOTimeout: 3 * time.Second})
	seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "hole", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.e.AllocateBatch(1)
	if err := n.e.Submit(b, []engine.Request{{Op: engine.Write, Local: n.buf()[:4096], Target: seg, TargetAddr: buf.Addr}}); err != nil {
		t.Fatal(err)
	}
	if err := n.e.FreeBatch(b); !errors.Is(err, engine.ErrBatchBusy) {
		t.Errorf("free in flight: %v", err)
	}
	if err := n.e.UnregisterLocalMemory(n.buf()); !errors.Is(err, engine.ErrMemoryBusy) {
		t.Errorf("unregister in flight: %v", err)
	}
	if err := n.e.CloseSegment(seg); !errors.Is(err, engine.ErrSegmentBusy) {
		t.Errorf("close segment in flight: %v", err)
	}
	if err := n.e.Uninstall("tcp"); !errors.Is(err, engine.ErrTransportBusy) {
		t.Errorf("uninstall in flight: %v", err)
	}
	if st, _ := n.e.Status(b, 0); st.State != engine.StatePending {
		t.Errorf("state in flight: %v", st.State)
	}
	start := time.Now()
	err = n.e.Wait(ctxT(t, 30*time.Second), b)
	if !errors.Is(err, tcp.ErrTimeout) {
		t.Fatalf("wait on a silent peer: %v", err)
	}
	t.Logf("failed after %v", time.Since(start))
	if st, _ := n.e.Status(b, 0); st.State != engine.StateFailed || !errors.Is(st.Err, tcp.ErrTimeout) || st.Transferred != 0 {
		t.Errorf("status after timeout: %+v", st)
	}
	if err := n.e.FreeBatch(b); err != nil {
		t.Error(err)
	}
	if err := n.e.UnregisterLocalMemory(n.buf()); err != nil {
		t.Error(err)
	}
	if err := n.e.CloseSegment(seg); err != nil {
		t.Error(err)
	}
	if err := n.e.Uninstall("tcp"); err != nil {
		t.Error(err)
	}
	if err := n.e.Uninstall("tcp"); !errors.Is(err, engine.ErrNoTransport) {
		t.Errorf("uninstall twice: %v", err)
	}
}

func TestInstall(t *testing.T) {
	n := newNode(t, nil, "inst", 0, tcp.Config{})
	if err := n.e.Install(tcp.New(tcp.Config{})); !errors.Is(err, engine.ErrTransportExists) {
		t.Fatalf("second tcp: %v", err)
	}
	if got := n.e.Transports(); len(got) != 1 || got[0] != "tcp" {
		t.Fatalf("transports: %v", got)
	}
	if err := n.e.Uninstall("tcp"); err != nil {
		t.Fatal(err)
	}
	if d := n.e.LocalDescriptor(); len(d.Protocols) != 0 {
		t.Fatalf("protocols after uninstall: %+v", d.Protocols)
	}
	if err := n.e.Install(tcp.New(tcp.Config{})); err != nil {
		t.Fatal(err)
	}
	if err := n.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := n.e.AllocateBatch(1); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	var nilEngine *engine.Engine
	if err := nilEngine.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPeerClosedMidBatch closes the target engine while a large batch is
// in flight: every task finishes (COMPLETED or FAILED), Wait returns, the
// failures say why, and nothing leaks (TestMain checks goroutines).
func TestPeerClosedMidBatch(t *testing.T) {
	const tasks, blk, span = 1024, 1 << 20, 64
	var (
		p    *pair
		b    engine.BatchID
		reqs []engine.Request
		err  error
		bs   engine.TaskStatus
	)
	// A loaded machine may stall this goroutine until the whole batch is
	// through before the target closes: then try again.
	for attempt := 1; ; attempt++ {
		p = newPair(t, span*blk, span*blk, tcp.Config{})
		reqs = make([]engine.Request, tasks)
		for i := range reqs {
			off := (i % span) * blk
			reqs[i] = engine.Request{Op: engine.Write, Local: p.ini.buf()[off : off+blk], Target: p.seg, TargetAddr: p.tgt.base() + uint64(off)}
		}
		b, _ = p.ini.e.AllocateBatch(tasks)
		if err := p.ini.e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		for {
			if bs, _ := p.ini.e.BatchStatus(b); bs.Transferred > 0 || bs.State != engine.StatePending {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		if err := p.tgt.e.Close(); err != nil {
			t.Fatal(err)
		}
		err = p.ini.e.Wait(ctxT(t, 20*time.Second), b)
		bs, _ = p.ini.e.BatchStatus(b)
		t.Logf("attempt %d: wait: %v; batch %v, %d of %d bytes", attempt, err, bs.State, bs.Transferred, tasks*blk)
		if err != nil {
			break
		}
		if attempt == 5 {
			t.Fatal("the whole batch completed every time although the target closed early")
		}
		p.ini.e.FreeBatch(b)
	}
	if !errors.Is(err, tcp.ErrConnection) && !errors.Is(err, engine.ErrPeerReset) && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("unexpected failure: %v", err)
	}
	failed := 0
	for i := range tasks {
		st, _ := p.ini.e.Status(b, i)
		switch st.State {
		case engine.StateFailed:
			failed++
			if st.Err == nil {
				t.Fatalf("task %d failed without an error", i)
			}
		case engine.StateCompleted:
			if st.Transferred != blk {
				t.Fatalf("task %d completed with %d bytes", i, st.Transferred)
			}
		default:
			t.Fatalf("task %d: %v after Wait", i, st.State)
		}
	}
	if failed == 0 || bs.State != engine.StateFailed {
		t.Fatalf("no task failed but Wait said %v", err)
	}
	if err := p.ini.e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	// Later submissions fail fast (the segment is gone or unreachable).
	b, _ = p.ini.e.AllocateBatch(1)
	defer p.ini.e.FreeBatch(b)
	if err := p.ini.e.Submit(b, reqs[:1]); err == nil {
		if err := p.ini.e.Wait(ctxT(t, 10*time.Second), b); err == nil {
			t.Fatal("transfer to a closed target succeeded")
		}
	}
}

// TestPeerRestart: the target restarts under the same name (new epoch);
// the initiator's watch replaces the descriptor, drops its connections,
// and transfers reach the new incarnation.
func TestPeerRestart(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	tgt1 := newNode(t, st, "phoenix", 1<<16, tcp.Config{})
	ini := newNode(t, st, "ini", 1<<16, tcp.Config{})
	ctx := ctxT(t, 10*time.Second)
	seg, err := ini.e.OpenSegment(ctx, "phoenix", nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ini.buf()[:4096])
	b, _ := ini.e.AllocateBatch(1)
	if err := ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.buf()[:4096], Target: seg, TargetAddr: tgt1.base()}}); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	ini.e.FreeBatch(b)
	d1, _ := ini.e.SegmentDescriptor(seg)
	tgt1.e.Close()

	tgt2 := newNode(t, st, "phoenix", 1<<16, tcp.Config{})
	var d2 *segment.Descriptor
	for d2 == nil || d2.Epoch == d1.Epoch {
		if ctx.Err() != nil {
			t.Fatal("descriptor of the new incarnation never arrived")
		}
		time.Sleep(5 * time.Millisecond)
		d2, _ = ini.e.SegmentDescriptor(seg)
	}
	for len(d2.Buffers) == 0 {
		time.Sleep(5 * time.Millisecond)
		d2, _ = ini.e.SegmentDescriptor(seg)
	}
	b, _ = ini.e.AllocateBatch(1)
	defer ini.e.FreeBatch(b)
	if err := ini.e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.buf()[:4096], Target: seg, TargetAddr: tgt2.base()}}); err != nil {
		t.Fatal(err)
	}
	if err := ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tgt2.buf()[:4096], ini.buf()[:4096]) {
		t.Fatal("new incarnation did not receive the data")
	}
}

func TestWaitContext(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	buf, stop := blackhole(t, st, "hole")
	defer stop()
	// The task must outlive the first Wait's context on a loaded machine.
	n := newNode(t, st, "ini", 1<<16, tcp.Config{IOTimeout: 3 * time.Second})
	seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "hole", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := n.e.AllocateBatch(1)
	n.e.Submit(b, []engine.Request{{Op: engine.Read, Local: n.buf()[:64], Target: seg, TargetAddr: buf.Addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := n.e.Wait(ctx, b); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with expired context: %v", err)
	}
	if err := n.e.Wait(ctxT(t, 30*time.Second), b); !errors.Is(err, tcp.ErrTimeout) {
		t.Fatalf("wait: %v", err)
	}
	n.e.FreeBatch(b)
}

func TestTransfer(t *testing.T) {
	p := newPair(t, 1<<20, 1<<20, tcp.Config{})
	fill(t, p.ini.buf()[:8192])
	err := p.ini.e.Transfer(ctxT(t, 5*time.Second), []engine.Request{
		{Op: engine.Write, Local: p.ini.buf()[:8192], Target: p.seg, TargetAddr: p.tgt.base()},
	})
	if err != nil || !bytes.Equal(p.tgt.buf()[:8192], p.ini.buf()[:8192]) {
		t.Fatalf("transfer: %v", err)
	}
	if err := p.ini.e.Transfer(ctxT(t, time.Second), []engine.Request{{Op: engine.Write, Local: p.ini.buf()[:1], Target: 77}}); !errors.Is(err, engine.ErrSegmentNotFound) {
		t.Fatalf("transfer to an unknown segment: %v", err)
	}
	// A context that ends first: the batch finishes and is freed later.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = p.ini.e.Transfer(ctx, []engine.Request{{Op: engine.Read, Local: p.ini.buf()[:1<<20], Target: p.seg, TargetAddr: p.tgt.base()}})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled transfer: %v", err)
	}
}

// TestPeerReinstall: the target reinstalls its tcp transport (a new
// listener, same process and epoch); the initiator drops the old
// connections with the changed endpoint and reaches the new one.
func TestPeerReinstall(t *testing.T) {
	p := newPair(t, 1<<16, 1<<16, tcp.Config{})
	ctx := ctxT(t, 10*time.Second)
	req := []engine.Request{{Op: engine.Write, Local: p.ini.buf()[:4096], Target: p.seg, TargetAddr: p.tgt.base()}}
	if err := p.ini.e.Transfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := p.tgt.e.Uninstall("tcp"); err != nil {
		t.Fatal(err)
	}
	tr := tcp.New(tcp.Config{})
	if err := p.tgt.e.Install(tr); err != nil {
		t.Fatal(err)
	}
	for {
		d, err := p.ini.e.SegmentDescriptor(p.seg)
		if err != nil {
			t.Fatal(err)
		}
		if pr, ok := d.Protocol("tcp"); ok && pr.Endpoint == tr.Endpoint() {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("new endpoint never seen")
		}
		time.Sleep(time.Millisecond)
	}
	fill(t, p.ini.buf()[:4096])
	if err := p.ini.e.Transfer(ctx, req); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.tgt.buf()[:4096], p.ini.buf()[:4096]) {
		t.Fatal("data differs")
	}
}

// TestMixedTargets: one batch whose requests alternate between two remote
// segments and the local one.
func TestMixedTargets(t *testing.T) {
	st := enginetest.NewMemStore()
	defer st.Close()
	a := newNode(t, st, "a", 1<<20, tcp.Config{})
	b := newNode(t, st, "b", 1<<20, tcp.Config{})
	ini := newNode(t, st, "ini", 1<<20, tcp.Config{})
	ctx := ctxT(t, 10*time.Second)
	sa, err := ini.e.OpenSegment(ctx, "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := ini.e.OpenSegment(ctx, "b", nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, ini.buf()[:1<<19])
	const blk = 4096
	var reqs []engine.Request
	targets := []struct {
		id   engine.SegmentID
		base uint64
	}{{sa, a.base()}, {sb, b.base()}, {engine.LocalSegment, ini.base() + 1<<19}}
	for i := range 96 {
		tg := targets[i%3]
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: ini.buf()[i*blk : (i+1)*blk], Target: tg.id, TargetAddr: tg.base + uint64(i*blk)})
	}
	if err := ini.e.Transfer(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	mems := [][]byte{a.buf(), b.buf(), ini.buf()[1<<19:]}
	for i := range 96 {
		if !bytes.Equal(mems[i%3][i*blk:(i+1)*blk], ini.buf()[i*blk:(i+1)*blk]) {
			t.Fatalf("request %d (target %d) differs", i, i%3)
		}
	}
}

// An unlisted engine publishes nothing, through any registration or
// install, yet opens and transfers to segments of the store.
func TestUnlisted(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tgt := newNode(t, st, "target", 1<<20, tcp.Config{})
	n := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st, Unlisted: true, MetadataTimeout: 2 * time.Second}, 1<<20, tcp.New(tcp.Config{}))
	ctx := ctxT(t, 10*time.Second)
	if d, err := st.Get(ctx, "initiator"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("an unlisted engine's descriptor is in the store: %+v, %v", d, err)
	}
	if d := n.Engine.LocalDescriptor(); len(d.Buffers) != 1 {
		t.Fatalf("local descriptor %+v: want its buffer, kept locally", d)
	}
	seg, err := n.Engine.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, n.Mem.Bytes()[:4096])
	if err := n.Engine.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: n.Mem.Bytes()[:4096], Target: seg, TargetAddr: tgt.base()}}); err != nil {
		t.Fatal(err)
	}
	if sum(tgt.buf()[:4096]) != sum(n.Mem.Bytes()[:4096]) {
		t.Fatal("data differs")
	}
	if err := n.Engine.Close(); err != nil {
		t.Fatal(err)
	}
}

// Close closes the transports at once: with three that each wait out
// their peers for a second, it takes about one second, not three.
func TestCloseTransportsAtOnce(t *testing.T) {
	e, err := engine.New(engine.Config{Name: "closing"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if err := e.Install(&fake{name: n, closeWait: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("Close took %v with three transports each closing in 1 s", d)
	}
}
