// Package lifecycle calls the public lifecycle methods of every transport
// (tcp, shm, rdma, Mooncake's tcp), store (p2p, consul, Mooncake's
// P2PHANDSHAKE and HTTP metadata) and engine in orders chosen by the
// fuzzer, on a host without an RDMA device, a Consul agent, a metadata
// server or any peer but a second engine in the same process. Every call
// may fail; none may panic or hang, and whatever is left open at the end is
// closed without leaking a goroutine or a file descriptor.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/mctcp"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/segment/stores"
	"github.com/rdmago/te/shm"
	"github.com/rdmago/te/tcp"
)

// The operations a program is given.
const (
	opNewStore = iota
	opCloseStore
	opStoreCall
	opNewEngine
	opCloseEngine
	opNewTransport
	opInstall
	opUninstall
	opCloseTransport
	opInstallDirect
	opDescribeDirect
	opConnectDirect
	opAlloc
	opCloseMemory
	opRegister
	opUnregister
	opAllocateBatch
	opSubmit
	opWaitBatch
	opFreeBatch
	opOpenSegment
	opCloseSegment
	opTransfer
	opConsul
	opOtherStore
	nOps
)

var opNames = [nOps]string{"NewStore", "CloseStore", "StoreCall", "NewEngine", "CloseEngine", "NewTransport",
	"Install", "Uninstall", "CloseTransport", "InstallDirect", "DescribeDirect", "ConnectDirect", "Alloc",
	"CloseMemory", "Register", "Unregister", "AllocateBatch", "Submit", "WaitBatch", "FreeBatch",
	"OpenSegment", "CloseSegment", "Transfer", "Consul", "OtherStore"}

// protocols are the transports every node can build, by index.
var protocols = [...]string{segment.ProtoTCP, segment.ProtoSHM, segment.ProtoRDMA, mooncake.TEProtoTCP}

const memSize = 64 << 10

// hangAfter is how long a program may run, Closes included.
const hangAfter = 20 * time.Second

// transport is one transport a program built and what it did with it.
type transport struct {
	user   engine.Transport // what New returned
	tr     driver.Transport // its Driver
	closed bool             // closed directly (Close)
	// installed: Install succeeded (into the engine or directly).
	installed bool
}

// node is one would-be process: a store, an engine, transports, memory,
// batches and opened segments. Any of them may be missing or closed.
type node struct {
	store      *p2p.Store
	storeDone  bool
	eng        *engine.Engine
	engDone    bool
	trs        [len(protocols)]*transport
	mems       []*engine.Memory
	batches    []engine.BatchID
	segs       []engine.SegmentID
	every      []func() error // every Close to call at the end
	registered map[*engine.Memory]bool
}

// world is two nodes: A opens B's segment through its store.
type world struct {
	t     *testing.T
	nodes [2]*node
	logMu sync.Mutex // the hang watchdog reads log
	log   []string
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().String()
	ln.Close()
	return a
}

// fakeHost is a Host for a transport installed without an engine.
type fakeHost struct{}

func (fakeHost) LocalName() string    { return "lifecycle" }
func (fakeHost) Epoch() uint64        { return 1 }
func (fakeHost) Inbox() driver.Inbox  { return nil }
func (fakeHost) Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }
func (fakeHost) AcquireLocal(uint64, uint64) ([]byte, driver.Region, error) {
	return nil, nil, engine.ErrOutOfRange
}

func newTransport(i int) engine.Transport {
	switch protocols[i] {
	case segment.ProtoTCP:
		return tcp.New(tcp.Config{DialTimeout: 200 * time.Millisecond, IOTimeout: time.Second})
	case segment.ProtoSHM:
		return shm.New(shm.Config{IOTimeout: time.Second, Copiers: 1})
	case mooncake.TEProtoTCP:
		return mctcp.New(mctcp.Config{DialTimeout: 200 * time.Millisecond, IOTimeout: time.Second})
	default:
		return rdma.New(rdma.Config{})
	}
}

func (w *world) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 300*time.Millisecond)
}

