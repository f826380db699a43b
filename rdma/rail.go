package rdma

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/uverbs"
)

// maxChain bounds the work requests posted with one doorbell.
const maxChain = 32

type itemKind uint8

const (
	itemSlice   itemKind = iota // post a slice on ep
	itemReady                   // ep's handshake ended (ready or failed)
	itemClose                   // ep's peer closed or ep was evicted
	itemDown                    // the rail's port went down
	itemCall                    // run fn on the owner, then close done
	itemNote                    // send a notification on ep
	itemCredit                  // ep's QP qp got num notification credits back
	itemRecycle                 // receive buffer buf was delivered: post it again
	itemMark                    // post note's markers on every QP of ep
)

// item is what submitters and control goroutines hand a rail's owner.
type item struct {
	kind itemKind
	s    *driver.Slice
	tr   *noteTrack // s belongs to a submission with a notification
	note *outNote
	ep   *endpoint
	rkey uint32
	cred credit
	buf  int32
	err  error
	fn   func()
	done chan struct{}
}

// slot is a posted work request; wr_id is gen<<32 | index.
type slot struct {
	s      *driver.Slice // nil while free, or after its slice timed out
	tr     *noteTrack    // s's submission's notification, if any
	note   *outNote      // a notification's SEND (s is nil)
	mark   bool          // the SEND is one of note's markers
	q      *qpState      // nil while free
	posted time.Duration // rail clock at the post
	n      uint64
	rkey   uint32
	gen    uint32
	buf    int32 // the SEND's buffer in spool
	next   int32 // free list
}

// ErrSliceTimeout: a work request did not complete within
// Config.SliceTimeout of its post. It wraps driver.ErrTimeout.
var ErrSliceTimeout = control.Mark(errors.New("rdma: work request not completed in time"), driver.ErrTimeout)

// sliceTimeoutBounds is how many uverbs.RetryBounds the default
// Config.SliceTimeout is.
const sliceTimeoutBounds = 4

// RailStats are one rail's counters.
type RailStats struct {
	Device string `json:"device"`
	Up     bool   `json:"up"`
	// Bytes and Slices count completed WRITE and READ slices.
	Bytes  uint64 `json:"bytes"`
	Slices uint64 `json:"slices"`
	// Errors counts failed work requests.
	Errors uint64 `json:"errors"`
	// Outstanding is the bytes posted or queued and not yet completed.
	Outstanding int64 `json:"outstanding"`
	// Rate is the measured bytes per second while busy (0: not yet).
	Rate uint64 `json:"rate"`
}

// rail is one device port with its owner goroutine.
type rail struct {
	t         *Transport
	idx       int
	v         railVerbs
	name      string
	numa      int
	port      uverbs.RCPort
	sendDepth int
	log       *slog.Logger

	up          atomic.Bool
	outstanding atomic.Int64
	// rate is the rail's measured throughput in bytes per second while it
	// had work in flight (0 until measured); rail choice weighs bytes
	// outstanding by it, so one batch splits over unequal rails by speed.
	rate   atomic.Uint64
	bytes  atomic.Uint64
	slices atomic.Uint64
	errs   atomic.Uint64

	inMu    sync.Mutex
	in      []item
	stopped bool // set under inMu once the owner is gone
	wake    chan struct{}
	quit    chan struct{}
	ownerWG sync.WaitGroup

	// Slices held back (Config.RailPostBytes): heldMu guards held[hh:],
	// which the owner posts from the front and an idle sibling rail takes
	// from the back (steal); nheld mirrors its length for the siblings,
	// heldShut is set once the owner has failed what was left. hungry: the
	// owner sleeps with room to post and nothing held, so a sibling that
	// holds slices wakes it.
	heldMu   sync.Mutex
	held     []item
	hh       int
	heldShut bool
	nheld    atomic.Int32
	hungry   atomic.Bool
	helpWG   sync.WaitGroup

	// sliceTimeout is Config.SliceTimeout or its default for this rail.
	sliceTimeout time.Duration

	// Owner goroutine only.
	// clock is the time since born, read once per owner loop; nextScan
	// is when the owner next looks for timed-out slots; timer wakes a
	// sleeping owner for it.
	born     time.Time
	clock    time.Duration
	nextScan time.Duration
	timer    *time.Timer
	work     []item
	// holdCap is Config.RailPostBytes with more than one rail, else 0 (no
	// holding back); posted counts the bytes of the slices posted and not
	// completed; hold collects one round's slices to hold; take is what
	// refill and steal move out of a held queue.
	holdCap  int64
	posted   int64
	hold     []item
	take     []item
	slots    []slot
	free     int32
	inflight int
	wc       []uverbs.WC
	wrs      []uverbs.SendWR
	sges     []uverbs.SGE
	chainQ   *qpState
	blocked  []*endpoint
	eps      []*endpoint
	// Notifications: receive buffers (target) and SEND sources
	// (initiator), both mapped on first use; receives posted.
	rpool   *bufPool
	spool   *bufPool
	rposted int
	// recvBudget bounds rposted: the CQ's entries set aside for receives.
	recvBudget int
	rwr        [1]uverbs.RecvWR
	rsge       [1]uverbs.SGE
	delivery   driver.Delivery // deliverNow's
	// Busy totals for the rate: bytes completed and time passed while the
	// rail never ran empty (an idle rail's rate says nothing of its speed).
	winStart  time.Time
	busyBytes uint64
	busyTime  time.Duration
	polled    uint64
	// The successful slices of one poll and their bytes (finishOK).
	okDone []*driver.Slice
	// okTracks are the notification trackers of okDone's slices that
	// have one.
	okTracks []*noteTrack
	okBytes  uint64
	// The run of them on one endpoint and op, for its counters.
	okEP      *endpoint
	okOp      driver.Op
	okEPBytes uint64
	okEPN     uint64
}

