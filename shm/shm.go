package shm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/internal/hostid"
	"github.com/rdmago/te/internal/ratelog"
	"github.com/rdmago/te/segment"
)

// Defaults.
const (
	// DefaultSliceSize: the engine cuts requests into slices of 1 MiB,
	// the unit spread over copier goroutines.
	DefaultSliceSize = 1 << 20
	// DefaultParallelMin: submissions carrying at least this many bytes
	// are copied by several goroutines. A smaller one stays in the
	// submitter's cache and is copied faster by it alone than shared
	// (128 × 4 KiB, 512 KiB: 1.7× faster alone; docs/cost.md).
	DefaultParallelMin = 2 << 20
	// DefaultIOTimeout bounds a handshake, a control message and an
	// unregistration's wait for a peer's copy.
	DefaultIOTimeout = 5 * time.Second
	// DefaultMaxConns bounds the initiators served at once.
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerSource bounds one process's share of MaxConns.
	DefaultMaxConnsPerSource = 256
)

// wireVersion is the control protocol's version, in the descriptor (the
// shm part's Wire): an initiator chooses shm only for a target that
// speaks its version.
const wireVersion = 2

// Config configures a Transport. Zero fields select defaults.
type Config struct {
	// SliceSize is the largest slice the transport asks the engine for.
	SliceSize uint64
	// Copiers is the number of goroutines, besides the submitting one,
	// that copy the slices of a large submission. Default
	// GOMAXPROCS-1; negative means none.
	Copiers int
	// ParallelMin is the smallest submission (bytes) spread over the
	// copiers.
	ParallelMin uint64
	// IOTimeout bounds handshakes, control messages, and how long an
	// unregistration waits for a peer inside a copy.
	IOTimeout time.Duration
	// MaxConns bounds the initiators' connections served at once. At the
	// bound a new connection takes the slot of the one that has waited
	// longest for its initiator, from the process that holds the most;
	// MaxConnsPerSource bounds one process's connections the same way
	// (default DefaultMaxConnsPerSource, at most MaxConns).
	MaxConns          int
	MaxConnsPerSource int
	// DialOnly: no listener. The transport only maps other segments'
	// memory (an initiator that serves nothing) and adds no entry to the
	// local descriptor.
	DialOnly bool
	// Secret turns cluster authentication on (auth.FromEnv loads it);
	// nil means off. With it, only peers holding the same secret get any
	// memory; without it, a peer that has one refuses this one.
	Secret *auth.Secret
}

// Errors; compare with errors.Is.
var (
	// ErrNotReachable: the segment is not on this host (or belongs to
	// another user, or exposes memory that cannot be shared).
	ErrNotReachable = fmt.Errorf("shm: segment not reachable by shared memory: %w", engine.ErrNoTransport)
	// ErrRefused: the target refused the connection (another user, out
	// of memory). Failed authentication is auth.ErrDenied; a target that
	// restarted (another epoch), driver.ErrPeerReset.
	ErrRefused = control.ErrRefused
	// ErrProtocol: the peer broke the control protocol.
	ErrProtocol = errors.New("shm: protocol violation")
)

// Slice errors, allocated once.
var (
	errGone      = fmt.Errorf("shm: target closed, restarted or unreachable: %w", driver.ErrPeerReset)
	errRevoked   = fmt.Errorf("shm: target unregistered the buffer: %w", driver.ErrOutOfRange)
	errNotShared = fmt.Errorf("shm: target range is not in shared memory: %w", driver.ErrOutOfRange)
	errMapWait   = fmt.Errorf("shm: target did not hand out the buffer in time: %w", driver.ErrPeerReset)
	errForeign   = fmt.Errorf("shm: slice for a foreign peer: %w", engine.ErrInvalidRequest)
	errClosed    = fmt.Errorf("shm: transport closed: %w", driver.ErrClosed)
)

// hostID identifies this host; tests replace it to play another host.
var hostID = defaultHostID