// step runs one operation on node n.
func (w *world) step(op int, n, other *node, a, a2 int) {
	t := w.t
	switch op {
	case opNewStore:
		if n.store != nil && !n.storeDone {
			return
		}
		ctx, cancel := w.ctx()
		defer cancel()
		s, err := p2p.New(ctx, p2p.Options{Timeout: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Logf("p2p.New: %v", err)
			return
		}
		n.store, n.storeDone = s, false
		n.every = append(n.every, s.Close)
	case opCloseStore:
		if n.store == nil {
			return
		}
		n.store.Close()
		n.storeDone = true
	case opStoreCall:
		if n.store == nil {
			return
		}
		storeCall(t, n.store, n.storeDone, a)
	case opNewEngine:
		if n.eng != nil && !n.engDone {
			return
		}
		cfg := engine.Config{MetadataTimeout: 300 * time.Millisecond}
		if n.store != nil && a&1 == 0 {
			cfg.Store, cfg.Name = n.store, n.store.Name()
		}
		e, err := engine.New(cfg)
		if err != nil {
			if n.store != nil && !n.storeDone {
				t.Errorf("engine.New with an open store: %v", err)
			}
			return
		}
		n.eng, n.engDone = e, false
		n.every = append(n.every, e.Close)
		n.batches, n.segs = nil, nil
		clear(n.registered)
	case opCloseEngine:
		if n.eng == nil {
			return
		}
		if err := n.eng.Close(); err != nil {
			t.Logf("engine.Close: %v", err)
		}
		n.engDone = true
		n.checkClosedEngine(t)
	case opNewTransport:
		i := a % len(protocols)
		tr := newTransport(i)
		n.trs[i] = &transport{user: tr, tr: tr.Driver()}
		n.every = append(n.every, tr.Driver().Close)
	case opInstall:
		tr := n.tr(a)
		if tr == nil || n.eng == nil {
			return
		}
		err := n.eng.Install(tr.user)
		if err == nil {
			if tr.closed {
				t.Errorf("engine.Install of a closed %s transport succeeded", tr.tr.Name())
			}
			if n.engDone {
				t.Errorf("Install into a closed engine succeeded")
			}
			tr.installed = true
		} else if tr.closed && !errors.Is(err, engine.ErrClosed) {
			t.Errorf("engine.Install of a closed %s transport: %v, want an error wrapping engine.ErrClosed", tr.tr.Name(), err)
		}
	case opUninstall:
		if n.eng == nil {
			return
		}
		n.eng.Uninstall(protocols[a%len(protocols)])
	case opCloseTransport:
		tr := n.tr(a)
		if tr == nil {
			return
		}
		if err := tr.tr.Close(); err != nil {
			t.Logf("%s Close: %v", tr.tr.Name(), err)
		}
		tr.closed = true
	case opInstallDirect:
		tr := n.tr(a)
		if tr == nil {
			return
		}
		err := tr.tr.Install(fakeHost{})
		switch {
		case err == nil && tr.closed:
			t.Errorf("%s: Install after Close succeeded", tr.tr.Name())
		case err == nil && tr.installed:
			t.Errorf("%s: second Install succeeded", tr.tr.Name())
		case err == nil:
			tr.installed = true
		case tr.closed && !errors.Is(err, engine.ErrClosed):
			t.Errorf("%s: Install after Close: %v, want an error wrapping engine.ErrClosed", tr.tr.Name(), err)
		}
	case opDescribeDirect:
		tr := n.tr(a)
		if tr == nil {
			return
		}
		d := &segment.Descriptor{Name: "x", Buffers: []segment.Buffer{}}
		tr.tr.Describe(d)
	case opConnectDirect:
		tr := n.tr(a)
		if tr == nil {
			return
		}
		d := other.descriptor()
		if d == nil {
			d = &segment.Descriptor{Name: "nobody", Epoch: 1, Version: 1,
				Protocols: []segment.Protocol{{Name: tr.tr.Name(), Endpoint: closedPort(t)}}}
			if tr.tr.Name() == segment.ProtoRDMA {
				// A well-formed rdma part, so Connect gets past the
				// descriptor's checks (no host here has the device).
				d.Buffers = []segment.Buffer{{Addr: 1 << 20, Length: memSize}}
				d.Protocols[0].RDMA = &segment.RDMA{Devices: []segment.Device{{Name: "rxe0"}}, RKeys: [][]uint32{{7}}}
			}
		}
		ctx, cancel := w.ctx()
		defer cancel()
		pe, err := tr.tr.Connect(ctx, d)
		if err == nil {
			if tr.closed {
				t.Errorf("%s: Connect after Close succeeded", tr.tr.Name())
			}
			pe.Close()
			pe.Close()
		}
	case opAlloc:
		if len(n.mems) >= 4 {
			return
		}
		alloc := engine.Alloc
		if a&1 == 1 {
			alloc = engine.AllocShared
		}
		m, err := alloc(memSize)
		if err != nil {
			t.Fatalf("alloc: %v", err)
		}
		n.mems = append(n.mems, m)
		n.every = append(n.every, m.Close)
	case opCloseMemory:
		if m := n.mem(a); m != nil {
			if err := m.Close(); err != nil && !errors.Is(err, engine.ErrMemoryBusy) {
				t.Errorf("Memory.Close: %v", err)
			}
			if m.Bytes() == nil {
				delete(n.registered, m)
			}
		}
	case opRegister:
		m := n.mem(a)
		if m == nil || n.eng == nil {
			return
		}
		b := m.Bytes()
		if b == nil {
			b = make([]byte, 1) // closed memory: heap bytes, registration must still not crash
			if n.eng.RegisterLocalMemory(b, "cpu") == nil {
				n.eng.UnregisterLocalMemory(b)
			}
			return
		}
		err := n.eng.RegisterLocalMemory(b, "cpu:0")
		if err == nil {
			if n.engDone {
				t.Errorf("RegisterLocalMemory on a closed engine succeeded")
			}
			n.registered[m] = true
		}
	case opUnregister:
		m := n.mem(a)
		if m == nil || n.eng == nil {
			return
		}
		if b := m.Bytes(); b != nil {
			err := n.eng.UnregisterLocalMemory(b)
			switch {
			case err == nil:
				delete(n.registered, m)
			case n.registered[m] && !n.engDone && !errors.Is(err, engine.ErrMemoryBusy):
				// Only a transfer in flight may keep registered
				// memory from being unregistered.
				t.Errorf("UnregisterLocalMemory of registered memory: %v", err)
			}
		}
	case opAllocateBatch:
		if n.eng == nil || len(n.batches) >= 4 {
			return
		}
		id, err := n.eng.AllocateBatch(1 + a%8)
		if err == nil {
			n.batches = append(n.batches, id)
		} else if !n.engDone {
			t.Errorf("AllocateBatch: %v", err)
		}
	case opSubmit:
		if n.eng == nil {
			return
		}
		id := n.batch(a >> 4)
		req := n.request(other, a, a2)
		err := n.eng.Submit(id, []engine.Request{req})
		if err == nil && n.engDone {
			t.Errorf("Submit on a closed engine succeeded")
		}
	case opWaitBatch:
		if n.eng == nil {
			return
		}
		id := n.batch(a)
		ctx, cancel := w.ctx()
		defer cancel()
		n.eng.Wait(ctx, id)
		n.eng.BatchStatus(id)
		n.eng.Status(id, 0)
	case opFreeBatch:
		if n.eng == nil {
			return
		}
		n.eng.FreeBatch(n.batch(a))
	case opOpenSegment:
		if n.eng == nil {
			return
		}
		name := "127.0.0.1:1"
		if other.store != nil && a&1 == 0 {
			name = other.store.Name()
		}
		var opts *engine.OpenOptions
		if k := a2 % (len(protocols) + 1); k < len(protocols) {
			opts = &engine.OpenOptions{Transport: protocols[k]}
		}
		ctx, cancel := w.ctx()
		defer cancel()
		id, err := n.eng.OpenSegment(ctx, name, opts)
		t.Logf("OpenSegment %s %v: %v", name, opts, err)
		if err == nil {
			if n.engDone {
				t.Errorf("OpenSegment on a closed engine succeeded")
			}
			n.segs = append(n.segs, id)
		}
	case opCloseSegment:
		if n.eng == nil || len(n.segs) == 0 {
			return
		}
		n.eng.CloseSegment(n.segs[a%len(n.segs)])
	case opTransfer:
		if n.eng == nil {
			return
		}
		req := n.request(other, a, a2)
		ctx, cancel := w.ctx()
		defer cancel()
		err := n.eng.Transfer(ctx, []engine.Request{req})
		t.Logf("Transfer %v %d bytes to %d at %#x via %q: %v", req.Op, req.Length, req.Target, req.TargetAddr, req.Transport, err)
		if err == nil && n.engDone {
			t.Errorf("Transfer on a closed engine succeeded")
		}
	case opConsul:
		ctx, cancel := w.ctx()
		defer cancel()
		s, err := consul.New(ctx, consul.Config{Address: closedPort(t), RequestTimeout: 200 * time.Millisecond,
			Logf: func(string, ...any) {}})
		if err == nil {
			t.Errorf("consul.New without an agent succeeded")
			s.Close()
			return
		}
		var nilStore *consul.Store
		nilStore.Close()
		if _, err := stores.Open(ctx, "consul://"+closedPort(t)+"/te?timeout=200ms"); err == nil {
			t.Errorf("stores.Open of consul without an agent succeeded")
		}
	case opOtherStore:
		// The stores for Mooncake's metadata, by URI, without a server:
		// errors, never a panic, and Close twice.
		ctx, cancel := w.ctx()
		defer cancel()
		uri := "p2phandshake://127.0.0.1:0"
		if a&1 == 1 {
			uri = "http://" + closedPort(t) + "/metadata"
		}
		s, err := stores.Open(ctx, uri)
		if err != nil {
			return
		}
		n.every = append(n.every, s.Close)
		anyStoreCall(s, a2)
		anyStoreCall(s, a2>>3)
		s.Close()
		anyStoreCall(s, a2>>5)
	}
}

// anyStoreCall calls one method of any Store with a short deadline; only
// a panic or a hang would matter.
func anyStoreCall(s segment.Store, k int) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	switch k % 5 {
	case 0:
		s.Publish(ctx, &segment.Descriptor{Name: "127.0.0.1:1", Epoch: 7, Version: 1,
			Protocols: []segment.Protocol{}, Buffers: []segment.Buffer{}})
	case 1:
		s.Get(ctx, "127.0.0.1:1")
	case 2:
		s.List(ctx)
	case 3:
		if ch, err := s.Watch(ctx, "127.0.0.1:1"); err == nil {
			for range ch {
			}
		}
	case 4:
		s.Unpublish(ctx, "127.0.0.1:1")
	}
}