// rateWindow is the busy time measured before a rail has a rate;
// rateMemory is the busy time after which old measurements weigh half.
const (
	rateWindow = 50 * time.Millisecond
	rateMemory = 2 * time.Second
)

func openRail(t *Transport, idx int, v railVerbs) *rail {
	cfg := &t.cfg
	r := &rail{t: t, idx: idx, v: v, name: v.Name(), numa: v.NUMANode(), port: v.Port(),
		wake: make(chan struct{}, 1), quit: make(chan struct{}), free: -1, log: t.log.With("rail", v.Name())}
	r.sendDepth = cfg.SendDepth
	if r.port.MaxQPWR > 0 {
		r.sendDepth = min(r.sendDepth, r.port.MaxQPWR)
	}
	// One slot per CQE the CQ holds, less the receives the rail may post
	// for notifications (a quarter at most): a completion can never be
	// lost to overflow, whatever the number of QPs.
	cqes := min(cfg.CQDepth, v.CQEntries())
	r.recvBudget = min(cfg.NotifyBuffers, cqes/4)
	r.slots = make([]slot, cqes-r.recvBudget)
	for i := range r.slots {
		r.slots[i].next = r.free
		r.free = int32(i)
	}
	r.wc = make([]uverbs.WC, 64)
	r.okDone = make([]*driver.Slice, 0, len(r.wc))
	r.wrs = make([]uverbs.SendWR, 0, maxChain)
	r.sges = make([]uverbs.SGE, maxChain)
	st, err := v.PortState()
	r.up.Store(err != nil || st == uverbs.PortActive)
	r.sliceTimeout = cfg.SliceTimeout
	if r.sliceTimeout <= 0 {
		to, rc := t.qpTiming(r.port)
		r.sliceTimeout = sliceTimeoutBounds * uverbs.RetryBound(to, rc)
	}
	r.born = time.Now()
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	return r
}

func (r *rail) start() {
	if len(r.t.rails) > 1 && r.t.cfg.RailPostBytes > 0 {
		r.holdCap = r.t.cfg.RailPostBytes
	}
	r.ownerWG.Add(1)
	go r.run()
	r.helpWG.Add(2)
	go r.waitEvents()
	go r.watchPort()
}

// waitEvents turns completion events into owner wake-ups until the verbs
// are closed (closeVerbs).
func (r *rail) waitEvents() {
	defer r.helpWG.Done()
	for r.v.WaitEvent() == nil {
		r.kick()
	}
}

// watchPort follows the port's state through async events.
func (r *rail) watchPort() {
	defer r.helpWG.Done()
	for ev := range r.v.Events() {
		switch ev.Type {
		case uverbs.EventPortErr:
			if ev.Port == int(r.port.Num) && r.up.Swap(false) {
				r.log.Warn("rdma: rail down", "event", ev.String())
				r.enqueue(item{kind: itemDown})
			}
		case uverbs.EventPortActive:
			if ev.Port == int(r.port.Num) && !r.up.Swap(true) {
				r.log.Info("rdma: rail up", "event", ev.String())
			}
		case uverbs.EventQPFatal, uverbs.EventQPReqErr, uverbs.EventQPAccessErr, uverbs.EventDeviceFatal:
			r.log.Warn("rdma: async error", "event", ev.String())
		}
	}
}

func (r *rail) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// enqueue hands an item to the owner. After the owner stopped, a slice
// fails at once with ErrClosed.
func (r *rail) enqueue(it item) {
	r.inMu.Lock()
	if r.stopped {
		r.inMu.Unlock()
		switch it.kind {
		case itemSlice:
			r.finish(it.s, it.tr, it.ep, 0, fmt.Errorf("rdma: %w", driver.ErrClosed))
		case itemNote:
			it.ep.busy.Add(-1)
			it.note.finish(fmt.Errorf("rdma: %w", driver.ErrClosed))
		case itemMark:
			r.failMarks(it.ep, it.note, fmt.Errorf("rdma: %w", driver.ErrClosed))
		case itemReady, itemClose:
			// A handshake that ended after the owner stopped: nothing was
			// posted on its QPs, destroy them here.
			for _, q := range it.ep.qps {
				q.qp.Close()
			}
		}
		return
	}
	r.in = append(r.in, it)
	r.inMu.Unlock()
	r.kick()
}

// call runs fn on the rail's owner goroutine and returns when fn has.
// Every QP of the rail is created, connected, moved and destroyed on the
// owner, directly or through call: destroying a QP takes the CQ's
// single-owner guard (mlx5 cleans the CQ of the QP's completions under
// it), and an owner whose Poll or Arm found the guard taken could go to
// sleep on an unarmed CQ and miss a completion. Once the owner has
// stopped, fn runs on the caller. Never call it from the owner.
func (r *rail) call(fn func()) {
	done := make(chan struct{})
	r.inMu.Lock()
	if r.stopped {
		r.inMu.Unlock()
		fn()
		return
	}
	r.in = append(r.in, item{kind: itemCall, fn: fn, done: done})
	r.inMu.Unlock()
	r.kick()
	<-done
}