var defaultHostID = hostid.ID

// Transport is the shm transport. Create it with New and hand it to
// engine.Install, which drives it through Driver (the engine/driver
// contract); its own methods are for inspection. It is both target
// (serving its registered memory) and initiator.
type Transport struct {
	cfg    Config
	host   driver.Host
	log    *slog.Logger
	fails  *control.Log
	lost   *ratelog.Log // initiators gone mid-copy
	hostID string
	uid    uint32

	ln       *net.UnixListener
	endpoint string

	closed     atomic.Bool
	submitting atomic.Int64
	pace       pace
	// ctx ends when the transport closes: a target holding a
	// notification waits for its inbox's room until then.
	ctx       context.Context
	cancel    context.CancelFunc
	notesLost atomic.Uint64
	closeOnce sync.Once
	wg        sync.WaitGroup
	copiers   []*copier
	jobs      jobList

	mu      sync.Mutex
	slots   [maxSlots]*sharedRegion // live shared regions
	gen     uint32
	partial int                                // registered regions that are not shared
	gate    *acceptor.Gate[int32, *serverConn] // served connections, by process
	peers   map[*peer]struct{}
}

// sharedRegion is a registered region in shared memory: RegisterMemory's
// key.
type sharedRegion struct {
	r         driver.Region
	slot, gen uint32
	fd        int
	off       uint64
}

// New returns an shm transport; it listens once installed.
func New(cfg Config) *Transport {
	if cfg.SliceSize == 0 {
		cfg.SliceSize = DefaultSliceSize
	}
	if cfg.Copiers == 0 {
		cfg.Copiers = runtime.GOMAXPROCS(0) - 1
	}
	cfg.Copiers = max(cfg.Copiers, 0)
	if cfg.ParallelMin == 0 {
		cfg.ParallelMin = DefaultParallelMin
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = DefaultIOTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerSource <= 0 {
		cfg.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	uid := uint32(os.Geteuid())
	ctx, cancel := context.WithCancel(context.Background())
	return &Transport{cfg: cfg, uid: uid, ctx: ctx, cancel: cancel,
		gate: acceptor.NewGate[int32, *serverConn](cfg.MaxConns, cfg.MaxConnsPerSource), peers: map[*peer]struct{}{}}
}

// sliceSize returns Config.SliceSize.
func (t *Transport) sliceSize() uint64 { return t.cfg.SliceSize }

// Endpoint is the abstract socket name peers connect to (after Install).
func (t *Transport) Endpoint() string { return t.endpoint }

// install listens on a fresh abstract unix socket and starts the copiers.
func (t *Transport) install(h driver.Host) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return driver.ErrClosed
	}
	if t.host != nil {
		return fmt.Errorf("shm: already installed")
	}
	id, err := hostID()
	if err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	t.host, t.log, t.hostID = h, h.Logger(), id
	t.fails = control.NewLog(t.log, segment.ProtoSHM, 0)
	t.lost = ratelog.New(t.log, 0)
	if !t.cfg.DialOnly {
		var rb [12]byte
		rand.Read(rb[:])
		name := "@te-shm-" + hex.EncodeToString(rb[:])
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
		if err != nil {
			t.host = nil
			return fmt.Errorf("shm: listen %s: %w", name, err)
		}
		t.ln, t.endpoint = ln, name
		t.wg.Add(1)
		go t.acceptLoop()
	}
	for range t.cfg.Copiers {
		c := &copier{wake: make(chan struct{}, 1), stop: make(chan struct{})}
		t.copiers = append(t.copiers, c)
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			c.run()
		}()
	}
	return nil
}

