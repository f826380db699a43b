// Package transporttest is the conformance suite every engine.Transport
// must pass. Run puts the initiator and the target engine in one process;
// RunRemote puts the target in a child process (the test binary run again,
// see StartTarget), reached through the embedded p2p store, as two hosts
// would be. Each engine gets a fresh transport from a factory, and the
// suite moves data only through the public engine API.
//
// Data is checked byte for byte against a seeded pattern (Pattern) that
// both processes can produce: the initiator writes it and the target
// checks what arrived, the target writes it and the initiator checks what
// it read. The cases cover sizes from 1 B to Options.MaxSize (64 MiB),
// batches of 4096 tasks, many concurrent submitters, bad requests, memory
// unregistered under an initiator, the target's engine closed, killed
// (child process SIGKILLed) and restarted with new memory mid-run, the
// initiator's engine closed mid-batch (no goroutine may leak), and, for
// transports with several rails, striping over every rail and a rail taken
// down mid-batch (Options.Rails).
//
// A transport's tests:
//
//	func factory(testing.TB) engine.Transport { return mytransport.New(...) }
//
//	func TestConformance(t *testing.T)       { transporttest.Run(t, factory) }
//	func TestConformanceRemote(t *testing.T) { transporttest.RunRemote(t, factory) }
package transporttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
)

// Factory returns a fresh, not yet installed transport. In a target child
// process (RunRemote, StartTarget) t is the child's copy of the test.
type Factory func(t testing.TB) engine.Transport

// Options tune Run and RunRemote. The zero value selects every default.
type Options struct {
	// Target builds the target engine's transport (in the child process
	// for RunRemote); nil uses the initiator's factory. Transports whose
	// two sides need different settings (RDMA: each simulated host its
	// own devices) set it.
	Target Factory
	// MaxSize is the largest single transfer of the Integrity case (each
	// side maps a bit more than that). Default 64 MiB.
	MaxSize int
	// DeadPeer is the transport's stated bound: after the target's engine
	// is closed or its process killed, every task in flight to it has
	// finished (FAILED or COMPLETED) within DeadPeer, and a new transfer
	// to it fails within DeadPeer. Default 30 s.
	DeadPeer time.Duration
	// Timeout bounds the transfers of each case to a healthy target.
	// Default 2 min.
	Timeout time.Duration
	// Rails enables the multi-rail cases; nil skips them.
	Rails *Rails
	// Shared maps every registered buffer of both engines with
	// engine.AllocShared (a transport that hands memory to a peer
	// process, shm, needs it) instead of engine.Alloc.
	Shared bool
	// Remote makes RunWith run RunRemote.
	Remote bool
	// NotifyHeld is how many notifications of one sender the
	// transport's target may hold beyond its engine's queue (RunNotify's
	// Flood): a transport that completes a note once the target has
	// custody of it, before the target's engine queued it (shm's ring
	// slots, rdma's receive credits). 0: a note completes once queued.
	NotifyHeld int
}

func (o Options) alloc(size int) (*engine.Memory, error) {
	if o.Shared {
		return engine.AllocShared(size)
	}
	return engine.Alloc(size)
}