// storeCall calls one Store method.
func storeCall(t *testing.T, s *p2p.Store, closed bool, k int) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var err error
	switch k % 5 {
	case 0:
		err = s.Publish(ctx, &segment.Descriptor{Name: s.Name(), Epoch: 7, Version: uint64(k + 1),
			Protocols: []segment.Protocol{}, Buffers: []segment.Buffer{}})
	case 1:
		_, err = s.Get(ctx, s.Name())
		if errors.Is(err, segment.ErrNotFound) {
			err = nil
		}
	case 2:
		_, err = s.List(ctx)
	case 3:
		var ch <-chan *segment.Descriptor
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		ch, err = s.Watch(wctx, s.Name())
		if err == nil {
			for range ch {
			}
		}
		wcancel()
	case 4:
		err = s.Unpublish(ctx, s.Name())
		if errors.Is(err, segment.ErrNotFound) {
			err = nil
		}
	}
	if closed && err == nil {
		t.Errorf("store call %d after Close succeeded", k%5)
	}
}

func (n *node) tr(k int) *transport { return n.trs[k%len(protocols)] }

func (n *node) mem(k int) *engine.Memory {
	if len(n.mems) == 0 {
		return nil
	}
	return n.mems[k%len(n.mems)]
}

func (n *node) batch(k int) engine.BatchID {
	if len(n.batches) == 0 || k%8 == 7 {
		return engine.BatchID(k + 12345)
	}
	return n.batches[k%len(n.batches)]
}

