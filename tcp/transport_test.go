package tcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// rawConn is a hand-driven initiator connection to a target's listener.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, n *node, epoch uint64, hello bool) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", n.tr.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := &rawConn{t: t, c: c, br: bufio.NewReader(c)}
	if hello {
		// The raw client holds the target's secret (if any).
		if err := dialHandshake(c, n.tr.cfg.Auth, auth.Party{Name: "raw", Epoch: 1}, auth.Party{Name: n.e.Name(), Epoch: epoch}); err != nil {
			t.Fatalf("handshake: %v", err)
		}
	}
	return r
}

func (r *rawConn) send(h header, payload []byte) {
	r.sendRaw(h, payload, nil)
}

func (r *rawConn) sendRaw(h header, payload []byte, mut func([]byte)) {
	r.t.Helper()
	var b [headerLen]byte
	h.encode(b[:])
	if mut != nil {
		mut(b[:])
	}
	if _, err := r.c.Write(append(b[:], payload...)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawConn) reply() header {
	r.t.Helper()
	var b [headerLen]byte
	if _, err := io.ReadFull(r.br, b[:]); err != nil {
		r.t.Fatalf("reading reply: %v", err)
	}
	h, err := decodeHeader(b[:])
	if err != nil {
		r.t.Fatal(err)
	}
	return h
}

// closed asserts the target dropped the connection.
func (r *rawConn) closed() {
	r.t.Helper()
	var b [1]byte
	if _, err := io.ReadFull(r.br, b[:]); err == nil {
		r.t.Fatal("connection still open")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		r.t.Fatal("connection still open (timed out waiting for close)")
	}
}

// TestHostileFrames sends crafted frames straight to a target's listener:
// ranges outside registered memory get an error status and write nothing,
// the connection stays in sync after a refused WRITE's payload, and frames
// whose framing cannot be trusted close the connection, writing nothing.
func TestHostileFrames(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("auth=", on), func(t *testing.T) {
			var s *auth.Secret
			if on {
				s = testSecret(t)
			}
			testHostileFrames(t, s)
		})
	}
}