// enqueueSlices hands the owner those of rs routed to this rail, under one
// lock and with one wake-up. After the owner stopped, they fail at once
// with ErrClosed.
func (r *rail) enqueueSlices(rs []routed) {
	i := 0
	for i < len(rs) && rs[i].ep.r != r {
		i++
	}
	if i == len(rs) {
		return
	}
	if enqueueHook != nil {
		enqueueHook(r.idx)
	}
	r.inMu.Lock()
	if r.stopped {
		r.inMu.Unlock()
		for _, rt := range rs[i:] {
			if rt.ep.r == r {
				r.finish(rt.s, rt.tr, rt.ep, 0, fmt.Errorf("rdma: %w", driver.ErrClosed))
			}
		}
		return
	}
	for _, rt := range rs[i:] {
		if rt.ep.r == r {
			r.in = append(r.in, item{kind: itemSlice, s: rt.s, tr: rt.tr, ep: rt.ep, rkey: rt.rkey})
		}
	}
	r.inMu.Unlock()
	r.kick()
}

// run is the owner goroutine: the only one to post on this rail's QPs and
// to poll its CQ.
func (r *rail) run() {
	defer r.ownerWG.Done()
	idle := 0
	for {
		r.clock = time.Since(r.born)
		if (r.inflight > 0 || len(r.blocked) > 0) && r.clock >= r.nextScan {
			r.expire()
		}
		r.inMu.Lock()
		r.work, r.in = r.in, r.work[:0]
		r.inMu.Unlock()
		had := len(r.work) > 0
		c0 := cost.Now()
		for i := range r.work {
			it := r.work[i]
			r.work[i] = item{}
			r.handle(it)
		}
		if r.holdCap > 0 {
			had = r.refill() || had
		}
		r.flushChain()
		if had {
			cost.Move.Since(c0)
		}
		n := r.poll()
		if n > 0 || had {
			idle = 0
			continue
		}
		select {
		case <-r.quit:
			r.shutdown()
			return
		default:
		}
		if r.inflight > 0 && idle < r.t.cfg.SpinPolls {
			idle++
			runtime.Gosched()
			continue
		}
		idle = 0
		r.setHungry()
		if r.inflight == 0 && r.rposted == 0 && len(r.blocked) == 0 {
			select {
			case <-r.wake:
			case <-r.quit:
			}
			r.hungry.Store(false)
			continue
		}
		// Arm, then poll once more: a completion that landed before the
		// arm raises no event. Asleep, wake for the next timeout scan (or
		// soon, if the CQ could not be armed); with only receives posted,
		// on an event alone.
		wait := time.Duration(-1)
		if r.inflight > 0 || len(r.blocked) > 0 {
			wait = max(r.nextScan-r.clock, time.Millisecond)
		}
		if err := r.v.Arm(); err != nil {
			r.log.Error("rdma: arm CQ", "err", err)
			wait = time.Millisecond
		}
		if r.poll() > 0 {
			r.hungry.Store(false)
			continue
		}
		if wait < 0 {
			select {
			case <-r.wake:
			case <-r.quit:
			}
			r.hungry.Store(false)
			continue
		}
		r.timer.Reset(wait)
		select {
		case <-r.wake:
		case <-r.quit:
		case <-r.timer.C:
		}
		r.timer.Stop()
		r.hungry.Store(false)
	}
}

// setHungry tells the siblings, before the owner sleeps, whether it could
// take slices they hold.
func (r *rail) setHungry() {
	if r.holdCap > 0 && r.posted < r.holdCap && r.nheld.Load() == 0 {
		r.hungry.Store(true)
	}
}

// holds says whether a slice for a ready endpoint waits in the rail
// rather than being posted now: the rail has its RailPostBytes posted,
// or slices held before it (they go first). A slice whose submission
// carries a notification is never held: its markers follow the
// endpoints its slices were routed to.
func (r *rail) holds(it *item) bool {
	return r.holdCap > 0 && it.tr == nil && (len(r.hold) > 0 || r.nheld.Load() > 0 || r.posted >= r.holdCap)
}

// refill moves this round's held slices behind those held before and
// posts from the front of the queue while the rail has room; with none
// of its own held, it takes some that a sibling holds (steal). It says
// whether it posted any.
func (r *rail) refill() bool {
	if len(r.hold) == 0 && r.nheld.Load() == 0 {
		return r.posted < r.holdCap && r.steal()
	}
	r.heldMu.Lock()
	if r.heldShut {
		r.heldMu.Unlock()
		// The owner is shutting down: the held slices fail with the rest.
		r.failHeld(r.hold)
		r.hold = r.hold[:0]
		return true
	}
	r.held = append(r.held, r.hold...)
	clear(r.hold)
	r.hold = r.hold[:0]
	for room := r.holdCap - r.posted; r.hh < len(r.held) && room > 0; r.hh++ {
		room -= int64(len(r.held[r.hh].s.Local))
		r.take = append(r.take, r.held[r.hh])
		r.held[r.hh] = item{}
	}
	r.compactHeld()
	left := len(r.held) - r.hh
	r.nheld.Store(int32(left))
	r.heldMu.Unlock()
	took := len(r.take) > 0
	r.postTaken()
	if left > 0 {
		for _, o := range r.t.rails {
			if o != r && o.hungry.Load() {
				o.kick()
			}
		}
	}
	return took
}

// compactHeld keeps the held queue's array from growing while it never
// runs empty (heldMu held).
func (r *rail) compactHeld() {
	if r.hh == len(r.held) {
		r.held, r.hh = r.held[:0], 0
	} else if r.hh > len(r.held)/2 {
		n := copy(r.held, r.held[r.hh:])
		clear(r.held[n:])
		r.held, r.hh = r.held[:n], 0
	}
}

