package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/blockcopy"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/segment"
)

// BatchID names an allocated batch. IDs of freed batches are never
// mistaken for live ones.
type BatchID uint64

// MaxBatchCapacity bounds AllocateBatch.
const MaxBatchCapacity = 1 << 20

// Request is one transfer: Length bytes between local memory and the target
// segment.
type Request struct {
	Op Op
	// Local is the local side, inside registered memory. When nil,
	// LocalAddr (a raw virtual address inside registered memory) is used.
	Local     []byte
	LocalAddr uint64
	// Length is the number of bytes; 0 means len(Local). It must not
	// exceed len(Local) when Local is set.
	Length uint64
	// Target is the remote (or local) segment, TargetAddr the absolute
	// address of the first byte in the target's address space (as in its
	// descriptor's buffers).
	Target     SegmentID
	TargetAddr uint64
	// Transport, when set, forces a transport for this request; the
	// target must offer it and the transport must reach it (shm: the
	// target runs on this host).
	Transport string
}

//go:generate go tool stringer -linecomment -type State

// State is a task's (or batch's) progress.
type State uint32

// States.
const (
	// StateInvalid: no such task.
	StateInvalid State = iota // INVALID
	// StatePending: submitted, not finished.
	StatePending // PENDING
	// StateCompleted: every slice succeeded.
	StateCompleted // COMPLETED
	// StateFailed: finished with at least one slice failed.
	StateFailed // FAILED
	// StateCanceled: cancelled (Cancel) before all its slices started;
	// those that had started finished.
	StateCanceled // CANCELED
)

// TaskStatus is a task's (or a batch's aggregated) state.
type TaskStatus struct {
	State State
	// Transferred is the number of bytes moved by finished slices.
	Transferred uint64
	// Err is the first slice error of a failed or cancelled task (nil
	// otherwise).
	Err error
	// Transport names the transport that carried the task (tcp, rdma,
	// shm: the first choice of the segment's route, or the next one when
	// that failed to connect); empty for the local segment, which is
	// copied in this process. For a batch it is the transport of all its
	// tasks, or the distinct names in task order, comma-separated, when
	// tasks went different ways.
	Transport string
	// Layer is the last layer the task (every task, for a batch: the
	// least advanced) has reached; see Snapshot for more.
	Layer Layer
}

// task is one request's completion state.
type task struct {
	// What completing the task reads (CompleteAll, finishAll) comes
	// first, in one cache line (a task is 320 bytes: in an array that
	// starts on a line, as the heap's large ones do, every task starts
	// one): the copies between a submission and its completions push
	// the batch's tasks out of the nearest caches, and each line the
	// completion touches again costs a miss.
	b       *batch
	region  *region        // local side, pinned until finish
	tregion *region        // target region when the target is local, pinned
	seg     *remoteSegment // nil for the local segment
	tin     *atomic.Int64  // in-flight counter of the transport slot
	stats   *peerStats     // nil for the local segment
	note    *note          // the notification following the task's submission
	nslices int64

	local []byte
	start int64 // Submit's time, ns on the engine's clock
	idx   int   // the task's index in b.tasks (AllocateBatch)
	// state is 0 (StateInvalid) from Submit until the task fails or is
	// cancelled: a submitted task is pending until then (see get), so
	// Submit stores nothing in it, and done counts up to nslices for
	// the same reason (Submit stores no count of slices left): two
	// locked exchanges less per request. A task that completes sets
	// its bit in b.completed instead, with the tasks finished beside
	// it: one locked operation for a run of them.
	state  atomic.Uint32
	failed atomic.Bool
	done   atomic.Int64 // slices done, of a task of several
	// transferred is the bytes moved by the task's finished slices;
	// a task of one slice completed by driver.DoneAll (moved in full)
	// adds nothing to it: see moved.
	transferred atomic.Uint64
	mu          sync.Mutex // guards err
	err         error

	// The rest of the resolution, written by Submit before the task is
	// dispatched.
	op       Op
	laddr    uint64
	tmem     []byte // target bytes when the target is local
	st       *segState
	slot     int
	peer     driver.Peer
	rbuf     *segment.Buffer
	rbufIdx  int
	raddr    uint64
	tname    string // the transport's name
	sliceMax uint64

	// Progress, for Snapshot: slices posted and not done, retries and
	// the last retry's cause; logged is set once the task was reported
	// stuck.
	posted  atomic.Int64
	retries atomic.Uint32
	cause   atomic.Uint32
	logged  atomic.Bool
	_       [24]byte // to 320 bytes (TestTaskLayout)
}

// get is the state of a submitted task.
func (t *task) get() State {
	if st := State(t.state.Load()); st != StateInvalid {
		return st
	}
	if t.b.isCompleted(t.idx) {
		return StateCompleted
	}
	return StatePending
}

// moved is the bytes the task moved, st its state (get): a task of one
// slice completed by driver.DoneAll moved its whole length and counted
// nothing in transferred.
func (t *task) moved(st State) uint64 {
	n := t.transferred.Load()
	if n == 0 && st == StateCompleted && t.nslices == 1 {
		n = uint64(len(t.local))
	}
	return n
}