// request builds a request within the node's memory to the local segment
// or an opened one, at an offset in its first registered buffer.
func (n *node) request(other *node, k, k2 int) engine.Request {
	op := engine.Read
	if k&1 == 1 {
		op = engine.Write
	}
	r := engine.Request{Op: op, Length: uint64(1 + k*97%4096)}
	if m := n.mem(k >> 1); m != nil {
		if b := m.Bytes(); b != nil {
			r.Local = b[:r.Length]
		}
	}
	if r.Local == nil {
		r.LocalAddr = 0x1000
	}
	if len(n.segs) > 0 && k&2 == 0 {
		r.Target = n.segs[k%len(n.segs)]
		if st := k2 % (len(protocols) + 1); st < len(protocols) {
			r.Transport = protocols[st]
		}
	}
	// Aim at the target's last buffer when it is known (the other node
	// is the only remote segment a node opens).
	r.TargetAddr = 0x2000
	d := n.descriptor()
	if r.Target != engine.LocalSegment {
		d = other.descriptor()
	}
	if d != nil && len(d.Buffers) > 0 {
		r.TargetAddr = d.Buffers[len(d.Buffers)-1].Addr + uint64(k%8)*512
	}
	return r
}

// descriptor is the node's published descriptor, nil without an engine.
func (n *node) descriptor() *segment.Descriptor {
	if n.eng == nil {
		return nil
	}
	return n.eng.LocalDescriptor()
}