// A job is one large submission shared by the submitting goroutine and
// every copier. The submitter takes runs of slices (step of them, about
// stepBytes) from the front, the copiers from the back, until they meet:
// in a loop over the same buffers each goroutine keeps copying the same
// blocks, which stay in its core's cache, where runs taken from one end
// would move them between cores with every batch.
// Nobody waits for anybody to start, so a copier that wakes late (waking
// an idle thread can take tens of microseconds in a VM) only copies less;
// a fixed split would leave the submitter idle until the late share is
// done.
type job struct {
	ss   []*driver.Slice
	step uint32
	// ends holds the unclaimed slices [front, back): front in the low
	// 32 bits, back in the high ones.
	ends atomic.Uint64
	// done counts the slices completed, for the submitter's wait.
	done atomic.Int64
	refs atomic.Int32 // the submitter and each copier it handed the job to
	free *jobList
	// note, when set, follows the job's slices: it learns their failures
	// and is sent once the last of them is done (copyDone), not when the
	// last reference is dropped: a copier handed the job late would hold
	// the note back, not the data.
	note *snote
}

// jobList keeps finished jobs for reuse. It only grows while copiers still
// hold more jobs than ever before, so the steady state allocates nothing
// (a sync.Pool would: it is emptied at every GC).
type jobList struct {
	mu   sync.Mutex
	jobs []*job
}

func (l *jobList) get() *job {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.jobs); n > 0 {
		j := l.jobs[n-1]
		l.jobs = l.jobs[:n-1]
		return j
	}
	return &job{free: l}
}

// stepBytes is about the bytes a goroutine takes from a job at once:
// small slices go in runs, so that taking one costs little next to its
// copy, and large ones one at a time, so that the goroutines end together.
const stepBytes = 64 << 10

// maxStep bounds a run taken from a job.
const maxStep = 16

// take claims the next run of slices from the front or, with back, from
// the back; lo == hi when none is left.
func (j *job) take(back bool) (lo, hi uint32) {
	for {
		e := j.ends.Load()
		f, b := uint32(e), uint32(e>>32)
		if f >= b {
			return 0, 0
		}
		n := min(j.step, b-f)
		if back {
			lo, hi = b-n, b
			b -= n
		} else {
			lo, hi = f, f+n
			f += n
		}
		if j.ends.CompareAndSwap(e, uint64(b)<<32|uint64(f)) {
			return lo, hi
		}
	}
}

// work copies runs of slices, taken from the front or, with back, from
// the back, until the job has none left, and returns how many it copied.
func (j *job) work(back bool) int {
	var res [maxStep]result
	n := 0
	for {
		lo, hi := j.take(back)
		if lo == hi {
			return n
		}
		f := copyDone(j.ss[lo:hi], res[:], true)
		if sn := j.note; sn != nil {
			sn.record(f)
			if sn.left.Add(-int64(hi-lo)) == 0 {
				sn.copied()
			}
		}
		j.done.Add(int64(hi - lo))
		n += int(hi - lo)
	}
}

// await watches, for at most d, until the copiers have finished the
// runs they took, and says whether they did. The submitter's Wait then
// finds the batch done instead of parking until a copier wakes it, which
// moves the submitter to the copier's thread (and core) and the copier
// elsewhere: the next batch would find each goroutine's blocks in the
// other core's cache. A copier that takes longer (descheduled) is not
// waited for.
func (j *job) await(d time.Duration) bool {
	n := int64(len(j.ss))
	if j.done.Load() == n {
		return true
	}
	for t0 := time.Now(); time.Since(t0) < d; {
		runtime.Gosched()
		if j.done.Load() == n {
			return true
		}
	}
	return false
}

// probeEvery: one large submission in probeEvery is copied the way that
// is currently slower, so that a change in load is noticed.
const probeEvery = 16

// pace keeps, for large submissions, how long copying one MiB took
// recently (ns, a moving average; 0: not measured yet) for the
// submitter alone and for it shared with the copiers. Sharing is faster
// when the copiers' CPUs are free and the blocks are larger than a
// core's cache; when those CPUs are busy with other work, or the
// copiers come late, a single goroutine is faster (at 64 KiB, under
// load: 34–38 GB/s shared, 42–48 alone). Measuring both, and choosing
// the faster, follows the machine as its load changes.
type pace struct {
	alone, shared atomic.Int64
	n             atomic.Uint32
}