// left is the number of the task's slices not done yet; it stays 1 for a
// task of one slice, done or not (its completion counts nothing).
func (t *task) left() int64 {
	return t.nslices - t.done.Load()
}

// layer is where the submitted task is: see Layer.
func (t *task) layer() Layer {
	switch t.get() {
	case StateCompleted:
		return LayerCompleted
	case StateFailed, StateCanceled:
		return LayerFailed
	case StatePending:
		if t.left() > t.posted.Load() {
			return LayerQueued
		}
		return LayerPosted
	}
	return LayerNone
}

func (t *task) setErr(err error) {
	if t.failed.Swap(true) {
		return
	}
	t.mu.Lock()
	t.err = err
	t.mu.Unlock()
}

// finish runs when the last slice is done: drop pins first (so a caller
// who sees the final state can unregister at once), then publish the
// state, then count the batch down.
func (t *task) finish() {
	t.release()
	if t.stats != nil {
		t.stats.tasks.Add(1)
	}
	t.b.transferred.Add(t.transferred.Load())
	n, ok := t.publish()
	if ok {
		t.b.complete(t.idx, 1)
	}
	if n != nil {
		n.steps(1) // the note counts the batch down for its tasks
		return
	}
	t.b.done(1)
}

// finishAll is finish for several tasks, each completed by its one
// slice or by the last of its slices, moved in full (driver.DoneAll):
// their pins, in-flight counts and task counters are dropped or counted
// in runs that share them, all before any task's state is published,
// the completed tasks of one batch are published in runs of consecutive
// ones (b.complete) and the batch is counted down once per run of one
// batch. fold, a note whose sending succeeded (driver.DoneAllNote), is
// stepped for that in the step of its tasks in ts, or alone after them.
func finishAll(ts []*task, fold *note) {
	var (
		reg, treg   *region
		regN, tregN int64
		seg         *remoteSegment
		segN        int64
		tin         *atomic.Int64
		tinN        int64
		ps          *peerStats
		psN         uint64
	)
	for _, t := range ts {
		if t.region != reg {
			if regN != 0 {
				reg.users.Add(-regN)
			}
			reg, regN = t.region, 0
		}
		if t.tregion != treg {
			if tregN != 0 {
				treg.users.Add(-tregN)
			}
			treg, tregN = t.tregion, 0
		}
		if t.seg != seg {
			if segN != 0 {
				seg.inflight.Add(-segN)
			}
			seg, segN = t.seg, 0
		}
		if t.tin != tin {
			if tinN != 0 {
				tin.Add(-tinN)
			}
			tin, tinN = t.tin, 0
		}
		if t.stats != ps {
			if psN != 0 {
				ps.tasks.Add(psN)
			}
			ps, psN = t.stats, 0
		}
		if reg != nil {
			regN++
		}
		if treg != nil {
			tregN++
		}
		if seg != nil {
			segN++
		}
		if tin != nil {
			tinN++
		}
		if ps != nil {
			psN++
		}
	}
	if regN != 0 {
		reg.users.Add(-regN)
	}
	if tregN != 0 {
		treg.users.Add(-tregN)
	}
	if segN != 0 {
		seg.inflight.Add(-segN)
	}
	if tinN != 0 {
		tin.Add(-tinN)
	}
	if psN != 0 {
		ps.tasks.Add(psN)
	}
	var (
		b     *batch
		bytes uint64
	)
	for _, t := range ts {
		if t.b != b {
			if bytes != 0 {
				b.transferred.Add(bytes)
			}
			b, bytes = t.b, 0
		}
		if t.nslices == 1 {
			bytes += uint64(len(t.local)) // moved in full, not counted in t
		} else {
			bytes += t.transferred.Load()
		}
	}
	if bytes != 0 {
		b.transferred.Add(bytes)
	}
	b = nil
	var bn int64
	var (
		// The run of completed tasks being published: tasks
		// [ci, ci+cn) of cb.
		cb     *batch
		ci, cn int
	)
	for _, t := range ts {
		_, ok := t.publish()
		if ok && (t.b != cb || t.idx != ci+cn) {
			if cn != 0 {
				cb.complete(ci, cn)
			}
			cb, ci, cn = t.b, t.idx, 0
		}
		if ok {
			cn++
		}
	}
	if cn != 0 {
		cb.complete(ci, cn)
	}
	// Only now, with every state published, may the batch count down:
	// its waiter then sees each task final. A submission's notification
	// is stepped once per run of its tasks (its count is shared by the
	// goroutines completing them), and it counts the batch down for
	// them when it settles; other tasks count their batch down once per
	// run. A note stepped for the last time may free its batch: none of
	// its tasks comes later in ts, and the tasks after it keep theirs.
	var (
		nt *note
		nn int64
	)
	for _, t := range ts {
		if n := t.note; n != nt {
			if nn != 0 {
				if nt == fold {
					nn, fold = nn+1, nil
				}
				nt.steps(nn)
			}
			nt, nn = n, 0
		}
		if nt != nil {
			nn++
			continue
		}
		if t.b != b {
			if bn != 0 {
				b.done(bn)
			}
			b, bn = t.b, 0
		}
		bn++
	}
	if nn != 0 {
		if nt == fold {
			nn, fold = nn+1, nil
		}
		nt.steps(nn)
	}
	if bn != 0 {
		b.done(bn)
	}
	if fold != nil {
		fold.steps(1)
	}
}