// postTaken posts the slices refill or steal took.
func (r *rail) postTaken() {
	for i := range r.take {
		it := r.take[i]
		r.take[i] = item{}
		r.postSlice(it)
	}
	r.take = r.take[:0]
}

// steal takes, for a rail with room and nothing of its own held, up to
// its room and at most half of what a sibling holds, from the back of the
// sibling's queue, and posts it on this rail's endpoint to the same peer,
// each slice only while this rail, at its measured rate, would be done
// with it before the sibling would (with what the sibling has posted and
// held before it), so a slower rail does not take work it would finish
// last. Only slices this rail could have been given move: to a peer
// whose endpoint on this rail is ready, allowed by the region's preferred
// rails.
func (r *rail) steal() bool {
	if !r.up.Load() {
		return false
	}
	k := len(r.t.rails)
	for i := 1; i < k; i++ {
		if o := r.t.rails[(r.idx+i)%k]; o.nheld.Load() > 0 && r.stealFrom(o) {
			return true
		}
	}
	return false
}

func (r *rail) stealFrom(o *rail) bool {
	o.heldMu.Lock()
	if o.heldShut {
		o.heldMu.Unlock()
		return false
	}
	room := r.holdCap - r.posted
	want := (len(o.held) - o.hh + 1) / 2
	rate, orate := float64(r.rate.Load()), float64(o.rate.Load())
	if rate == 0 || orate == 0 { // not measured yet: as fast as the other
		rate, orate = 1, 1
	}
	mine, theirs := float64(r.posted), float64(o.outstanding.Load())
	j := len(o.held)
	for i := len(o.held) - 1; i >= o.hh && want > 0 && room > 0; i-- {
		it := o.held[i]
		n := int64(len(it.s.Local))
		if (mine+float64(n))/rate >= theirs/orate {
			break
		}
		ep := r.stealable(&it)
		if ep == nil {
			j--
			o.held[j] = it
			continue
		}
		room -= n
		want--
		mine += float64(n)
		theirs -= float64(n)
		it.ep.busy.Add(-1)
		ep.busy.Add(1)
		o.outstanding.Add(-n)
		r.outstanding.Add(n)
		r.take = append(r.take, item{kind: itemSlice, s: it.s, ep: ep, rkey: remoteKeys(it.s, r.t.proto())[ep.rrail]})
	}
	if len(r.take) > 0 {
		// o.held[j:] are the ones passed by, in order; close the gap.
		cut := len(o.held) - len(r.take) - (len(o.held) - j)
		n := copy(o.held[cut:], o.held[j:])
		clear(o.held[cut+n:])
		o.held = o.held[:cut+n]
		o.nheld.Store(int32(len(o.held) - o.hh))
	}
	o.heldMu.Unlock()
	if len(r.take) == 0 {
		return false
	}
	r.postTaken()
	return true
}

// stealable returns this rail's endpoint for a slice held by a sibling
// rail, or nil if the slice cannot move here (see steal).
func (r *rail) stealable(it *item) *endpoint {
	p := it.ep.p
	if p.closed.Load() {
		return nil
	}
	bit := uint64(1) << (r.idx % 64)
	usable := p.usable(len(r.t.rails))
	if usable&bit == 0 {
		return nil
	}
	if pu := it.s.LocalKey.(*regKey).prefer & usable; pu != 0 && pu&bit == 0 {
		return nil
	}
	rr := remoteRail(r.idx, p.nRemote)
	if rr >= len(remoteKeys(it.s, r.t.proto())) {
		return nil
	}
	ep := p.eps[r.idx*p.nRemote+rr].Load()
	if ep == nil || ep.r != r || ep.state.Load() != epReady {
		return nil
	}
	return ep
}

// failHeld fails held slices with the transport's closing error.
func (r *rail) failHeld(its []item) {
	closed := fmt.Errorf("rdma: transport closed: %w", driver.ErrClosed)
	for i := range its {
		it := its[i]
		its[i] = item{}
		r.finish(it.s, it.tr, it.ep, 0, closed)
	}
}

// expire fails the slices whose work requests have been posted for
// longer than the rail's slice timeout, and breaks their endpoints (what
// else is posted there flushes; the endpoint is rebuilt on next use). An
// expired slot stays taken, with its credit, until its work request
// completes or flushes: the device may still write its memory until then.
func (r *rail) expire() {
	r.nextScan = r.clock + r.sliceTimeout/4
	if len(r.blocked) > 0 {
		r.expireNotes()
		r.serviceBlocked()
	}
	for i := range r.slots {
		sl := &r.slots[i]
		if sl.s == nil || r.clock-sl.posted < r.sliceTimeout {
			continue
		}
		s, tr, ep := sl.s, sl.tr, sl.q.ep
		sl.s, sl.tr = nil, nil
		err := fmt.Errorf("rdma: %s of %d bytes on %s to %s rail %d: %w: none %v after the post (Config.SliceTimeout): %w",
			s.Op, sl.n, r.name, ep.p.name, ep.rrail, ErrSliceTimeout, r.sliceTimeout, driver.ErrTransient)
		// Break first, so a retry that Done submits at once finds a
		// fresh endpoint rather than this one.
		r.breakEP(ep, err)
		r.finish(s, tr, ep, 0, err)
	}
}