// share says whether the next large submission is to be shared.
func (p *pace) share() bool {
	al, sh := p.alone.Load(), p.shared.Load()
	var share bool
	switch {
	case sh == 0:
		share = true
	case al == 0:
		share = false
	default:
		share = sh <= al
	}
	if p.n.Add(1)%probeEvery == 0 {
		share = !share
	}
	return share
}

// learn adds a submission of bytes that took d, shared or alone.
func (p *pace) learn(shared bool, bytes uint64, d time.Duration) {
	v := &p.alone
	if shared {
		v = &p.shared
	}
	x := int64(float64(d) * (1 << 20) / float64(max(bytes, 1)))
	if old := v.Load(); old != 0 {
		x = old + (x-old)/4
	}
	v.Store(max(x, 1))
}

// copyDone copies ss (at most len(res) slices) and completes them; it
// returns their failures, for the submission's note.
func copyDone(ss []*driver.Slice, res []result, posted bool) (f failures) {
	c0 := cost.Now()
	ok := copyRun(ss, res, posted)
	c0 = cost.Move.Since(c0)
	if ok {
		driver.DoneAll(ss)
	} else {
		for i, s := range ss {
			if res[i].err != nil {
				f.add(res[i].err)
			}
			s.Done(res[i].n, res[i].err)
		}
		clear(res[:len(ss)])
	}
	cost.Complete.Since(c0)
	return f
}

// release drops one reference; the last one recycles the job.
func (j *job) release() {
	if j.refs.Add(-1) == 0 {
		clear(j.ss)
		j.ss = j.ss[:0]
		j.ends.Store(0)
		j.done.Store(0)
		j.note = nil
		j.free.mu.Lock()
		j.free.jobs = append(j.free.jobs, j)
		j.free.mu.Unlock()
	}
}

// lingerFor is how long a copier keeps looking for the next job.
const lingerFor = 50 * time.Microsecond

// copier is a goroutine that helps with large submissions. A submission
// appends its job to q and wakes it: one lock and one wake-up per
// submission and copier, not per slice.
type copier struct {
	mu      sync.Mutex
	q       []*job
	pending atomic.Bool // q is not empty
	buf     []*job      // the jobs being worked off (run only)
	wake    chan struct{}
	stop    chan struct{}
}

func (c *copier) add(j *job) {
	c.mu.Lock()
	c.q = append(c.q, j)
	c.pending.Store(true)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// retract takes j back if the copier has not picked it up yet, and says
// whether it did. A submitter retracts its job once it has copied every
// slice itself, so jobs never pile up behind a copier that could not run
// (GOMAXPROCS 1, a starved thread).
func (c *copier) retract(j *job) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.q, j); i >= 0 {
		c.q = slices.Delete(c.q, i, i+1)
		c.pending.Store(len(c.q) > 0)
		return true
	}
	return false
}

func (c *copier) run() {
	for {
		select {
		case <-c.wake:
		case <-c.stop:
			c.drain() // Submit no longer runs (Close waited)
			return
		}
		c.drain()
		for c.linger() {
			c.drain()
		}
	}
}

// drain works off every job queued so far.
func (c *copier) drain() {
	c.mu.Lock()
	c.buf, c.q = c.q, c.buf[:0]
	c.pending.Store(false)
	c.mu.Unlock()
	for _, j := range c.buf {
		j.work(true)
		j.release()
	}
	clear(c.buf)
}