func testHostileFrames(t *testing.T, s *auth.Secret) {
	const size = 1 << 16
	n := newNode(t, nil, "victim", size, Config{Auth: s})
	base := n.base()
	fill(t, n.buf())
	want := bytes.Clone(n.buf())
	junk := bytes.Repeat([]byte{0xAA}, 8192)
	unchanged := func(what string) {
		t.Helper()
		if !bytes.Equal(n.buf(), want) {
			t.Fatalf("%s: registered memory changed", what)
		}
	}

	refused := []struct {
		name       string
		addr, size uint64
	}{
		{"past end", base + size - 100, 200},
		{"before start", base - 8, 16},
		{"nowhere", 4096, 4096},
		{"wraps", ^uint64(0) - 10, 100},
		{"zero length", base, 0},
	}
	r := dialRaw(t, n, n.e.Epoch(), true)
	for i, c := range refused {
		r.send(header{op: opWrite, id: uint64(i), addr: c.addr, length: c.size}, junk[:c.size])
		if h := r.reply(); h.op != opWrite|opReply || h.id != uint64(i) || h.status != statusOutOfRange || h.length != 0 {
			t.Fatalf("WRITE %s: reply %v", c.name, h)
		}
		unchanged("WRITE " + c.name)
		r.send(header{op: opRead, id: uint64(i), addr: c.addr, length: c.size}, nil)
		if h := r.reply(); h.op != opRead|opReply || h.status != statusOutOfRange || h.length != 0 {
			t.Fatalf("READ %s: reply %v", c.name, h)
		}
	}
	// Still in sync: a valid WRITE and READ on the same connection work.
	r.send(header{op: opWrite, id: 100, addr: base + 8, length: 8}, []byte("in-range"))
	if h := r.reply(); h.status != statusOK || h.id != 100 {
		t.Fatalf("valid WRITE after refusals: %v", h)
	}
	copy(want[8:], "in-range")
	unchanged("valid WRITE")
	r.send(header{op: opRead, id: 101, addr: base, length: 16}, nil)
	if h := r.reply(); h.status != statusOK || h.length != 16 {
		t.Fatalf("valid READ: %v", h)
	}
	got := make([]byte, 16)
	io.ReadFull(r.br, got)
	if !bytes.Equal(got, want[:16]) {
		t.Fatal("READ returned wrong bytes")
	}

	// Untrustworthy framing: the connection is dropped, nothing written.
	inRange := header{op: opWrite, id: 1, addr: base, length: 64}
	fatal := []struct {
		name  string
		hello bool
		epoch uint64
		mut   func([]byte)
	}{
		{"bad magic", true, n.e.Epoch(), func(b []byte) { b[0] = 'X' }},
		{"future version", true, n.e.Epoch(), func(b []byte) { b[2] = 9 }},
		{"unknown op", true, n.e.Epoch(), func(b []byte) { b[3] = 0x7f }},
		{"reply from initiator", true, n.e.Epoch(), func(b []byte) { b[3] = byte(opWrite | opReply) }},
		{"flags", true, n.e.Epoch(), func(b []byte) { b[6] = 4 }},
		{"oversized", true, n.e.Epoch(), func(b []byte) { b[24+7] = 1 }},
		{"no hello", false, 0, nil},
		{"second hello", true, n.e.Epoch(), func(b []byte) { copy(b, "TETH\x01\x01") }},
	}
	for _, c := range fatal {
		r := dialRaw(t, n, c.epoch, c.hello)
		r.sendRaw(inRange, junk[:64], c.mut)
		r.closed()
		unchanged(c.name)
	}
	// A hello for another incarnation is refused, and what follows it
	// is never applied.
	r = dialRaw(t, n, 0, false)
	hello := auth.Hello{Proto: "tcp", Initiator: auth.Party{Name: "raw", Epoch: 1}, Target: auth.Party{Name: n.e.Name(), Epoch: n.e.Epoch() + 1}}
	if _, err := r.c.Write(append(handshakeProto.Append(nil, hsHello, 0, auth.AppendHello(nil, hello)), frame(inRange, junk[:64])...)); err != nil {
		t.Fatal(err)
	}
	var hdr [wire.HeaderLen]byte
	h, p, err := handshakeProto.Read(r.br, hdr[:], nil)
	if err != nil || h.Type != hsChallenge || p[0] != 0 || uint16(p[1]) != control.StatusStale {
		t.Fatalf("stale hello: %v %x %v", h, p, err)
	}
	if ch, _, err := auth.ParseChallenge(p[2:]); err != nil || ch.Epoch != n.e.Epoch() {
		t.Fatalf("stale hello's challenge: %+v %v", ch, err)
	}
	r.closed()
	unchanged("stale epoch")
}

// TestReconnect: when the target drops every connection, the next
// submissions redial, and requests caught on a dead connection are retried
// by the engine: every round succeeds.
func TestReconnect(t *testing.T) {
	p := newPair(t, 1<<20, 1<<20, Config{Lanes: 2})
	ctx := ctxT(t, 10*time.Second)
	fill(t, p.ini.buf())
	b, _ := p.ini.e.AllocateBatch(64)
	reqs := []engine.Request{{Op: engine.Write, Local: p.ini.buf()[:4096], Target: p.seg, TargetAddr: p.tgt.base()}}
	for round := range 20 {
		if err := p.ini.e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		if err := p.ini.e.Wait(ctx, b); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, c := range p.tgt.tr.gate.Conns() {
			c.Close()
		}
		// Requests written on a connection that the target has already
		// dropped fail with ErrConnection (engine.ErrTransient); the
		// engine tries them again on a fresh connection.
	}
	p.ini.e.FreeBatch(b)
	if !bytes.Equal(p.tgt.buf()[:4096], p.ini.buf()[:4096]) {
		t.Fatal("data differs")
	}
}

// TestDialFailure: a segment whose endpoint refuses connections fails at
// OpenSegment, clearly.
func TestDialFailure(t *testing.T) {
	p := newPair(t, 4096, 4096, Config{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	d := &segment.Descriptor{Name: "dead", Epoch: 1, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: dead}},
		Buffers:   []segment.Buffer{{Addr: 4096, Length: 4096}}}
	p.st.Publish(context.Background(), d)
	_, err := p.ini.e.OpenSegment(ctxT(t, 5*time.Second), "dead", nil)
	if !errors.Is(err, ErrConnection) {
		t.Fatalf("open unreachable segment: %v", err)
	}
}