// checkClosedEngine asserts what a closed engine must refuse.
func (n *node) checkClosedEngine(t *testing.T) {
	e := n.eng
	for _, tr := range n.trs {
		if tr != nil && e.Install(tr.user) == nil {
			t.Errorf("Install of %s into a closed engine succeeded", tr.tr.Name())
		}
	}
	if _, err := e.AllocateBatch(1); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("AllocateBatch after Close: %v, want ErrClosed", err)
	}
	if _, err := e.OpenSegment(context.Background(), "127.0.0.1:1", nil); !errors.Is(err, engine.ErrClosed) {
		t.Errorf("OpenSegment after Close: %v, want ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second engine Close: %v", err)
	}
}

// finish closes everything the program made, every Close twice and in
// reverse order of creation; the caller then checks for leaks.
func (w *world) finish() {
	for _, n := range w.nodes {
		for i := len(n.every) - 1; i >= 0; i-- {
			n.every[i]()
		}
		for _, c := range n.every {
			c()
		}
	}
}

// run executes the program in b: three bytes per step, the operation
// (its low bit chooses the node) and two arguments.
func run(t *testing.T, b []byte) {
	w := &world{t: t}
	for i := range w.nodes {
		w.nodes[i] = &node{registered: map[*engine.Memory]bool{}}
	}
	// A program of at most 64 steps, each bounded by a few timeouts of
	// well under a second, has no reason to take long: a hang is a bug.
	// Crash with every goroutine's stack, which the fuzzer records with
	// the input.
	hang := time.AfterFunc(hangAfter, func() {
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		w.logMu.Lock()
		defer w.logMu.Unlock()
		panic(fmt.Sprintf("lifecycle program still running after %v: %v\n%s", hangAfter, w.log, buf))
	})
	defer hang.Stop()
	defer w.finish()
	for steps := 0; len(b) > 0 && steps < 64; steps++ {
		var c [3]byte
		b = b[copy(c[:], b):]
		op, k := int(c[0]>>1)%nOps, c[0]&1
		w.logMu.Lock()
		w.log = append(w.log, fmt.Sprintf("%c.%s(%d,%d)", 'A'+k, opNames[op], c[1], c[2]))
		w.logMu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("panic in %v: %v\n%s", w.log, r, debug.Stack())
				}
			}()
			w.step(op, w.nodes[k], w.nodes[1-k], int(c[1]), int(c[2]))
		}()
	}
}