// linger watches the queue for a moment after a job before the copier
// parks, and says whether a job came. Back-to-back large submissions (a
// batch loop) then find the copier awake: waking a parked goroutine on an
// idle CPU costs more than this wait, and a late copier copies less.
func (c *copier) linger() bool {
	t0 := time.Now()
	for time.Since(t0) < lingerFor {
		if c.pending.Load() {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// describe adds the shm protocol entry: the socket, the host and user
// identity, and "partial" when some registered memory is not shareable
// (then initiators do not choose shm for this segment).
func (t *Transport) describe(d *segment.Descriptor) error {
	if t.cfg.DialOnly && t.host != nil {
		return nil // serves nothing
	}
	if t.endpoint == "" {
		return fmt.Errorf("shm: not installed")
	}
	part := &segment.SHM{Host: t.hostID, UID: t.uid, Wire: wireVersion, Notify: true}
	t.mu.Lock()
	part.Partial = t.partial
	t.mu.Unlock()
	d.Protocols = append(d.Protocols, segment.Protocol{Name: segment.ProtoSHM, Endpoint: t.endpoint, SHM: part})
	return nil
}

// reaches reports whether d is a segment on this host, of this user, all
// of whose memory is shared. It does not allocate.
func (t *Transport) reaches(d *segment.Descriptor) bool {
	for i := range d.Protocols {
		p := &d.Protocols[i]
		if p.Name != segment.ProtoSHM {
			continue
		}
		s := p.SHM
		return t.hostID != "" && p.Endpoint != "" && s != nil && s.Host == t.hostID && s.UID == t.uid &&
			s.Partial == 0 && s.Wire == wireVersion
	}
	return false
}

// unreachable says why reaches is false for d (nil when it is true): what
// the user must change for shm to carry its bytes.
func (t *Transport) unreachable(d *segment.Descriptor) error {
	p, ok := d.Protocol(segment.ProtoSHM)
	switch {
	case t.reaches(d):
		return nil
	case !ok || p.Endpoint == "":
		return fmt.Errorf("shm: %s does not serve shm", d.Name)
	case p.SHM == nil:
		return fmt.Errorf("shm: %s's shm entry has no shm part (host, user, wire version): it was not written by te's shm transport", d.Name)
	case t.hostID == "" || p.SHM.Host != t.hostID:
		return fmt.Errorf("shm: %s runs on another host (or in another network namespace)", d.Name)
	case p.SHM.UID != t.uid:
		return fmt.Errorf("shm: %s runs as uid %d and this process as uid %d; shm maps memory between processes of one user", d.Name, p.SHM.UID, t.uid)
	case p.SHM.Partial != 0:
		return fmt.Errorf("shm: %d of %s's registered regions are not shared memory: a target's memory must come from engine.AllocShared to be reached by shm", p.SHM.Partial, d.Name)
	default:
		return fmt.Errorf("shm: %s speaks shm wire version %d, this process %d", d.Name, p.SHM.Wire, wireVersion)
	}
}

// registerMemory gives a region in shared memory (engine.AllocShared) a
// slot; other memory is counted as not shareable.
func (t *Transport) registerMemory(r driver.Region) (any, error) {
	fd, off, ok := r.SharedFD()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !ok {
		t.partial++
		return nil, nil
	}
	for i := range t.slots {
		if t.slots[i] == nil {
			t.gen++
			if t.gen == 0 {
				t.gen = 1
			}
			sr := &sharedRegion{r: r, slot: uint32(i), gen: t.gen, fd: fd, off: off}
			t.slots[i] = sr
			return sr, nil
		}
	}
	t.log.Warn("shm: too many shared regions; this one is reachable over other transports only", "max", maxSlots)
	t.partial++
	return nil, nil
}

// unregisterMemory revokes the region from every peer: once it returns, no
// peer copy into it is in progress and none can start.
func (t *Transport) unregisterMemory(r driver.Region, key any) error {
	sr, _ := key.(*sharedRegion)
	t.mu.Lock()
	if sr == nil {
		t.partial--
		t.mu.Unlock()
		return nil
	}
	t.slots[sr.slot] = nil
	t.mu.Unlock()
	// Every peer at once, one deadline for all: a peer stuck inside a
	// copy (or claiming to be: the busy counters live in memory it
	// writes) costs one IOTimeout in all, not one each.
	var mapped []*serverConn
	for _, c := range t.gate.Conns() {
		if c.revokeStart(sr) {
			mapped = append(mapped, c)
		}
	}
	stuck := waitOut(mapped, func(c *serverConn) bool { return c.inCopyAt(sr.slot) }, time.Now().Add(t.cfg.IOTimeout))
	if len(stuck) > 0 {
		t.log.Warn("shm: peers stuck inside a copy into memory being unregistered; disconnecting them",
			"peers", len(stuck), "pids", pids(stuck), "addr", sr.r.Addr(), "waited", t.cfg.IOTimeout)
		for _, c := range stuck {
			c.disconnect()
		}
	}
	send := time.Now().Add(t.cfg.IOTimeout)
	for _, c := range mapped {
		c.revokeFinish(sr, send) // nothing for the disconnected
	}
	return nil
}

// live returns the shared region holding [addr, addr+n), or nil.
func (t *Transport) live(addr, n uint64) *sharedRegion {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, sr := range t.slots {
		if sr != nil && addr >= sr.r.Addr() && n <= sr.r.Len() && addr-sr.r.Addr() <= sr.r.Len()-n {
			return sr
		}
	}
	return nil
}

// liveAll lists the live shared regions.
func (t *Transport) liveAll() []*sharedRegion {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*sharedRegion
	for _, sr := range t.slots {
		if sr != nil {
			out = append(out, sr)
		}
	}
	return out
}

func (t *Transport) isLive(sr *sharedRegion) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.slots[sr.slot] == sr
}

// submit copies the slices. Small submissions are copied by the calling
// goroutine before Submit returns; large ones are shared with the copiers
// (each goroutine takes the next slice until none is left), and each slice
// completes on the goroutine that copied it. A slice whose batch was
// cancelled before its copy began is not copied. n, when not nil, is the
// submission's note to p: it is sent once every copy is done (by the
// caller, for a submission it copies alone: no state to share).
func (t *Transport) submit(ss []*driver.Slice, p *peer, n *driver.Note) {
	c0 := cost.Now()
	t.submitting.Add(1)
	defer t.submitting.Add(-1)
	if t.closed.Load() {
		for _, s := range ss {
			s.Done(0, errClosed)
		}
		if n != nil {
			p.copied(n, failures{hard: errClosed})
		}
		return
	}
	var total uint64 // of a large submission (ParallelMin or more); else 0
	if len(t.copiers) > 0 && len(ss) > 1 && uint64(len(ss)) <= math.MaxUint32 {
		for _, s := range ss {
			total += uint64(len(s.Local))
		}
		if total < t.cfg.ParallelMin {
			total = 0
		}
	}
	if total > 0 && t.pace.share() {
		t0 := time.Now()
		j := t.jobs.get()
		j.ss = append(j.ss, ss...)
		if n != nil {
			j.note = p.getNote(n)
			j.note.left.Store(int64(len(ss)))
		}
		j.step = uint32(min(max(stepBytes*uint64(len(ss))/total, 1), maxStep))
		j.ends.Store(uint64(len(ss)) << 32)
		j.refs.Store(int32(len(t.copiers)) + 1)
		for _, c := range t.copiers {
			c.add(j)
		}
		cost.Enqueue.Since(c0)
		j.work(false)
		busy := time.Since(t0)
		took := 4 * busy // a copier still busy after the wait: longer, by how much is unknown
		if j.await(max(lingerFor, busy)) {
			took = time.Since(t0)
		}
		t.pace.learn(true, total, took)
		for _, c := range t.copiers {
			if c.retract(j) {
				j.refs.Add(-1) // ours is still held: never the last
			}
		}
		j.release()
		return
	}
	cost.Enqueue.Since(c0)
	var t0 time.Time
	if total > 0 {
		t0 = time.Now()
	}
	var res [copyChunk]result
	if n != nil && len(ss) <= copyChunk && total == 0 {
		p.copyNote(ss, res[:], n)
		return
	}
	var f failures
	for len(ss) > 0 {
		k := min(len(ss), copyChunk)
		f.merge(copyDone(ss[:k], res[:], false))
		ss = ss[k:]
	}
	if total > 0 {
		t.pace.learn(false, total, time.Since(t0))
	}
	if n != nil {
		p.copied(n, f)
	}
}

// copyChunk is how many slices the submitting goroutine copies before it
// completes them.
const copyChunk = 64

// connect hands the target's memory to this process: it checks that the
// segment is reachable, connects, authenticates and maps every region the
// target shares.
func (t *Transport) connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	if t.host == nil {
		return nil, fmt.Errorf("shm: not installed")
	}
	if !t.reaches(remote) {
		return nil, fmt.Errorf("%w: %s", ErrNotReachable, remote.Name)
	}
	pr, _ := remote.Protocol(segment.ProtoSHM)
	p, err := dialPeer(ctx, t, remote, pr.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("shm: connect %s: %w", remote.Name, err)
	}
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		p.Close()
		return nil, driver.ErrClosed
	}
	t.peers[p] = struct{}{}
	t.mu.Unlock()
	return p, nil
}