// TestSteadyStateAllocs: allocate, submit 128 tasks, wait and free a batch
// over loopback TCP without a single allocation anywhere in the process
// (initiator, lanes, receiver).
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const batch = 128
	for _, c := range []struct {
		op    engine.Op
		size  int
		slice uint64 // 0: the default; smaller cuts each task into many slices
	}{{engine.Write, 4096, 0}, {engine.Read, 4096, 0}, {engine.Write, 64 << 10, 0}, {engine.Read, 1 << 20, 0},
		// 16 slices per task, 2048 per batch: several chunks of the
		// batch's slice arena and deep lane rings.
		{engine.Write, 1 << 20, 64 << 10}, {engine.Read, 1 << 20, 64 << 10}} {
		t.Run(fmt.Sprintf("%v/%d/slice%d", c.op, c.size, c.slice), func(t *testing.T) {
			p := newPair(t, batch*c.size, batch*c.size, Config{SliceSize: c.slice})
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: c.op, Local: p.ini.buf()[i*c.size : (i+1)*c.size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*c.size)}
			}
			ctx := context.Background()
			var failed error
			run := func() {
				b, err := p.ini.e.AllocateBatch(batch)
				if err == nil {
					err = p.ini.e.Submit(b, reqs)
				}
				if err == nil {
					err = p.ini.e.Wait(ctx, b)
				}
				if err == nil {
					err = p.ini.e.FreeBatch(b)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			for range 10 {
				run() // warm up: buffers, rings, pools, connections
			}
			allocs := enginetest.AllocsPerRun(10, run)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per batch of %d", allocs, batch)
			}
		})
	}
}

const childEnv = "TE_TCP_TEST_CHILD_TARGET"

// runChildTarget is the body of the child process of TestPeerKilled: a
// target engine that prints its descriptor and serves until killed.
func runChildTarget() {
	e, err := engine.New(engine.Config{Name: "child"})
	if err == nil {
		err = e.Install(New(Config{}))
	}
	var mem *engine.Memory
	if err == nil {
		mem, err = engine.Alloc(64 << 20)
	}
	if err == nil {
		err = e.RegisterLocalMemory(mem.Bytes(), "")
	}
	var b []byte
	if err == nil {
		b, err = segment.Marshal(e.LocalDescriptor())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s\n", b)
	go func() {
		for range e.Notifications() {
		}
	}()
	io.Copy(io.Discard, os.Stdin) // serve until killed or stdin closes
	os.Exit(0)
}

// TestPeerKilled kills a target process (SIGKILL) in the middle of a large
// batch: Wait returns within a bounded time, finished tasks are COMPLETED
// with all their bytes, the rest FAILED with ErrConnection, and a later
// submission fails fast instead of hanging.
func TestPeerKilled(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	d, err := segment.Unmarshal([]byte(strings.TrimSpace(line)))
	if err != nil {
		t.Fatal(err)
	}
	st := enginetest.NewMemStore()
	defer st.Close()
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, st, "ini", 64<<20, Config{IOTimeout: 2 * time.Second})
	e2 := n.e
	seg, err := e2.OpenSegment(ctxT(t, 5*time.Second), "child", nil)
	if err != nil {
		t.Fatal(err)
	}
	const tasks, blk = 2048, 1 << 20
	reqs := make([]engine.Request, tasks)
	tb := d.Buffers[0].Addr
	for i := range reqs {
		off := (i % 64) * blk
		reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: n.buf()[off : off+blk], Target: seg, TargetAddr: tb + uint64(off)}
	}
	b, _ := e2.AllocateBatch(tasks)
	if err := e2.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	for {
		bs, _ := e2.BatchStatus(b)
		if bs.Transferred > 0 || bs.State != engine.StatePending {
			break
		}
		time.Sleep(time.Millisecond)
	}
	killed := time.Now()
	cmd.Process.Kill()
	err = e2.Wait(ctxT(t, 30*time.Second), b)
	t.Logf("Wait returned %v after the kill: %v", time.Since(killed), err)
	if !errors.Is(err, ErrConnection) {
		t.Fatalf("want ErrConnection, got %v", err)
	}
	var done, failed int
	for i := range tasks {
		st, _ := e2.Status(b, i)
		switch st.State {
		case engine.StateCompleted:
			done++
			if st.Transferred != blk {
				t.Fatalf("task %d completed with %d bytes", i, st.Transferred)
			}
		case engine.StateFailed:
			failed++
		default:
			t.Fatalf("task %d still %v", i, st.State)
		}
	}
	t.Logf("%d completed, %d failed", done, failed)
	if err := e2.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
	b, _ = e2.AllocateBatch(1)
	defer e2.FreeBatch(b)
	if err := e2.Submit(b, reqs[:1]); err != nil {
		t.Fatal(err)
	}
	if err := e2.Wait(ctxT(t, 10*time.Second), b); !errors.Is(err, ErrConnection) {
		t.Fatalf("submit to a dead peer: %v", err)
	}
}