// Rails are the hooks of the multi-rail cases, for transports that stripe
// over several links (RDMA).
type Rails struct {
	// Count is the number of rails between initiator and target (≥ 2).
	Count int
	// Bytes returns the bytes the initiator's transport (what the
	// Factory returned for the initiator) has moved on each rail so far:
	// Count entries, counting slices completed successfully (a slice
	// failed on one rail and retried on another counts once, on the
	// other). The suite checks that one large batch moves bytes on every
	// rail, and that no bytes complete on a rail while its link is down.
	Bytes func(tr engine.Transport) []uint64
	// SetLink takes rail i's link down (up false) or back up; in the
	// Soft-RoCE guest, `ip link set vethN down`. The suite restores every
	// rail it took down when the case ends.
	SetLink func(rail int, up bool) error
	// Recover bounds how long after SetLink(i, true) the transport takes
	// to carry bytes on rail i again. Default 60 s.
	Recover time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxSize <= 0 {
		o.MaxSize = 64 << 20
	}
	if o.DeadPeer <= 0 {
		o.DeadPeer = 30 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Rails != nil && o.Rails.Recover <= 0 {
		o.Rails.Recover = 60 * time.Second
	}
	return o
}

// suite is one run of the cases in one mode.
type suite struct {
	ini, tgt Factory
	o        Options
	remote   bool
}

// tcase is one conformance case and where it applies.
type tcase struct {
	name          string
	local, remote bool // runs in process / across processes
	rails         bool // needs Options.Rails
	run           func(t *testing.T, s *suite)
}

var cases = []tcase{
	{name: "Integrity", local: true, remote: true, run: testIntegrity},
	{name: "LargeBatch", local: true, remote: true, run: testLargeBatch},
	{name: "Concurrent", local: true, remote: true, run: testConcurrent},
	{name: "BadRequests", local: true, remote: true, run: testBadRequests},
	{name: "TargetUnregistered", local: true, remote: true, run: testTargetUnregistered},
	{name: "TargetClosed", local: true, remote: true, run: testTargetClosed},
	{name: "PeerKilled", remote: true, run: testPeerKilled},
	{name: "PeerRestart", local: true, remote: true, run: testPeerRestart},
	{name: "TransportClose", local: true, remote: true, run: testInitiatorClose},
	{name: "MultiRail", local: true, remote: true, rails: true, run: testMultiRail},
	{name: "RailDown", local: true, remote: true, rails: true, run: testRailDown},
}

// Run runs every conformance case with both engines in this process. At
// most one Options may be given.
func Run(t *testing.T, f Factory, opts ...Options) {
	run(t, f, false, opts)
}

// RunWith is Run, or RunRemote when o.Remote is set.
func RunWith(t *testing.T, f Factory, o Options) {
	run(t, f, o.Remote, []Options{o})
}

// RunRemote runs the conformance cases with the target engine in a child
// process (StartTarget): the test binary runs again with -test.run
// selecting the running case, so call RunRemote from its own test function
// or subtest, before anything the child should not repeat. At most one
// Options may be given. The case that SIGKILLs the target runs only here.
func RunRemote(t *testing.T, f Factory, opts ...Options) {
	run(t, f, true, opts)
}

func run(t *testing.T, f Factory, remote bool, opts []Options) {
	var o Options
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		t.Fatal("transporttest: more than one Options")
	}
	o = o.withDefaults()
	if o.Rails != nil && (o.Rails.Count < 2 || o.Rails.Bytes == nil || o.Rails.SetLink == nil) {
		t.Fatal("transporttest: Options.Rails needs Count ≥ 2, Bytes and SetLink")
	}
	s := &suite{ini: f, tgt: o.Target, o: o, remote: remote}
	if s.tgt == nil {
		s.tgt = f
	}
	for _, c := range cases {
		if (remote && !c.remote) || (!remote && !c.local) || (c.rails && o.Rails == nil) {
			continue
		}
		t.Run(c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// env is one initiator engine with a target opened.
type env struct {
	s     *suite
	e     *engine.Engine // initiator
	tr    engine.Transport
	mem   *engine.Memory
	buf   []byte // the initiator's registered buffer
	store segment.Store
	seg   engine.SegmentID
	tgt   target
	lt    *localTarget // in-process target, nil for RunRemote
}

// newEnv starts a target with a tgtSize-byte buffer (first: in a child
// process, that is where the child serves) and an initiator with iniSize
// bytes, and opens the target's segment.
func (s *suite) newEnv(t *testing.T, iniSize, tgtSize int) *env {
	t.Helper()
	v := &env{s: s}
	name := "initiator"
	if s.remote {
		v.tgt = StartTarget(t, s.tgt, TargetConfig{Size: tgtSize, Shared: s.o.Shared})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		st, err := p2p.New(ctx, p2p.Options{PollInterval: 100 * time.Millisecond, Grace: time.Second})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		v.store, name = st, st.Name()
	} else {
		st := enginetest.NewMemStore()
		v.store = st
		v.lt = newLocalTarget(t, st.Process(), s.tgt, s.o.alloc, "target", tgtSize)
		v.tgt = v.lt
	}
	t.Cleanup(v.close)
	e, err := engine.New(engine.Config{Name: name, Store: v.store})
	if err != nil {
		t.Fatal(err)
	}
	v.e = e
	v.tr = s.ini(t)
	if err := e.Install(v.tr); err != nil {
		t.Fatal(err)
	}
	if v.mem, err = s.o.alloc(iniSize); err != nil {
		t.Fatal(err)
	}
	v.buf = v.mem.Bytes()
	if err := e.RegisterLocalMemory(v.buf, "cpu:0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v.seg, err = e.OpenSegment(ctx, v.tgt.Info().Name, nil); err != nil {
		t.Fatal(err)
	}
	return v
}

// close closes the initiator engine, its memory and store, and an
// in-process target. It is idempotent.
func (v *env) close() {
	if v.e != nil {
		v.e.Close()
	}
	if v.mem != nil {
		v.mem.Close()
	}
	if v.lt != nil {
		v.lt.close()
	}
	if v.store != nil {
		v.store.Close()
	}
}

// ctx returns a context bounded by d, cancelled when the test ends.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// transfer submits reqs in a fresh batch and waits.
func (v *env) transfer(ctx context.Context, reqs []engine.Request) error {
	b, err := v.e.AllocateBatch(len(reqs))
	if err != nil {
		return err
	}
	if err := v.e.Submit(b, reqs); err != nil {
		v.e.FreeBatch(b)
		return err
	}
	err = v.e.Wait(ctx, b)
	if ferr := v.e.FreeBatch(b); ferr != nil && err == nil {
		err = ferr
	}
	return err
}

func (v *env) write(local []byte, addr uint64) engine.Request {
	return engine.Request{Op: engine.Write, Local: local, Target: v.seg, TargetAddr: addr}
}

func (v *env) read(local []byte, addr uint64) engine.Request {
	return engine.Request{Op: engine.Read, Local: local, Target: v.seg, TargetAddr: addr}
}

// roundTrip writes n pattern bytes to addr and has the target check them,
// then has the target write other pattern bytes there and reads them back.
func (v *env) roundTrip(ctx context.Context, addr uint64, n int, seed uint64) error {
	src := v.buf[:n]
	Pattern(src, seed, 0)
	if err := v.transfer(ctx, []engine.Request{v.write(src, addr)}); err != nil {
		return fmt.Errorf("WRITE %d B to %#x: %w", n, addr, err)
	}
	if err := v.tgt.Check(addr, n, seed, 0); err != nil {
		return fmt.Errorf("WRITE %d B to %#x: target: %w", n, addr, err)
	}
	if err := v.tgt.Fill(addr, n, seed+1, 0); err != nil {
		return err
	}
	clear(src)
	if err := v.transfer(ctx, []engine.Request{v.read(src, addr)}); err != nil {
		return fmt.Errorf("READ %d B from %#x: %w", n, addr, err)
	}
	if err := CheckPattern(src, seed+1, 0); err != nil {
		return fmt.Errorf("READ %d B from %#x: %w", n, addr, err)
	}
	return nil
}

// finished waits for batch b within d and checks that every task is
// COMPLETED with all its bytes (sizes[i]) or FAILED with an error wrapping
// one of allowed (any error when allowed is empty). It returns the counts.
func (v *env) finished(t *testing.T, b engine.BatchID, sizes []int, d time.Duration, allowed ...error) (done, failed int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := v.e.Wait(ctx, b); errors.Is(err, context.DeadlineExceeded) {
		bs, _ := v.e.BatchStatus(b)
		t.Fatalf("batch still %v %v after the bound (%v)", bs.State, err, d)
	}
	for i, n := range sizes {
		st, err := v.e.Status(b, i)
		if err != nil {
			t.Fatal(err)
		}
		switch st.State {
		case engine.StateCompleted:
			done++
			if st.Transferred != uint64(n) {
				t.Fatalf("task %d COMPLETED with %d of %d bytes", i, st.Transferred, n)
			}
		case engine.StateFailed:
			failed++
			if st.Err == nil {
				t.Fatalf("task %d FAILED without an error", i)
			}
			if len(allowed) > 0 && !isAny(st.Err, allowed) {
				t.Fatalf("task %d FAILED with %v, want one of %v", i, st.Err, allowed)
			}
		default:
			t.Fatalf("task %d still %v after Wait", i, st.State)
		}
	}
	return done, failed
}

func isAny(err error, targets []error) bool {
	for _, e := range targets {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Initiator starts an initiator engine named after its store with a fresh
// transport from f and one registered buffer of size bytes (from
// engine.AllocShared when o.Shared). A nil st gives it a p2p store of its
// own on 127.0.0.1, to reach targets in child processes. The test's
// cleanup closes it all.
func Initiator(t testing.TB, o Options, st segment.Store, size int, f Factory) *enginetest.Node {
	t.Helper()
	name := "initiator"
	if st == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ps, err := p2p.New(ctx, p2p.Options{PollInterval: 20 * time.Millisecond})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ps.Close() })
		st, name = ps, ps.Name()
	}
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 0, f(t))
	mem, err := o.alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Engine.Close()
		mem.Close()
	})
	if err := n.Engine.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	n.Mem = mem
	return n
}