func (r *rail) handle(it item) {
	ep := it.ep
	switch it.kind {
	case itemSlice:
		if ep.state.Load() == epReady && r.holds(&it) {
			r.hold = append(r.hold, it)
			return
		}
		r.postSlice(it)
	case itemReady:
		switch err := ep.failure(); {
		case ep.state.Load() == epReady:
			r.eps = append(r.eps, ep)
			r.drain(ep)
		case errors.Is(err, errRemoteRailDown) && ep.p.usable(len(r.t.rails))&(1<<(r.idx%64)) == 0:
			// The peer's rail paired with this one is down and another
			// pairing is usable: the waiting slices were never posted,
			// so they go there instead.
			for i, p := range ep.waiting {
				ep.waiting[i] = pend{}
				if p.mark != nil {
					r.failMarks(ep, p.mark, err)
					continue
				}
				r.outstanding.Add(-int64(len(p.s.Local)))
				ep.busy.Add(-1)
				r.t.submit(p.s, p.tr)
			}
			ep.waiting = ep.waiting[:0]
			for i, n := range ep.notes {
				ep.notes[i] = nil
				ep.busy.Add(-1)
				r.t.sendNote(n)
			}
			ep.notes = ep.notes[:0]
		default:
			r.failWaiting(ep, err)
		}
	case itemNote:
		switch ep.state.Load() {
		case epReady:
			if len(ep.notes) > 0 || !r.postNote(ep, it.note) {
				it.note.since = r.clock
				ep.notes = append(ep.notes, it.note)
				r.block(ep)
			}
		case epConnecting:
			it.note.since = r.clock
			ep.notes = append(ep.notes, it.note)
		default:
			r.noteFailed(ep, it.note, ep.failure())
		}
	case itemMark:
		switch ep.state.Load() {
		case epReady:
			if len(ep.waiting) > 0 || !r.postMarks(ep, it.note) {
				ep.waiting = append(ep.waiting, pend{mark: it.note, since: r.clock})
				r.block(ep)
			}
		case epConnecting:
			ep.waiting = append(ep.waiting, pend{mark: it.note, since: r.clock})
		default:
			r.failMarks(ep, it.note, ep.failure())
		}
	case itemCredit:
		r.credited(ep, it.cred)
	case itemRecycle:
		r.recycle(it.buf)
	case itemClose:
		r.closeEP(ep, it.err)
	case itemDown:
		r.breakAll()
	case itemCall:
		it.fn()
		close(it.done)
	}
}

// postSlice posts a slice on its endpoint, or queues it there until the
// endpoint is ready or has a credit, or fails it with the endpoint.
func (r *rail) postSlice(it item) {
	ep := it.ep
	switch ep.state.Load() {
	case epReady:
		if len(ep.waiting) > 0 || !r.post(ep, it.s, it.tr, it.rkey) {
			ep.waiting = append(ep.waiting, pend{s: it.s, tr: it.tr, rkey: it.rkey})
			r.block(ep)
		}
	case epConnecting:
		ep.waiting = append(ep.waiting, pend{s: it.s, tr: it.tr, rkey: it.rkey})
	default:
		r.finish(it.s, it.tr, ep, 0, ep.failure())
	}
}

// enqueueHook, set only by tests, sees each time Submit takes a rail's
// queue lock.
var enqueueHook func(rail int)

// postHook, set only by tests, sees every work request as it is built:
// the epoch of the peer incarnation its QP is connected to, and the rkey
// and remote range it carries.
var postHook func(epoch uint64, rkey uint32, addr, n uint64)

// post adds one slice to the current doorbell chain; false when ep has no
// send credit or the rail no free slot.
func (r *rail) post(ep *endpoint, s *driver.Slice, tr *noteTrack, rkey uint32) bool {
	if r.free < 0 {
		return false
	}
	q := ep.pickQP()
	if q == nil {
		return false
	}
	if r.chainQ != q || len(r.wrs) == maxChain {
		r.flushChain()
		r.chainQ = q
	}
	idx := r.free
	sl := &r.slots[idx]
	r.free = sl.next
	n := uint64(len(s.Local))
	sl.s, sl.tr, sl.q, sl.n, sl.rkey, sl.posted = s, tr, q, n, rkey, r.clock
	sl.gen = (sl.gen + 1) & genMask
	q.credits--
	ep.inflight++
	ep.posted.Add(1)
	r.inflight++
	r.posted += int64(n)
	s.Posted()
	op := uverbs.WRRDMAWrite
	if s.Op == driver.Read {
		op = uverbs.WRRDMARead
	}
	if postHook != nil {
		postHook(ep.p.epoch, rkey, s.RemoteAddr, n)
	}
	k := len(r.wrs)
	r.sges[k] = uverbs.SGE{Addr: s.LocalAddr, Length: uint32(n), LKey: uverbs.LKey(s.LocalKey.(*regKey).lkeys[r.idx])}
	r.wrs = append(r.wrs, uverbs.SendWR{ID: uint64(sl.gen)<<32 | uint64(uint32(idx)), Opcode: op,
		Flags: uverbs.SendSignaled, SGL: r.sges[k : k+1 : k+1], RemoteAddr: s.RemoteAddr, RKey: uverbs.RKey(rkey)})
	return true
}