// TestStaleEpoch: a descriptor whose epoch is not the target's (the target
// restarted on the same address and the store is behind) is refused at
// the handshake with engine.ErrPeerReset, every time; nothing is written.
func TestStaleEpoch(t *testing.T) {
	p := newPair(t, 1<<16, 1<<16, Config{})
	real, _ := p.ini.e.SegmentDescriptor(p.seg)
	stale := real.Clone()
	stale.Name = "stale"
	stale.Epoch++
	if err := p.st.Publish(context.Background(), stale); err != nil {
		t.Fatal(err)
	}
	fill(t, p.tgt.buf())
	want := bytes.Clone(p.tgt.buf())
	for range 3 {
		_, err := p.ini.e.OpenSegment(ctxT(t, 5*time.Second), "stale", nil)
		if !errors.Is(err, engine.ErrPeerReset) {
			t.Fatalf("open a stale incarnation: %v", err)
		}
	}
	if !bytes.Equal(p.tgt.buf(), want) {
		t.Fatal("a stale incarnation's transfer wrote memory")
	}
}

// TestInitiatorStopsReading: an initiator that floods READs and never
// reads the replies cannot keep the target's memory pinned: the receiver's
// write deadline (IOTimeout) drops it, and the memory can be unregistered.
func TestInitiatorStopsReading(t *testing.T) {
	const size = 1 << 20
	// Long enough that the region is surely still pinned when checked
	// on a loaded machine.
	n := newNode(t, nil, "victim", size, Config{IOTimeout: 3 * time.Second})
	var burst []byte
	for i := range 64 {
		b := make([]byte, headerLen)
		(&header{op: opRead, id: uint64(i), addr: n.base(), length: size}).encode(b)
		burst = append(burst, b...)
	}
	for attempt := 0; ; attempt++ {
		r := dialRaw(t, n, n.e.Epoch(), true)
		if _, err := r.c.Write(burst); err != nil {
			t.Fatal(err)
		}
		// The receiver serves what it can, then blocks writing with READ
		// payloads pinned.
		time.Sleep(100 * time.Millisecond << attempt)
		err := n.e.UnregisterLocalMemory(n.buf())
		if errors.Is(err, engine.ErrMemoryBusy) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if attempt == 6 {
			t.Fatal("the receiver never pinned the region")
		}
		// The receiver had not read the burst yet: start over.
		r.c.Close()
		if err := n.e.RegisterLocalMemory(n.buf(), ""); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for {
		err := n.e.UnregisterLocalMemory(n.buf())
		if err == nil {
			break
		}
		if !errors.Is(err, engine.ErrMemoryBusy) || time.Now().After(deadline) {
			t.Fatalf("unregister while a reader stalls: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("released %v after the first refusal", time.Since(start))
}

// TestInitiatorStallsMidPayload: a WRITE whose payload stops half way
// cannot keep the target's memory pinned beyond IOTimeout.
func TestInitiatorStallsMidPayload(t *testing.T) {
	const size = 1 << 20
	// Long enough that the region is surely still pinned when checked
	// on a loaded machine.
	n := newNode(t, nil, "victim", size, Config{IOTimeout: 3 * time.Second})
	var r *rawConn
	for attempt := 0; ; attempt++ {
		r = dialRaw(t, n, n.e.Epoch(), true)
		r.send(header{op: opWrite, id: 1, addr: n.base(), length: size}, make([]byte, size/2))
		time.Sleep(50 * time.Millisecond << attempt)
		err := n.e.UnregisterLocalMemory(n.buf())
		if errors.Is(err, engine.ErrMemoryBusy) {
			break
		}
		if err != nil {
			t.Fatalf("unregister during the payload: %v", err)
		}
		if attempt == 6 {
			t.Fatal("the receiver never pinned the region")
		}
		// The receiver had not read the header yet: start over.
		r.c.Close()
		if err := n.e.RegisterLocalMemory(n.buf(), ""); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for n.e.UnregisterLocalMemory(n.buf()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("region still pinned by a stalled sender")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.c.SetDeadline(time.Now().Add(30 * time.Second))
	r.closed()
}

// TestConnectionBounds: at MaxConns a new connection takes the slot of
// the one that has waited longest (idle after its handshake, or silent
// before it); a connection busy with a request keeps its slot; a silent
// connection is dropped after IOTimeout; MaxConnsPerSource bounds one
// address the same way.
func TestConnectionBounds(t *testing.T) {
	n := newNode(t, nil, "bounded", 1<<16, Config{MaxConns: 2, IOTimeout: 2 * time.Second})
	a := dialRaw(t, n, n.e.Epoch(), true)
	time.Sleep(10 * time.Millisecond) // a has likely waited longer than b
	b := dialRaw(t, n, n.e.Epoch(), true)
	// A third connection evicts one of the two idle ones (the one that
	// waited longest; which that is depends on when each server
	// goroutine started to wait) and is served.
	c := dialRaw(t, n, n.e.Epoch(), true)
	if !probe(t, n, c) {
		t.Fatal("the new connection was not served")
	}
	if pa, pb := probe(t, n, a), probe(t, n, b); pa == pb {
		t.Fatalf("served: a %v, b %v; want exactly one evicted", pa, pb)
	}
	// A silent connection (no handshake) is dropped after IOTimeout.
	silent := dialRaw(t, n, 0, false)
	silent.c.SetDeadline(time.Now().Add(30 * time.Second))
	start := time.Now()
	silent.closed()
	t.Logf("silent connection closed after %v", time.Since(start))
}

// probe reports whether r is still served: a READ gets its reply (true)
// or the connection turns out closed (false).
func probe(t *testing.T, n *node, r *rawConn) bool {
	t.Helper()
	r.c.SetDeadline(time.Now().Add(30 * time.Second))
	var b [headerLen]byte
	(&header{op: opRead, id: 1, addr: n.base(), length: 8}).encode(b[:])
	if _, err := r.c.Write(b[:]); err != nil {
		return false
	}
	if _, err := io.ReadFull(r.br, b[:]); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("neither served nor closed")
		}
		return false
	}
	h, err := decodeHeader(b[:])
	if err != nil || h.status != statusOK || h.length != 8 {
		t.Fatalf("reply %v, %v", h, err)
	}
	if _, err := io.ReadFull(r.br, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	return true
}

// TestPerSourceLimit: one address holds at most MaxConnsPerSource
// connections; beyond, one of its own waiting ones makes room.
func TestPerSourceLimit(t *testing.T) {
	n := newNode(t, nil, "persource", 1<<16, Config{MaxConns: 100, MaxConnsPerSource: 3})
	var rs []*rawConn
	for range 4 {
		rs = append(rs, dialRaw(t, n, n.e.Epoch(), true))
		time.Sleep(5 * time.Millisecond)
	}
	if !probe(t, n, rs[3]) {
		t.Fatal("the newest connection was not served")
	}
	served := 0
	for _, r := range rs[:3] {
		if probe(t, n, r) {
			served++
		}
	}
	got := n.tr.gate.Count(netip.MustParseAddr("127.0.0.1"))
	if served != 2 || got > 3 {
		t.Fatalf("%d of the first three still served, %d connections from one source", served, got)
	}
}

// TestConcurrentClose: a Close that finds another in progress returns
// only once that one is done: every slice in flight has been completed.
func TestConcurrentClose(t *testing.T) {
	for i := range 20 {
		st := enginetest.NewMemStore()
		buf := fakeTarget(t, st, "hole", func(header) []byte { return nil }) // never answers
		n := newNode(t, st, "ini", 1<<16, Config{IOTimeout: time.Minute})
		seg, err := n.e.OpenSegment(ctxT(t, 10*time.Second), "hole", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := n.e.AllocateBatch(16)
		reqs := make([]engine.Request, 16)
		for j := range reqs {
			reqs[j] = engine.Request{Op: engine.Read, Local: n.buf()[j*64 : (j+1)*64], Target: seg, TargetAddr: buf.Addr}
		}
		if err := n.e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var early atomic.Int32
		for range 2 {
			wg.Go(func() {
				n.tr.Driver().Close()
				if bs, _ := n.e.BatchStatus(b); bs.State == engine.StatePending {
					early.Add(1)
				}
			})
		}
		wg.Wait()
		if early.Load() > 0 {
			t.Fatalf("round %d: Close returned with slices in flight", i)
		}
		st.Close()
	}
}

// TestConnectBeforeInstall: Connect on a transport never installed fails
// with an error, even when the peer's port accepts, and leaves no peer.
func TestConnectBeforeInstall(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tr := New(Config{})
	d := &segment.Descriptor{Name: "peer", Epoch: 1, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}}}
	p, err := tr.Driver().Connect(ctxT(t, 10*time.Second), d)
	if err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("Connect before Install: %v, %v; want an error saying it is not installed", p, err)
	}
	if err := tr.Driver().Close(); err != nil {
		t.Fatal(err)
	}
}

// vecFrame encodes a vector request: header, entries, payload.
func vecFrame(h header, ents [][2]uint64, payload []byte) []byte {
	b := frame(h, nil)
	for _, e := range ents {
		var eb [entryLen]byte
		putEntry(eb[:], e[0], e[1])
		b = append(b, eb[:]...)
	}
	return append(b, payload...)
}

// TestVectorServe: the target applies a WRITEV entry by entry (a refused
// entry's payload is read and dropped, the others land), answers with
// the entries' statuses, serves a READV's accepted entries back to back,
// and closes a connection whose vector does not add up; a version-2
// frame still gets a version-2 reply.
func TestVectorServe(t *testing.T) {
	n := newNode(t, nil, "tgt", 1<<16, Config{})
	base := n.base()
	clear(n.buf())
	r := dialRaw(t, n, n.e.Epoch(), true)
	ents := [][2]uint64{{base, 4}, {8, 3}, {base + 100, 2}} // the second is out of range
	if _, err := r.c.Write(vecFrame(header{op: opWriteV, id: 7, addr: 3, length: 9}, ents, []byte("abcdXYZef"))); err != nil {
		t.Fatal(err)
	}
	h := r.reply()
	var st [3]byte
	if _, err := io.ReadFull(r.br, st[:]); err != nil {
		t.Fatal(err)
	}
	if h.op != opWriteV|opReply || h.id != 7 || h.addr != 3 || h.status != statusVec || h.length != 0 ||
		st != [3]byte{0, byte(statusOutOfRange), 0} {
		t.Fatalf("WRITEV reply %v, statuses %v", h, st)
	}
	if got := string(n.buf()[:4]) + string(n.buf()[100:102]); got != "abcdef" {
		t.Fatalf("memory holds %q", got)
	}
	ents = [][2]uint64{{base + 100, 2}, {1 << 60, 5}, {base, 4}}
	if _, err := r.c.Write(vecFrame(header{op: opReadV, id: 10, addr: 3, length: 11}, ents, nil)); err != nil {
		t.Fatal(err)
	}
	h = r.reply()
	if _, err := io.ReadFull(r.br, st[:]); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, h.length)
	if _, err := io.ReadFull(r.br, data); err != nil {
		t.Fatal(err)
	}
	if h.op != opReadV|opReply || h.id != 10 || h.status != statusVec || st != [3]byte{0, byte(statusOutOfRange), 0} || string(data) != "efabcd" {
		t.Fatalf("READV reply %v, statuses %v, data %q", h, st, data)
	}
	// All accepted: no statuses.
	if _, err := r.c.Write(vecFrame(header{op: opReadV, id: 13, addr: 2, length: 6}, [][2]uint64{{base, 2}, {base + 100, 4}}, nil)); err != nil {
		t.Fatal(err)
	}
	h = r.reply()
	data = make([]byte, h.length)
	if _, err := io.ReadFull(r.br, data); err != nil {
		t.Fatal(err)
	}
	if h.status != statusOK || string(data) != "abef\x00\x00" {
		t.Fatalf("READV reply %v, data %q", h, data)
	}
	// Version 2 in, version 2 out.
	r.send(header{legacy: true, op: opRead, id: 15, addr: base, length: 2}, nil)
	if h = r.reply(); !h.legacy || h.status != statusOK || h.length != 2 {
		t.Fatalf("version 2 reply %v", h)
	}
	io.ReadFull(r.br, data[:2])
	// Entries that do not add up to the header's length end the
	// connection.
	if _, err := r.c.Write(vecFrame(header{op: opWriteV, id: 16, addr: 2, length: 3}, [][2]uint64{{base, 2}, {base, 2}}, []byte("abcd"))); err != nil {
		t.Fatal(err)
	}
	r.closed()
}

// TestWireNegotiation: an initiator speaks version 2 frames to a target
// that advertises version 2 or none, version 3 (vectors) to one that
// advertises 3, and refuses another version saying which it speaks.
func TestWireNegotiation(t *testing.T) {
	tgt := newNode(t, nil, "tgt", 1<<16, Config{})
	ini := newNode(t, nil, "ini", 1<<16, Config{})
	desc := func(wire int) *segment.Descriptor {
		d := tgt.e.LocalDescriptor()
		for i := range d.Protocols {
			if d.Protocols[i].Name == segment.ProtoTCP {
				d.Protocols[i].TCP = &segment.TCP{Wire: wire}
			}
		}
		return d
	}
	for _, c := range []struct {
		wire   int
		legacy bool
	}{{0, true}, {wireLegacy, true}, {wireVersion, false}} {
		dp, err := ini.tr.connect(context.Background(), desc(c.wire))
		if err != nil {
			t.Fatalf("wire %d: %v", c.wire, err)
		}
		p := dp.(*peer)
		if p.legacy != c.legacy {
			t.Errorf("wire %d: legacy %v", c.wire, p.legacy)
		}
		p.Close()
	}
	_, err := ini.tr.connect(context.Background(), desc(4))
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "speaks tcp wire version 4, this process 2 or 3") {
		t.Fatalf("wire 4: %v", err)
	}
}

// TestReconnectVectors: connections dropped while vector replies (READs of
// 64 small slices) are read: the dead connection's reader, still inside a
// reply, and the next connection's reader each complete their own
// slices: a round either fails as a lost connection (the engine's
// retries ran out) or brings every byte.
func TestReconnectVectors(t *testing.T) {
	p := newPair(t, 1<<20, 1<<20, Config{Lanes: 2})
	ctx := ctxT(t, 60*time.Second)
	fill(t, p.tgt.buf())
	const n, size = 64, 4096
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Read, Local: p.ini.buf()[i*size : (i+1)*size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*size)}
	}
	stop := make(chan struct{})
	dropped := make(chan int)
	go func() {
		k := 0
		defer func() { dropped <- k }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(k%7+1) * 100 * time.Microsecond):
			}
			for _, c := range p.tgt.tr.gate.Conns() {
				c.Close()
			}
			k++
		}
	}()
	ok := 0
	for round := range 300 {
		clear(p.ini.buf()[:n*size])
		b, _ := p.ini.e.AllocateBatch(n)
		err := p.ini.e.Submit(b, reqs)
		if err == nil {
			err = p.ini.e.Wait(ctx, b)
		}
		p.ini.e.FreeBatch(b)
		switch {
		case errors.Is(err, ErrConnection):
		case err != nil:
			t.Fatalf("round %d: %v", round, err)
		case !bytes.Equal(p.ini.buf()[:n*size], p.tgt.buf()[:n*size]):
			t.Fatalf("round %d: data differs", round)
		default:
			ok++
		}
	}
	close(stop)
	if k := <-dropped; k == 0 || ok == 0 {
		t.Fatalf("%d connections dropped, %d rounds complete: the test proved nothing", k, ok)
	}
}