// Stats counts the transport's live state, for tests and diagnostics.
type Stats struct {
	// Served is the number of initiators connected to this target.
	Served int
	// Peers is the number of targets this process is connected to.
	Peers int
	// Mapped is the number of target regions this process maps, and
	// MappedBytes their size.
	Mapped      int
	MappedBytes uint64
	// Shared is the number of local regions shared with peers.
	Shared int
	// NotesLost counts notifications this process sent (their batches
	// succeeded) that their target took and then did not deliver: it
	// had seen a newer engine under the sender's name, or it was
	// closing (notify.go). Each is also logged.
	NotesLost uint64
}

// Stats returns the current counts.
func (t *Transport) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Stats{Served: t.gate.Len(), Peers: len(t.peers), NotesLost: t.notesLost.Load()}
	for p := range t.peers {
		if ms := p.maps.Load(); ms != nil {
			for _, m := range *ms {
				st.Mapped++
				st.MappedBytes += m.n
			}
		}
	}
	for _, sr := range t.slots {
		if sr != nil {
			st.Shared++
		}
	}
	return st
}

// shutdown stops serving, disconnects every peer (their slices not yet
// copied fail) and unmaps everything. It is idempotent and safe on a nil
// Transport.
func (t *Transport) shutdown() error {
	if t == nil {
		return nil
	}
	t.closeOnce.Do(t.close)
	return nil
}

func (t *Transport) close() {
	t.closed.Store(true)
	t.cancel()
	// Stop the peers first: a Submit waiting for a MAP gives up at once
	// instead of at its IOTimeout.
	t.mu.Lock()
	for p := range t.peers {
		p.stop()
	}
	t.mu.Unlock()
	for t.submitting.Load() != 0 {
		runtime.Gosched()
	}
	t.mu.Lock()
	if t.ln != nil {
		t.ln.Close()
	}
	conns := t.gate.Conns()
	peers := make([]*peer, 0, len(t.peers))
	for p := range t.peers {
		peers = append(peers, p)
	}
	t.mu.Unlock()
	t.fenceAll(conns)
	t.gate.Close() // no more connections; the ones admitted meanwhile are closed too
	for _, c := range conns {
		c.close()
	}
	for _, p := range peers {
		p.Close()
	}
	for _, c := range t.copiers {
		close(c.stop)
	}
	t.wg.Wait()
}

func (t *Transport) forget(p *peer) {
	t.mu.Lock()
	delete(t.peers, p)
	t.mu.Unlock()
}