// complete publishes tasks [i, i+n) as completed: their bits in
// b.completed, one atomic OR per word.
func (b *batch) complete(i, n int) {
	for n > 0 {
		w, o := i>>6, i&63
		k := min(n, 64-o)
		m := ^uint64(0)
		if k < 64 {
			m = (1<<k - 1) << o
		}
		b.completed[w].Or(m)
		i, n = i+k, n-k
	}
}

// isCompleted says whether task i has been published as completed.
func (b *batch) isCompleted(i int) bool {
	return b.completed[i>>6].Load()&(1<<(i&63)) != 0
}

// publish stores the state of a finished task that did not complete
// and returns its notification (nil: none), which the caller steps, and
// whether the task completed: then the caller publishes that
// (b.complete), before it counts the batch down.
func (t *task) publish() (*note, bool) {
	st := StateCompleted
	if t.failed.Load() {
		st = StateFailed
		t.mu.Lock()
		if errors.Is(t.err, ErrCanceled) {
			st = StateCanceled
		}
		t.mu.Unlock()
	}
	n := t.note
	if st == StateCompleted {
		return n, true
	}
	t.b.bad.Store(true)
	t.state.Store(uint32(st))
	if n != nil {
		n.bad.Store(true)
	}
	return n, false
}

// done counts n finished tasks or notes down.
func (b *batch) done(n int64) {
	if b.pending.Add(-n) == 0 {
		e := b.e
		e.stats.batch.observe(e.now() - b.start.Load())
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
}

// unpin undoes the pins of a validated task that is not dispatched and
// leaves it zero but for b, as resolve expects.
func (t *task) unpin() {
	t.release()
	*t = task{b: t.b, idx: t.idx}
}

// release drops what resolve took: the pins on local and target regions
// and the in-flight counts of the segment and the transport.
func (t *task) release() {
	if t.region != nil {
		t.region.users.Add(-1)
	}
	if t.tregion != nil {
		t.tregion.users.Add(-1)
	}
	if t.seg != nil {
		t.seg.inflight.Add(-1)
	}
	if t.tin != nil {
		t.tin.Add(-1)
	}
}

const sliceChunk = 256

// batch holds preallocated task and slice state, reused across
// FreeBatch/AllocateBatch.
type batch struct {
	e         *Engine
	id        BatchID
	mu        sync.Mutex // serialises Submit and FreeBatch
	tasks     []task
	submitted atomic.Int64 // tasks submitted (a prefix of tasks)
	pending   atomic.Int64 // submitted tasks and notes not finished
	canceled  atomic.Bool
	notes     []*note // notes of submissions, the first nnotes in use; reused
	nnotes    int
	notify    chan struct{}
	finished  func() bool // pending is 0; made once, for driver.Helper
	chunks    [][]slice   // slice arena; never moves once allocated
	nslices   int
	scratch   []*driver.Slice
	start     atomic.Int64 // when pending last rose from 0, ns on the engine's clock
	// What BatchStatus reports of a batch whose tasks all completed,
	// kept as they finish so that it need not visit every task: the
	// bytes of finished tasks, whether one did not complete, and the
	// transports' names in task order (Submit).
	transferred atomic.Uint64
	bad         atomic.Bool
	tnames      atomic.Pointer[string]
	// completed has bit i set once task i has completed (see task.get):
	// a word for every 64 tasks of cap(tasks).
	completed []atomic.Uint64
}

// addName returns the transports' names of the batch with name added
// (the first without allocating: the transport set's own string).
func addName(names, name *string) *string {
	if names == nil {
		return name
	}
	s := *names + "," + *name
	return &s
}

func (b *batch) newSlice() *slice {
	c, i := b.nslices/sliceChunk, b.nslices%sliceChunk
	if c == len(b.chunks) {
		b.chunks = append(b.chunks, make([]slice, sliceChunk))
	}
	b.nslices++
	return &b.chunks[c][i]
}

type batchTable struct {
	mu    sync.RWMutex
	slots []*batch
	free  []uint32
	gen   uint32
	pool  []*batch
}

func (bt *batchTable) get(id BatchID) *batch {
	idx := int(uint32(id)) - 1
	bt.mu.RLock()
	defer bt.mu.RUnlock()
	// b.id changes only under bt.mu (AllocateBatch, FreeBatch): compare
	// it here, not after unlocking, or a stale ID races with the reuse of
	// its batch.
	if idx < 0 || idx >= len(bt.slots) {
		return nil
	}
	if b := bt.slots[idx]; b != nil && b.id == id {
		return b
	}
	return nil
}

// AllocateBatch returns a batch that can hold capacity tasks over any
// number of Submit calls. Freed batches are reused, so a steady
// allocate-submit-wait-free loop does not allocate.
func (e *Engine) AllocateBatch(capacity int) (BatchID, error) {
	if e.closed.Load() {
		return 0, ErrClosed
	}
	if capacity <= 0 || capacity > MaxBatchCapacity {
		return 0, fmt.Errorf("%w: capacity %d not in [1, %d]", ErrInvalidRequest, capacity, MaxBatchCapacity)
	}
	bt := &e.batches
	bt.mu.Lock()
	defer bt.mu.Unlock()
	var b *batch
	for i, pb := range bt.pool {
		if cap(pb.tasks) >= capacity {
			b = pb
			bt.pool[i] = bt.pool[len(bt.pool)-1]
			bt.pool[len(bt.pool)-1] = nil
			bt.pool = bt.pool[:len(bt.pool)-1]
			break
		}
	}
	if b == nil {
		b = &batch{e: e, notify: make(chan struct{}, 1)}
		b.finished = func() bool { return b.pending.Load() == 0 }
		b.tasks = make([]task, capacity)
		b.completed = make([]atomic.Uint64, (capacity+63)/64)
	}
	b.tasks = b.tasks[:capacity]
	for i := range b.tasks {
		b.tasks[i].b, b.tasks[i].idx = b, i
	}
	var idx uint32
	if n := len(bt.free); n > 0 {
		idx = bt.free[n-1]
		bt.free = bt.free[:n-1]
	} else {
		bt.slots = append(bt.slots, nil)
		idx = uint32(len(bt.slots) - 1)
	}
	bt.gen++
	b.id = BatchID(uint64(bt.gen)<<32 | uint64(idx+1))
	bt.slots[idx] = b
	return b.id, nil
}

// FreeBatch releases a batch. It fails with ErrBatchBusy while any of its
// tasks is in flight: completions still write its state.
func (e *Engine) FreeBatch(id BatchID) error {
	bt := &e.batches
	b := bt.get(id)
	if b == nil {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.pending.Load(); n > 0 {
		return fmt.Errorf("%w: %d of %d tasks", ErrBatchBusy, n, b.submitted.Load())
	}
	bt.mu.Lock()
	idx := uint32(id) - 1
	if int(idx) >= len(bt.slots) || bt.slots[idx] != b || b.id != id {
		bt.mu.Unlock()
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	bt.slots[idx] = nil
	bt.free = append(bt.free, idx)
	b.id = 0
	// Clear what the tasks and slices hold (so that a pooled batch keeps
	// no segment, region or peer alive) in one sweep per array, not
	// per element; resolve counts on the tasks after submitted being
	// zero but for b, which AllocateBatch sets again.
	used := int(b.submitted.Load())
	clear(b.tasks[:used])
	for i := range (used + 63) / 64 {
		b.completed[i].Store(0)
	}
	for c := 0; c*sliceChunk < b.nslices; c++ {
		clear(b.chunks[c][:min(sliceChunk, b.nslices-c*sliceChunk)])
	}
	b.nslices = 0
	b.submitted.Store(0)
	b.canceled.Store(false)
	b.transferred.Store(0)
	b.bad.Store(false)
	b.tnames.Store(nil)
	for _, n := range b.notes[:b.nnotes] {
		*n = note{b: b, msg: n.msg[:0]}
	}
	b.nnotes = 0
	select {
	case <-b.notify:
	default:
	}
	if len(bt.pool) < 64 {
		bt.pool = append(bt.pool, b)
	}
	bt.mu.Unlock()
	return nil
}

// Submit validates every request, then starts them all as tasks of the
// batch, numbered after the tasks already submitted to it. If any request
// is invalid nothing is started and the error names the request: local
// range not registered (ErrNotRegistered), target range outside the
// target's buffers (ErrOutOfRange), unknown or gone segment
// (ErrSegmentNotFound), no usable transport (ErrNoTransport), batch
// capacity exceeded (ErrBatchFull), malformed request (ErrInvalidRequest).
// Submit does not wait for the transfers, except that a transport used
// for the first time with a segment (a request's Transport hint) is
// connected here, bounded by Config.MetadataTimeout, and that a request
// whose transport an Uninstall is deciding about waits for the decision
// (a refusal lets it through). On the steady-state path it does not
// allocate.
func (e *Engine) Submit(id BatchID, reqs []Request) error {
	return e.submit(id, reqs, nil, LocalSegment)
}

// submit is Submit, followed by the notification n (when not nil) to seg.
func (e *Engine) submit(id BatchID, reqs []Request, n *Notify, seg SegmentID) error {
	if n != nil {
		if err := checkNotify(n); err != nil {
			return fmt.Errorf("engine: submit: %w", err)
		}
	}
	c0 := cost.Now()
	if e.closed.Load() {
		return ErrClosed
	}
	b := e.batches.get(id)
	if b == nil {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.id != id {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	if b.canceled.Load() {
		return fmt.Errorf("engine: submit: %w: the batch was cancelled; free it and allocate another", ErrCanceled)
	}
	base := int(b.submitted.Load())
	if base+len(reqs) > len(b.tasks) {
		return fmt.Errorf("%w: %d submitted + %d new > capacity %d", ErrBatchFull, base, len(reqs), len(b.tasks))
	}
	ts := e.transports.Load()
	now := e.now()
	rv := resolver{e: e, ts: ts, now: now, names: b.tnames.Load(), named: -1}
	for i := range reqs {
		if err := rv.resolve(&b.tasks[base+i], &reqs[i]); err != nil {
			rv.flush()
			for j := base; j <= base+i; j++ {
				b.tasks[j].unpin()
			}
			return fmt.Errorf("engine: submit: request %d: %w", i, err)
		}
	}
	rv.flush()
	if c0 != 0 {
		cost.Admit.Add(rv.admitNs)
		cost.Resolve.Add(-rv.admitNs)
		c0 = cost.Resolve.Since(c0)
	}
	var nt *note
	if n != nil {
		var err error
		if nt, err = e.prepareNote(b, base, len(reqs), n, seg, ts); err != nil {
			for j := base; j < base+len(reqs); j++ {
				b.tasks[j].unpin()
			}
			return fmt.Errorf("engine: submit: %w", err)
		}
	}
	// Everything is valid: account for the tasks before any slice can
	// complete, then dispatch. What the resolver gathered on its way
	// (the slots used, the transports' names, the local tasks) spares
	// more passes over the tasks.
	used := rv.used
	if nt != nil {
		for i := range reqs {
			b.tasks[base+i].note = nt // else nil already (resolve)
		}
	}
	b.tnames.Store(rv.names)
	add := int64(len(reqs))
	if nt != nil {
		add++
	}
	if b.pending.Add(add) == add {
		b.start.Store(now)
	}
	b.submitted.Store(int64(base + len(reqs)))

	// The local segment: copies in this goroutine, then completions.
	if rv.locals != 0 {
		c0 = cost.Slice.Since(c0)
		for i := range reqs {
			t := &b.tasks[base+i]
			if t.seg != nil {
				continue
			}
			if t.op == Write {
				blockcopy.Copy(t.tmem, t.local)
			} else {
				blockcopy.Copy(t.local, t.tmem)
			}
		}
		c0 = cost.Move.Since(c0)
		ss := b.scratch[:0]
		for i := range reqs {
			t := &b.tasks[base+i]
			if t.seg != nil {
				continue
			}
			s := b.newSlice()
			s.task = t
			s.Local = t.local
			s.Bind(s, 0)
			ss = append(ss, &s.Slice)
		}
		driver.DoneAll(ss)
		clear(ss)
		b.scratch = ss
		c0 = cost.Complete.Since(c0)
	}
	if nt != nil && nt.tr == nil {
		e.sendLocalNote(nt)
	} else if nt != nil && nt.alone {
		nt.Bind(nt, 0)
		nt.tr.SubmitNotify(b.scratch[:0], &nt.Note)
	}
	for slot := 0; used != 0; slot++ {
		if used&(1<<slot) == 0 {
			continue
		}
		used &^= 1 << slot
		ss := b.scratch[:0]
		for i := range reqs {
			t := &b.tasks[base+i]
			if t.seg == nil || t.slot != slot {
				continue
			}
			for off := uint64(0); off < uint64(len(t.local)); off += t.sliceMax {
				n := min(t.sliceMax, uint64(len(t.local))-off)
				// newSlice's slices are zero (FreeBatch clears them):
				// set field by field, with no struct built on the
				// stack and copied.
				s := b.newSlice()
				s.Op = t.op
				s.Local = t.local[off : off+n : off+n]
				s.LocalAddr = t.laddr + off
				s.LocalRegion = t.region
				s.LocalKey = t.region.keys[slot]
				s.RemoteAddr = t.raddr + off
				s.RemoteBuffer = t.rbuf
				s.RemoteIndex = t.rbufIdx
				s.Remote = t.st.desc
				s.Peer = t.peer
				s.task = t
				s.timed = b.nslices%latencySample == 1
				s.Bind(s, 0)
				s.BindCanceled(&b.canceled)
				ss = append(ss, &s.Slice)
			}
		}
		b.scratch = ss
		c0 = cost.Slice.Since(c0)
		// The transport accounts for its own stages.
		if nt != nil && nt.tr != nil {
			nt.Bind(nt, 0)
			nt.tr.SubmitNotify(ss, &nt.Note)
		} else {
			ts.slots[slot].Submit(ss)
		}
		if c0 != 0 {
			c0 = cost.Now()
		}
		clear(ss)
	}
	cost.Slice.Since(c0)
	return nil
}

// resolver resolves the requests of one Submit. What consecutive requests
// share is looked up once: a run of requests in one local region pins it
// with one atomic add (the run's first pin holds it, so the others can be
// added later), and a run to one segment over one transport finds its
// state, its transport and peer and counts itself in flight on both once
// (admit). flush adds the counts deferred so far; Submit calls it before
// it unpins or dispatches anything.
type resolver struct {
	e   *Engine
	ts  *transportSet
	now int64 // Submit's time on the engine's clock

	reg, treg   *region // the last local and local-target regions
	regN, tregN int64   // their pins taken and not yet added

	// The last target group: requests with this Target and Transport.
	seg      *remoteSegment // nil: none
	target   SegmentID
	hint     string
	st       *segState
	slot     int
	ref      *peerRef
	tin      *atomic.Int64
	sliceMax uint64 // the transport's (or the engine's) slice size
	rbuf     *segment.Buffer
	rbufIdx  int
	grpN     int64 // tasks of the group counted in flight and not yet added

	admitNs int64 // the clock's time in group lookups (internal/cost)

	// What Submit accounts for once the requests are valid.
	used   uint32  // the slots of the remote tasks
	locals int     // tasks to the local segment
	names  *string // the batch's transports' names, those of this Submit added
	named  int     // the slot whose name was looked for last
}

// flush adds the deferred pins and in-flight counts.
func (rv *resolver) flush() {
	if rv.regN != 0 {
		rv.reg.users.Add(rv.regN)
		rv.regN = 0
	}
	if rv.tregN != 0 {
		rv.treg.users.Add(rv.tregN)
		rv.tregN = 0
	}
	if rv.grpN != 0 {
		rv.seg.inflight.Add(rv.grpN)
		rv.tin.Add(rv.grpN)
		rv.grpN = 0
	}
}

// pinLocal returns the region holding [addr, addr+n), pinned for one task.
func (rv *resolver) pinLocal(reg **region, pending *int64, addr, n uint64) *region {
	if r := *reg; r != nil && r.contains(addr, n) {
		*pending++
		return r
	}
	if *pending != 0 {
		(*reg).users.Add(*pending)
		*pending = 0
	}
	*reg = nil
	r := rv.e.mem.find(addr, n)
	if r == nil {
		return nil
	}
	if !r.pin() {
		return errRegionBusy
	}
	*reg = r
	return r
}

// errRegionBusy is pinLocal's answer for a region being unregistered.
var errRegionBusy = &region{}

// resolve validates r and fills t; on error t holds what must be unpinned
// (after flush).
func (rv *resolver) resolve(t *task, r *Request) error {
	// t is zero but for t.b: a task after the batch's submitted ones
	// always is (AllocateBatch, FreeBatch and unpin leave it so), so only
	// what is not zero is written here, not the whole task again.
	t.slot, t.start = -1, rv.now
	if r.Op != Read && r.Op != Write {
		return fmt.Errorf("%w: op %d", ErrInvalidRequest, r.Op)
	}
	n := r.Length
	laddr := r.LocalAddr
	if r.Local != nil {
		if n == 0 {
			n = uint64(len(r.Local))
		} else if n > uint64(len(r.Local)) {
			return fmt.Errorf("%w: length %d exceeds local slice of %d", ErrInvalidRequest, n, len(r.Local))
		}
		laddr = addrOf(r.Local)
	}
	if n == 0 {
		return fmt.Errorf("%w: zero length", ErrInvalidRequest)
	}
	if laddr+n < laddr || r.TargetAddr+n < r.TargetAddr {
		return fmt.Errorf("%w: range wraps the address space", ErrInvalidRequest)
	}
	reg := rv.pinLocal(&rv.reg, &rv.regN, laddr, n)
	switch reg {
	case nil:
		return fmt.Errorf("%w: [%#x, %#x)", ErrNotRegistered, laddr, laddr+n)
	case errRegionBusy:
		return fmt.Errorf("%w: local [%#x, %#x)", errAcquireBusy, laddr, laddr+n)
	}
	t.region = reg
	t.local = reg.sliceAt(laddr, n)
	t.laddr = laddr
	t.op = r.Op
	t.nslices = 1

	if r.Target == LocalSegment {
		tr := rv.pinLocal(&rv.treg, &rv.tregN, r.TargetAddr, n)
		switch tr {
		case nil:
			return fmt.Errorf("%w: local segment [%#x, %#x)", ErrOutOfRange, r.TargetAddr, r.TargetAddr+n)
		case errRegionBusy:
			return fmt.Errorf("%w: target [%#x, %#x)", errAcquireBusy, r.TargetAddr, r.TargetAddr+n)
		}
		t.tregion = tr
		t.tmem = tr.sliceAt(r.TargetAddr, n)
		rv.locals++
		return nil
	}
	if rv.seg != nil && r.Target == rv.target && r.Transport == rv.hint {
		// The group's first task holds the segment and the transport:
		// this one's counts can wait for flush.
		rv.grpN++
		t.seg, t.tin = rv.seg, rv.tin
	} else if err := rv.admit(t, r); err != nil {
		return err
	} else if rv.slot != rv.named {
		if name := rv.ts.names[rv.slot]; rv.names == nil || *rv.names != name && !inList(*rv.names, name) {
			rv.names = addName(rv.names, &rv.ts.names[rv.slot])
		}
		rv.named = rv.slot
		rv.used |= 1 << rv.slot
	}
	st := rv.st
	if b := rv.rbuf; b == nil || !b.Contains(r.TargetAddr, n) {
		bi, err := st.desc.Find(r.TargetAddr, n)
		if err != nil {
			return fmt.Errorf("%w: %s [%#x, %#x)", ErrOutOfRange, rv.seg.name, r.TargetAddr, r.TargetAddr+n)
		}
		rv.rbuf, rv.rbufIdx = &st.desc.Buffers[bi], bi
	}
	t.st = st
	t.slot = rv.slot
	t.tname = rv.ts.names[rv.slot]
	t.peer = rv.ref.p
	t.stats = rv.ref.stats
	t.rbuf = rv.rbuf
	t.rbufIdx = rv.rbufIdx
	t.raddr = r.TargetAddr
	t.sliceMax = rv.sliceMax
	if t.sliceMax == 0 || t.sliceMax > n {
		t.sliceMax = n
	}
	t.nslices = int64((n + t.sliceMax - 1) / t.sliceMax)
	return nil
}

// admit starts a target group with t: the segment, its state, the
// transport and peer, t counted in flight on the segment and the
// transport.
func (rv *resolver) admit(t *task, r *Request) error {
	c0 := cost.Now()
	defer func() {
		if c0 != 0 {
			rv.admitNs += cost.Now() - c0
		}
	}()
	if rv.grpN != 0 {
		rv.seg.inflight.Add(rv.grpN)
		rv.tin.Add(rv.grpN)
		rv.grpN = 0
	}
	rv.seg, rv.rbuf = nil, nil
	e := rv.e
	s := e.segs.acquire(r.Target)
	if s == nil {
		return fmt.Errorf("%w: id %d", ErrSegmentNotFound, r.Target)
	}
	t.seg = s
	st := s.state.Load()
	if st.gone {
		return fmt.Errorf("%w: %s is gone", ErrSegmentNotFound, s.name)
	}
	slot, ref, err := e.connect(e.ctx, s, st, rv.ts, r.Transport, t)
	if err != nil {
		return err
	}
	rv.seg, rv.target, rv.hint = s, r.Target, r.Transport
	rv.st, rv.slot, rv.ref, rv.tin = st, slot, ref, t.tin
	rv.sliceMax = e.cfg.SliceSize
	if rv.sliceMax == 0 {
		rv.sliceMax = rv.ts.slots[slot].SliceSize()
	}
	return nil
}

// admit counts t as in flight on the transport of slot, unless an
// Uninstall of that transport wins: then it fails with ErrNoTransport. A
// refused Uninstall only delays it. Counting before looking pairs with
// Uninstall flagging before counting, so a task is never dispatched to a
// transport closed (its region keys cleared) under it.
func (e *Engine) admit(t *task, ts *transportSet, slot int) error {
	tr := ts.slots[slot]
	for {
		ts.inflight[slot].Add(1)
		if !ts.closing[slot].Load() && e.transports.Load().slots[slot] == tr {
			t.tin = &ts.inflight[slot]
			return nil
		}
		ts.inflight[slot].Add(-1)
		if e.transports.Load().slots[slot] != tr {
			return fmt.Errorf("%w: %s was uninstalled", ErrNoTransport, tr.Name())
		}
		runtime.Gosched() // an Uninstall is deciding
	}
}

// peerFor is peer with the engine's own bounded context, for connections
// first needed by Submit.
func (e *Engine) peerFor(ctx context.Context, s *remoteSegment, st *segState, slot int) (*peerRef, error) {
	if ref := st.peers[slot].Load(); ref != nil {
		return ref, nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.MetadataTimeout)
	defer cancel()
	return e.peer(ctx, s, st, slot)
}

// Status returns one task's state.
func (e *Engine) Status(id BatchID, taskIdx int) (TaskStatus, error) {
	defer cost.Status.Since(cost.Now())
	b := e.batches.get(id)
	if b == nil {
		return TaskStatus{}, fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	if taskIdx < 0 || int64(taskIdx) >= b.submitted.Load() {
		return TaskStatus{}, fmt.Errorf("%w: %d (batch has %d)", ErrInvalidTask, taskIdx, b.submitted.Load())
	}
	return b.tasks[taskIdx].status(), nil
}

func (t *task) status() TaskStatus {
	s := t.get()
	st := TaskStatus{State: s, Transferred: t.moved(s), Transport: t.tname, Layer: t.layer()}
	if st.State == StateFailed || st.State == StateCanceled {
		t.mu.Lock()
		st.Err = t.err
		t.mu.Unlock()
	}
	return st
}

// BatchStatus aggregates the batch's submitted tasks: PENDING while any is
// in flight, else FAILED if any failed (Err is the first failed task's
// error), else COMPLETED. Transferred is the sum over tasks. A batch with
// no tasks is COMPLETED.
func (e *Engine) BatchStatus(id BatchID) (TaskStatus, error) {
	defer cost.Status.Since(cost.Now())
	b := e.batches.get(id)
	if b == nil {
		return TaskStatus{}, fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	out := TaskStatus{State: StateCompleted, Layer: LayerCompleted}
	n := int(b.submitted.Load())
	if b.pending.Load() == 0 && !b.bad.Load() && b.nnotes == 0 {
		// Every task completed: the batch's totals say all of it,
		// without a visit to each task.
		out.Transferred = b.transferred.Load()
		if p := b.tnames.Load(); p != nil {
			out.Transport = *p
		}
		return out, nil
	}
	for i := range b.tasks[:n] {
		ts := b.tasks[i].status()
		if ts.Layer.behind(out.Layer) {
			out.Layer = ts.Layer
		}
		out.Transferred += ts.Transferred
		if ts.Transport != "" && ts.Transport != out.Transport && !inList(out.Transport, ts.Transport) {
			if out.Transport != "" {
				out.Transport += ","
			}
			out.Transport += ts.Transport
		}
		switch ts.State {
		case StatePending:
			out.State = StatePending
		case StateFailed, StateCanceled:
			if out.State != StatePending && out.State != StateFailed {
				out.State = ts.State
			}
			if out.Err == nil || errors.Is(out.Err, ErrCanceled) && ts.State == StateFailed {
				out.Err = ts.Err
			}
		}
	}
	if out.State == StateCompleted && b.pending.Load() > 0 {
		out.State = StatePending // a notification still on its way
	}
	if out.State == StateCompleted {
		for _, nt := range b.notes[:b.nnotes] {
			if nt.err != nil {
				out.State, out.Err = StateFailed, fmt.Errorf("engine: notification %q: %w", nt.Name, nt.err)
				break
			}
		}
	}
	if out.State == StatePending {
		out.Err = nil
	}
	return out, nil
}

// Wait blocks until every submitted task of the batch has finished or ctx
// ends. It returns nil when all completed, an error wrapping the first
// failed task's error otherwise, or ctx's error. It does not allocate when
// all tasks complete.
func (e *Engine) Wait(ctx context.Context, id BatchID) error {
	defer cost.Wait.Since(cost.Now())
	b := e.batches.get(id)
	if b == nil {
		return fmt.Errorf("%w: %#x", ErrInvalidBatch, uint64(id))
	}
	if b.pending.Load() > 0 {
		// Transports that let the waiter read its completions itself
		// save the hand-off from their goroutine to this one.
		ts := e.transports.Load()
		for _, h := range ts.helper {
			if h != nil {
				h.Help(ctx, b.finished)
				if b.pending.Load() == 0 {
					break
				}
			}
		}
	}
	for b.pending.Load() > 0 {
		select {
		case <-b.notify:
		case <-ctx.Done():
			return fmt.Errorf("engine: wait: %w", ctx.Err())
		}
	}
	// Pass the wake-up on to any other waiter.
	select {
	case b.notify <- struct{}{}:
	default:
	}
	n := int(b.submitted.Load())
	for i := range b.tasks[:n] {
		t := &b.tasks[i]
		if t.failed.Load() {
			st := t.status()
			failed := 0
			for j := range b.tasks[:n] {
				if b.tasks[j].failed.Load() {
					failed++
				}
			}
			return fmt.Errorf("engine: batch: %d of %d tasks failed; task %d: %w", failed, n, i, st.Err)
		}
	}
	for _, nt := range b.notes[:b.nnotes] {
		if nt.err != nil {
			return fmt.Errorf("engine: batch: notification %q: %w", nt.Name, nt.err)
		}
	}
	return nil
}

// Transfer submits reqs as one batch, waits for it and frees it: the
// synchronous form of AllocateBatch, Submit, Wait and FreeBatch. If ctx
// ends first it returns ctx's error and the batch is freed in the
// background once its tasks have finished — never while a completion may
// still write it.
func (e *Engine) Transfer(ctx context.Context, reqs []Request) error {
	return e.transfer(ctx, reqs, nil, LocalSegment)
}

// transfer is Transfer, with a notification n (when not nil) to seg.
func (e *Engine) transfer(ctx context.Context, reqs []Request, n *Notify, seg SegmentID) error {
	b, err := e.AllocateBatch(max(len(reqs), 1))
	if err != nil {
		return err
	}
	if err := e.submit(b, reqs, n, seg); err != nil {
		e.FreeBatch(b)
		return err
	}
	werr := e.Wait(ctx, b)
	if ferr := e.FreeBatch(b); ferr != nil {
		// Still in flight (ctx ended): free it when it finishes. Close
		// fails whatever is in flight, so this goroutine ends with it.
		e.bgMu.Lock()
		if !e.closed.Load() {
			e.bg.Add(1)
			go func() {
				defer e.bg.Done()
				e.Wait(context.Background(), b)
				e.FreeBatch(b)
			}()
		}
		e.bgMu.Unlock()
	}
	return werr
}

// inList says whether name is an item of the comma-separated list,
// without allocating (BatchStatus runs once per batch on the data path).
func inList(list, name string) bool {
	for list != "" {
		var item string
		item, list, _ = strings.Cut(list, ",")
		if item == name {
			return true
		}
	}
	return false
}