// flushChain posts the chained work requests of one QP with one doorbell.
func (r *rail) flushChain() {
	if len(r.wrs) == 0 {
		return
	}
	q := r.chainQ
	n, err := q.qp.PostSend(r.wrs)
	if err != nil {
		// The first n are on the queue (rxe: even when its doorbell
		// failed); the rest never reached it.
		perr := fmt.Errorf("rdma: post on QP %#x (%s): %v: %w", uint32(q.qp.QPN()), r.name, err, driver.ErrTransient)
		for i := n; i < len(r.wrs); i++ {
			idx := int32(uint32(r.wrs[i].ID))
			sl := &r.slots[idx]
			if note := sl.note; note != nil {
				mark := sl.mark
				r.spool.put(sl.buf)
				r.release(idx, sl)
				if mark {
					q.ep.busy.Add(-1)
					note.tr.sliceDone(perr)
				} else {
					r.noteFailed(q.ep, note, perr)
				}
				continue
			}
			s, tr, sn := sl.s, sl.tr, sl.n
			r.release(idx, sl)
			r.finish(s, tr, q.ep, sn, perr)
		}
		r.breakEP(q.ep, perr)
	}
	for i := range r.wrs {
		r.wrs[i] = uverbs.SendWR{}
	}
	r.wrs = r.wrs[:0]
	r.chainQ = nil
}

// release frees a slot and the credits it held.
func (r *rail) release(idx int32, sl *slot) {
	q := sl.q
	q.credits++
	q.ep.inflight--
	q.ep.posted.Add(-1)
	r.inflight--
	r.posted -= int64(sl.n)
	*sl = slot{gen: sl.gen, next: r.free}
	r.free = idx
}

// finishOK is finish for a slice that moved all its bytes, on the owner
// inside poll: its counters and its Done wait for the end of the poll
// (flushDone), which completes every such slice at once.
func (r *rail) finishOK(s *driver.Slice, tr *noteTrack, ep *endpoint, n uint64) {
	ep.busy.Add(-1)
	if ep != r.okEP || s.Op != r.okOp {
		r.flushEP()
		r.okEP, r.okOp = ep, s.Op
	}
	r.okEPBytes += n
	r.okEPN++
	r.okBytes += n
	r.polled += n
	r.okDone = append(r.okDone, s)
	if tr != nil {
		r.okTracks = append(r.okTracks, tr)
	}
}

// flushEP adds the endpoint counters of finishOK's current run.
func (r *rail) flushEP() {
	if r.okEPN != 0 {
		r.okEP.ctr.bytes[r.okOp%3].Add(r.okEPBytes)
		r.okEP.ctr.slices[r.okOp%3].Add(r.okEPN)
	}
	r.okEP, r.okEPBytes, r.okEPN = nil, 0, 0
}

// flushDone accounts for and completes the slices finishOK deferred.
func (r *rail) flushDone() {
	if len(r.okDone) == 0 {
		return
	}
	r.flushEP()
	r.outstanding.Add(-int64(r.okBytes))
	r.bytes.Add(r.okBytes)
	r.slices.Add(uint64(len(r.okDone)))
	r.okBytes = 0
	driver.DoneAll(r.okDone)
	clear(r.okDone)
	r.okDone = r.okDone[:0]
	// Their notifications count them after their Done, as sliceDone.
	for i, tr := range r.okTracks {
		r.okTracks[i] = nil
		tr.sliceDone(nil)
	}
	r.okTracks = r.okTracks[:0]
}

// finish completes a slice the rail accepted: n bytes moved (0 on error).
func (r *rail) finish(s *driver.Slice, tr *noteTrack, ep *endpoint, n uint64, err error) {
	r.outstanding.Add(-int64(len(s.Local)))
	ep.busy.Add(-1)
	if err != nil {
		r.errs.Add(1)
		ep.ctr.failures.Add(1)
		n = 0
	} else {
		r.bytes.Add(n)
		r.slices.Add(1)
		ep.ctr.bytes[s.Op%3].Add(n)
		ep.ctr.slices[s.Op%3].Add(1)
		r.polled += n
	}
	sliceDone(s, tr, n, err)
}

// sliceDone completes a slice and then counts it for its submission's
// notification: the notification follows the completion of every slice.
func sliceDone(s *driver.Slice, tr *noteTrack, n uint64, err error) {
	s.Done(n, err)
	if tr != nil {
		tr.sliceDone(err)
	}
}

func (r *rail) poll() int {
	c0 := cost.Now()
	n, err := r.v.Poll(r.wc)
	if err != nil && !errors.Is(err, uverbs.ErrClosed) {
		r.log.Error("rdma: poll CQ", "err", err)
	}
	r.polled = 0
	for i := 0; i < n; i++ {
		r.complete(&r.wc[i])
		r.wc[i] = uverbs.WC{}
	}
	r.flushDone()
	if n > 0 {
		r.measure()
		cost.Complete.Since(c0)
		// Posts that waited for the credits these completions freed.
		c0 = cost.Now()
		if len(r.blocked) > 0 {
			r.serviceBlocked()
			cost.Move.Since(c0)
		}
	}
	return n
}

// measure adds the bytes of this poll and the time since the previous
// one to the rail's busy totals (only while it never ran empty) and sets
// its rate from them: a decayed average over the last seconds of busy
// time, steady even where completions come in bursts.
func (r *rail) measure() {
	now := time.Now()
	if !r.winStart.IsZero() {
		r.busyBytes += r.polled
		r.busyTime += now.Sub(r.winStart)
		if r.busyTime >= rateWindow {
			r.rate.Store(uint64(float64(r.busyBytes) / r.busyTime.Seconds()))
		}
		if r.busyTime > rateMemory {
			r.busyBytes, r.busyTime = r.busyBytes/2, r.busyTime/2
		}
	}
	// The bytes of the first completion after an idle spell were posted
	// before it; only what follows counts.
	r.winStart = now
	if r.inflight == 0 {
		r.winStart = time.Time{}
	}
}