// fds counts this process's open file descriptors.
func fds(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// A is a step on node A, B one on node B.
func A(op int, args ...byte) []byte { return step(0, op, args) }
func B(op int, args ...byte) []byte { return step(1, op, args) }

func step(node byte, op int, args []byte) []byte {
	c := [3]byte{byte(op)<<1 | node}
	copy(c[1:], args)
	return c[:]
}

func prog(steps ...[]byte) []byte {
	var b []byte
	for _, s := range steps {
		b = append(b, s...)
	}
	return b
}

// Transport indexes in protocols.
const (
	iTCP   = 0
	iSHM   = 1
	iRDMA  = 2
	iMCTCP = 3
	// noHint: a request or OpenSegment that names no transport.
	noHint = byte(len(protocols))
)

// seeds are programs worth keeping: the orders that used to panic or leak.
var seeds = [][]byte{
	// New, Install, Close, Close twice on every transport, in an engine.
	prog(A(opNewEngine), A(opNewTransport, iTCP), A(opInstall, iTCP), A(opCloseEngine), A(opCloseTransport, iTCP)),
	prog(A(opNewEngine), A(opNewTransport, iSHM), A(opInstall, iSHM), A(opCloseEngine), A(opCloseTransport, iSHM)),
	prog(A(opNewEngine), A(opNewTransport, iRDMA), A(opInstall, iRDMA), A(opCloseEngine), A(opCloseTransport, iRDMA)),
	prog(A(opNewEngine), A(opNewTransport, iMCTCP), A(opInstall, iMCTCP), A(opCloseEngine), A(opCloseTransport, iMCTCP)),
	// Close without Install, then Install (must fail).
	prog(A(opNewTransport, iRDMA), A(opCloseTransport, iRDMA), A(opInstallDirect, iRDMA), A(opCloseTransport, iRDMA)),
	prog(A(opNewTransport, iTCP), A(opCloseTransport, iTCP), A(opInstallDirect, iTCP), A(opConnectDirect, iTCP)),
	prog(A(opNewTransport, iSHM), A(opCloseTransport, iSHM), A(opInstallDirect, iSHM), A(opConnectDirect, iSHM)),
	// A failed Install, then Close twice and Install again.
	prog(A(opNewTransport, iRDMA), A(opInstallDirect, iRDMA), A(opCloseTransport, iRDMA), A(opCloseTransport, iRDMA),
		A(opInstallDirect, iRDMA)),
	// Describe and Connect before Install.
	prog(A(opNewTransport, iTCP), A(opDescribeDirect, iTCP), A(opConnectDirect, iTCP),
		A(opNewTransport, iSHM), A(opDescribeDirect, iSHM), A(opConnectDirect, iSHM),
		A(opNewTransport, iRDMA), A(opDescribeDirect, iRDMA), A(opConnectDirect, iRDMA)),
	// Two nodes with stores: B serves tcp, A opens it and transfers, then
	// B closes under A.
	prog(B(opNewStore), B(opNewEngine), B(opNewTransport, iTCP), B(opInstall, iTCP), B(opAlloc), B(opRegister),
		A(opNewStore), A(opNewEngine), A(opNewTransport, iTCP), A(opInstall, iTCP), A(opAlloc), A(opRegister),
		A(opOpenSegment, 0, iTCP), A(opAllocateBatch, 3), A(opSubmit, 0x10, 0), A(opTransfer, 1, 0),
		B(opCloseEngine), A(opTransfer, 1), A(opWaitBatch), A(opFreeBatch)),
	// The same over shm with shared memory, memory and transport closed
	// under the initiator.
	prog(B(opNewStore), B(opNewEngine), B(opNewTransport, iSHM), B(opInstall, iSHM), B(opAlloc, 1), B(opRegister),
		A(opNewStore), A(opNewEngine), A(opNewTransport, iSHM), A(opInstall, iSHM), A(opAlloc, 1), A(opRegister),
		A(opOpenSegment, 0, iSHM), A(opTransfer, 1, noHint), B(opCloseMemory), A(opTransfer, 3, noHint), B(opCloseTransport, iSHM),
		A(opTransfer, 1, noHint)),
	// Stores closed under engines; consul without an agent; Mooncake's
	// stores without a server.
	prog(A(opNewStore), A(opNewEngine), A(opCloseStore), A(opAlloc), A(opRegister), A(opStoreCall, 0),
		A(opStoreCall, 3), A(opCloseEngine), A(opConsul), A(opOtherStore, 0, 0x53), A(opOtherStore, 1, 0x2a)),
	// Two nodes over Mooncake's TCP protocol.
	prog(B(opNewStore), B(opNewEngine), B(opNewTransport, iMCTCP), B(opInstall, iMCTCP), B(opAlloc), B(opRegister),
		A(opNewStore), A(opNewEngine), A(opNewTransport, iMCTCP), A(opInstall, iMCTCP), A(opAlloc), A(opRegister),
		A(opOpenSegment, 0, iMCTCP), A(opTransfer, 1, iMCTCP), B(opCloseTransport, iMCTCP), A(opTransfer, 1, iMCTCP)),
	// Memory closed while registered, engine closed while a batch runs.
	prog(A(opNewEngine, 1), A(opAlloc, 1), A(opRegister), A(opAllocateBatch), A(opSubmit, 0, 4), A(opCloseMemory),
		A(opCloseEngine), A(opWaitBatch), A(opRegister), A(opUnregister), A(opNewEngine, 1), A(opRegister)),
}

// FuzzLifecycle runs programs of lifecycle calls on two nodes.
func FuzzLifecycle(f *testing.F) {
	for _, s := range seeds {
		f.Add(s)
	}
	// The first use of the network and of memfds opens descriptors the
	// runtime keeps (the poller): open them before counting.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		before := goleak.IgnoreCurrent()
		base := fds(t)
		run(t, b)
		if t.Failed() {
			return
		}
		if err := goleak.Find(before); err != nil {
			t.Fatalf("after %x: %v", b, err)
		}
		// File descriptors are released by Close, not by the collector.
		deadline := time.Now().Add(time.Second)
		for fds(t) > base && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := fds(t); n > base {
			t.Fatalf("after %x: %d file descriptors open, %d before", b, n, base)
		}
	})
}