func (r *rail) complete(wc *uverbs.WC) {
	if wc.ID&wrRecv != 0 {
		r.received(wc)
		return
	}
	idx, gen := uint32(wc.ID), uint32(wc.ID>>32)
	if int(idx) >= len(r.slots) || r.slots[idx].gen != gen || r.slots[idx].q == nil {
		r.log.Error("rdma: completion for no posted slice", "wr_id", wc.ID, "status", wc.Status.String())
		return
	}
	sl := &r.slots[idx]
	if sl.note != nil {
		r.noteSent(int32(idx), sl, wc)
		return
	}
	if sl.s == nil {
		// Its slice timed out (expire); the slot was kept until now.
		ep := sl.q.ep
		r.release(int32(idx), sl)
		if ep.state.Load() >= epBroken && ep.inflight == 0 {
			r.teardown(ep)
		}
		return
	}
	s, tr, q, n, rkey := sl.s, sl.tr, sl.q, sl.n, sl.rkey
	ep := q.ep
	r.release(int32(idx), sl)
	if wc.Status == uverbs.WCSuccess && n == uint64(len(s.Local)) {
		r.finishOK(s, tr, ep, n)
	} else if wc.Status == uverbs.WCSuccess {
		r.finish(s, tr, ep, n, nil)
	} else {
		err := r.classify(wc, s, rkey, ep)
		r.breakEP(ep, err)
		r.finish(s, tr, ep, 0, err)
	}
	if ep.state.Load() >= epBroken && ep.inflight == 0 {
		r.teardown(ep)
	}
}

// classify turns a failed completion into the slice's error: transient
// (retried, on another rail where there is one) for retry, RNR and flush
// errors on a live endpoint; ErrPeerReset or ErrClosed when the endpoint
// was closed under it; permanent, naming the key and range, otherwise.
func (r *rail) classify(wc *uverbs.WC, s *driver.Slice, rkey uint32, ep *endpoint) error {
	switch st := ep.state.Load(); {
	case st == epClosed:
		return ep.failure()
	case wc.Status == uverbs.WCWRFlushErr && st == epBroken:
		return ep.failure()
	}
	werr := wc.ErrRemote(uverbs.RKey(rkey), s.RemoteAddr, uint64(len(s.Local)))
	// uverbs' transient class (retry and RNR exceeded, flush), plus rxe's
	// local QP operation error on a port that went down and a response
	// timeout: worth another try on a fresh endpoint, maybe another rail.
	if errors.Is(werr, uverbs.ErrCompletionTransient) || wc.Status == uverbs.WCLocQPOpErr || wc.Status == uverbs.WCRespTimeoutErr {
		r.checkPort()
		return fmt.Errorf("rdma: %s on %s to %s rail %d: %w: %w", s.Op, r.name, ep.p.name, ep.rrail, werr, driver.ErrTransient)
	}
	// Access errors and the rest are permanent; werr names the rkey and
	// the range (errors.Is(err, uverbs.ErrCompletionAccess) for the first).
	return fmt.Errorf("rdma: %s on %s to %s rail %d: %w", s.Op, r.name, ep.p.name, ep.rrail, werr)
}

// checkPort reads the port's state after a failure that a dead link
// explains, so new slices avoid the rail before its async event arrives.
func (r *rail) checkPort() {
	if st, err := r.v.PortState(); err == nil && st != uverbs.PortActive && r.up.Swap(false) {
		r.log.Warn("rdma: rail down", "state", st.String())
		r.breakAll()
	}
}

// breakAll breaks every endpoint of the rail (its port went down).
func (r *rail) breakAll() {
	err := fmt.Errorf("rdma: rail %s down: %w", r.name, driver.ErrTransient)
	// Backwards: teardown moves the last endpoint into the freed place.
	for i := len(r.eps) - 1; i >= 0; i-- {
		if i < len(r.eps) {
			r.breakEP(r.eps[i], err)
		}
	}
}

// breakEP stops using ep: its QPs go to the error state so what is still
// posted flushes, and its queued slices fail with err (transient ones are
// retried by the engine on a fresh endpoint).
func (r *rail) breakEP(ep *endpoint, err error) {
	if !ep.state.CompareAndSwap(epReady, epBroken) {
		return
	}
	// What is still queued or posted on ep did nothing wrong: it fails
	// transiently and is retried on a fresh endpoint, whatever broke it.
	if !errors.Is(err, driver.ErrTransient) {
		err = fmt.Errorf("rdma: endpoint to %s rail %d broken by an earlier failure (%v): %w", ep.p.name, ep.rrail, err, driver.ErrTransient)
	}
	ep.setFailure(err)
	r.failWaiting(ep, ep.failure())
	for _, q := range ep.qps {
		if e := q.qp.ToErr(); e != nil && !errors.Is(e, uverbs.ErrClosed) {
			r.log.Warn("rdma: QP to error state", "qpn", uint32(q.qp.QPN()), "err", e)
		}
	}
	if ep.inflight == 0 {
		r.teardown(ep)
	}
}

func (r *rail) closeEP(ep *endpoint, err error) {
	for {
		st := ep.state.Load()
		if st == epClosed {
			break
		}
		if ep.state.CompareAndSwap(st, epClosed) {
			ep.setFailure(err)
			if st == epReady {
				for _, q := range ep.qps {
					q.qp.ToErr()
				}
			}
			break
		}
	}
	r.failWaiting(ep, ep.failure())
	if ep.inflight == 0 {
		r.teardown(ep)
	}
}

func (r *rail) failWaiting(ep *endpoint, err error) {
	for i, p := range ep.waiting {
		ep.waiting[i] = pend{}
		if p.mark != nil {
			r.failMarks(ep, p.mark, err)
			continue
		}
		r.finish(p.s, p.tr, ep, 0, err)
	}
	ep.waiting = ep.waiting[:0]
	notes := ep.notes
	ep.notes = nil
	for _, n := range notes {
		r.noteFailed(ep, n, err)
	}
}

// teardown destroys a broken or closed endpoint's QPs once nothing is
// posted on them, and tells the target to drop its side.
func (r *rail) teardown(ep *endpoint) {
	if ep.torn {
		return
	}
	ep.torn = true
	for _, q := range ep.qps {
		if err := q.qp.Close(); err != nil {
			r.log.Warn("rdma: destroy QP", "qpn", uint32(q.qp.QPN()), "err", err)
		}
	}
	for i, e := range r.eps {
		if e == ep {
			r.eps[i] = r.eps[len(r.eps)-1]
			r.eps[len(r.eps)-1] = nil
			r.eps = r.eps[:len(r.eps)-1]
			break
		}
	}
	ep.p.released(ep)
}

func (r *rail) block(ep *endpoint) {
	if !ep.blocked {
		ep.blocked = true
		r.blocked = append(r.blocked, ep)
	}
}

// drain posts what waits on ep while credits and slots last:
// notifications first (their data has completed), then slices.
func (r *rail) drain(ep *endpoint) {
	j := 0
	for ; j < len(ep.notes); j++ {
		if ep.state.Load() != epReady || !r.postNote(ep, ep.notes[j]) {
			break
		}
	}
	if j > 0 {
		n := copy(ep.notes, ep.notes[j:])
		clear(ep.notes[n:])
		ep.notes = ep.notes[:n]
	}
	if len(ep.notes) > 0 {
		r.block(ep)
	}
	i := 0
	for ; i < len(ep.waiting); i++ {
		p := &ep.waiting[i]
		if ep.state.Load() != epReady {
			break
		}
		if p.mark != nil {
			if !r.postMarks(ep, p.mark) {
				break
			}
		} else if !r.post(ep, p.s, p.tr, p.rkey) {
			break
		}
	}
	if i > 0 {
		n := copy(ep.waiting, ep.waiting[i:])
		clear(ep.waiting[n:])
		ep.waiting = ep.waiting[:n]
	}
	if len(ep.waiting) > 0 {
		r.block(ep)
	}
}

// serviceBlocked retries endpoints that waited for credits or slots.
func (r *rail) serviceBlocked() {
	if len(r.blocked) == 0 {
		return
	}
	bl := r.blocked
	keep := bl[:0]
	for _, ep := range bl {
		ep.blocked = false
		if ep.state.Load() != epReady {
			continue
		}
		r.drain(ep)
		if ep.blocked {
			keep = append(keep, ep)
		}
	}
	clear(bl[len(keep):])
	r.blocked = keep
	r.flushChain()
}

// shutdown runs on the owner when the transport closes: every queued and
// posted slice fails with ErrClosed and every QP is destroyed.
func (r *rail) shutdown() {
	closed := fmt.Errorf("rdma: transport closed: %w", driver.ErrClosed)
	r.inMu.Lock()
	r.stopped = true
	rest := r.in
	r.in = nil
	r.inMu.Unlock()
	r.failHeld(r.hold)
	r.hold = nil
	r.heldMu.Lock()
	r.heldShut = true
	held := r.held[r.hh:]
	r.held, r.hh = nil, 0
	r.nheld.Store(0)
	r.heldMu.Unlock()
	r.failHeld(held)
	for _, it := range rest {
		switch it.kind {
		case itemSlice:
			r.finish(it.s, it.tr, it.ep, 0, closed)
		case itemNote:
			it.ep.busy.Add(-1)
			it.note.finish(closed)
		case itemMark:
			r.failMarks(it.ep, it.note, closed)
		case itemReady, itemClose:
			if !it.ep.torn {
				for _, q := range it.ep.qps {
					q.qp.Close()
				}
			}
		case itemCall:
			it.fn()
			close(it.done)
		}
	}
	for _, ep := range r.eps {
		ep.state.Store(epClosed)
		ep.setFailure(closed)
		r.failWaiting(ep, closed)
		for _, q := range ep.qps {
			q.qp.Close()
		}
		ep.torn = true
	}
	r.eps = nil
	for _, ep := range r.blocked {
		r.failWaiting(ep, closed)
	}
	r.blocked = nil
	for i := range r.slots {
		if sl := &r.slots[i]; sl.note != nil {
			n, ep, mark := sl.note, sl.q.ep, sl.mark
			r.spool.put(sl.buf)
			r.release(int32(i), sl)
			ep.busy.Add(-1)
			if mark {
				n.tr.sliceDone(closed)
			} else {
				n.finish(closed)
			}
		} else if sl.s != nil {
			s, tr, ep := sl.s, sl.tr, sl.q.ep
			r.release(int32(i), sl)
			r.finish(s, tr, ep, 0, closed)
		}
	}
}

func (r *rail) stop() {
	close(r.quit)
	r.ownerWG.Wait()
}

// closeVerbs releases the notification buffers and the device (after
// every QP is destroyed).
func (r *rail) closeVerbs() error {
	return errors.Join(r.rpool.close(), r.spool.close(), r.v.Close())
}

func (r *rail) stats() RailStats {
	return RailStats{Device: r.name, Up: r.up.Load(), Bytes: r.bytes.Load(), Slices: r.slices.Load(),
		Errors: r.errs.Load(), Outstanding: r.outstanding.Load(), Rate: r.rate.Load()}
}
