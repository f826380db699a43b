package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// maxTransports bounds the transports installed at once; per-transport
// state lives in fixed arrays indexed by slot.
const maxTransports = 8

// Config configures an Engine. The zero value of each optional field
// selects its default.
type Config struct {
	// Name is the local segment's name, how peers open it. With the
	// embedded p2p store it is this process's handshake address,
	// host:port. Required when Store is set.
	Name string
	// Store publishes the local descriptor and resolves remote ones. Nil
	// means no metadata: only the local segment can be opened. The engine
	// does not close it.
	Store segment.Store
	// Unlisted keeps the local descriptor out of the Store: the engine
	// only resolves other segments through it. For an initiator that
	// serves nothing, so that its registered memory is advertised to
	// nobody.
	Unlisted bool
	// Logger receives diagnostics; nil discards them.
	Logger *slog.Logger
	// SliceSize caps the bytes of one slice for every transport; 0 uses
	// each transport's own SliceSize.
	SliceSize uint64
	// Retries is how many times a slice that failed with an error
	// wrapping ErrTransient is submitted again before its task fails.
	// Default 1; negative means never.
	Retries int
	// MetadataTimeout bounds each store operation the engine starts on its
	// own (publishing after a registration, connecting a transport on first
	// use). Default 5s.
	MetadataTimeout time.Duration
	// Selector orders the transports requests to a segment use when they
	// name none; nil means DefaultSelector (same-host shm, then rdma,
	// then tcp). When a transport fails to connect, the segment falls
	// back to the next one (logged once) until its descriptor changes.
	Selector Selector
	// NotifyQueue bounds the notifications queued for the application
	// in total, NotifyQueuePerSender those of one sender (Notifications).
	// Defaults DefaultNotifyQueue and DefaultNotifyQueuePerSender.
	NotifyQueue          int
	NotifyQueuePerSender int
	// StuckAfter is how long a task may stay in flight before the engine
	// logs it (once, at Warn) with the layer where it waits (Layer) and
	// its transport's view of the path; Snapshot shows it as well.
	// Default 30s; negative disables the log.
	StuckAfter time.Duration
}

// Engine is a transfer engine instance: one local segment, its registered
// memory, installed transports, opened remote segments and batches. It is
// safe for concurrent use.
type Engine struct {
	cfg   Config
	log   *slog.Logger
	epoch uint64
	born  time.Time // the engine's clock starts here (monotonic)

	closed    atomic.Bool
	closeOnce sync.Once
	ctx       context.Context // cancelled by Close; parents watches
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	bgMu      sync.Mutex     // orders bg.Add against Close
	bg        sync.WaitGroup // Transfer's background frees

	// tmu serialises Install and Uninstall; transports is the snapshot the
	// data path reads.
	tmu        sync.Mutex
	transports atomic.Pointer[transportSet]

	memMu sync.Mutex // serialises registration changes
	mem   memTable

	pubMu     sync.Mutex // serialises descriptor rebuilds and publishing
	version   uint64
	local     atomic.Pointer[segment.Descriptor]
	published bool

	segs segTable

	batches batchTable

	inbox   inbox
	noteSeq atomic.Uint64 // Note IDs
	stats   statTable
}

// now is the engine's clock: nanoseconds since New, monotonic.
func (e *Engine) now() int64 { return int64(time.Since(e.born)) }

// transportSet is an immutable snapshot of the installed transports.
type transportSet struct {
	slots [maxTransports]driver.Transport
	names [maxTransports]string // the slots' Name()
	// reach holds the slots' Reacher, nil for transports that reach every
	// segment offering their protocol.
	reach [maxTransports]driver.Reacher
	// notifier holds the slots' Notifier, nil for transports that carry
	// no notifications (looked up once, not per notified submission).
	notifier [maxTransports]driver.Notifier
	// helper holds the slots' Helper, nil for transports whose
	// completions only their own goroutines deliver (Wait asks each).
	helper [maxTransports]driver.Helper
	// gen grows with every Install and Uninstall (segState.reach).
	gen uint32
	// order lists occupied slots in install order (preference order of
	// the local descriptor's protocols).
	order []int
	// inflight counts tasks in flight per slot; closing is set while an
	// Uninstall decides. Both are shared by every snapshot.
	inflight *[maxTransports]atomic.Int64
	closing  *[maxTransports]atomic.Bool
}

// usable reports whether the transport of slot may carry requests to d:
// d offers its protocol and the transport reaches d. st (may be nil)
// caches the transport's answer for d.
func (ts *transportSet) usable(slot int, d *segment.Descriptor, st *segState, name string) bool {
	if !offers(d, name) {
		return false
	}
	r := ts.reach[slot]
	if r == nil {
		return true
	}
	if st == nil {
		return r.Reaches(d)
	}
	v := st.reach[slot].Load()
	if v>>2 == ts.gen&(1<<30-1) && v&3 != 0 {
		return v&3 == 1
	}
	ok := r.Reaches(d)
	v = ts.gen << 2
	if ok {
		v |= 1
	} else {
		v |= 2
	}
	st.reach[slot].Store(v)
	return ok
}

func offers(d *segment.Descriptor, name string) bool {
	for i := range d.Protocols {
		if d.Protocols[i].Name == name {
			return true
		}
	}
	return false
}

func (ts *transportSet) byName(name string) int {
	for _, i := range ts.order {
		if ts.slots[i].Name() == name {
			return i
		}
	}
	return -1
}

// New creates an engine and publishes its (empty) local descriptor, unless
// Config.Unlisted.
func New(cfg Config) (*Engine, error) {
	if cfg.Store != nil && cfg.Name == "" {
		return nil, fmt.Errorf("engine: config: a Store needs a Name")
	}
	if cfg.Name == "" {
		cfg.Name = "local"
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = 1
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	if cfg.MetadataTimeout <= 0 {
		cfg.MetadataTimeout = 5 * time.Second
	}
	if cfg.StuckAfter == 0 {
		cfg.StuckAfter = DefaultStuckAfter
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var eb [8]byte
	if _, err := rand.Read(eb[:]); err != nil {
		return nil, fmt.Errorf("engine: epoch: %w", err)
	}
	e := &Engine{cfg: cfg, log: log, epoch: binary.LittleEndian.Uint64(eb[:]) | 1, born: time.Now()}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if cfg.NotifyQueue <= 0 {
		cfg.NotifyQueue = DefaultNotifyQueue
	}
	if cfg.NotifyQueuePerSender <= 0 {
		cfg.NotifyQueuePerSender = DefaultNotifyQueuePerSender
	}
	e.cfg = cfg
	e.inbox.init(cfg.NotifyQueue, min(cfg.NotifyQueuePerSender, cfg.NotifyQueue), e.ctx.Done())
	e.transports.Store(&transportSet{inflight: new([maxTransports]atomic.Int64), closing: new([maxTransports]atomic.Bool)})
	e.segs.init()
	if err := e.republish(); err != nil {
		e.cancel()
		return nil, err
	}
	if cfg.StuckAfter > 0 {
		e.wg.Add(1)
		go e.watchStuck()
	}
	if r, ok := cfg.Store.(driver.NotifyReceiver); ok {
		r.ReceiveNotifications(&e.inbox)
	}
	return e, nil
}

// Name is the local segment's name.
func (e *Engine) Name() string { return e.cfg.Name }

// Epoch is the local segment's epoch, random per engine.
func (e *Engine) Epoch() uint64 { return e.epoch }

// LocalDescriptor returns a copy of the local segment's current descriptor.
func (e *Engine) LocalDescriptor() *segment.Descriptor { return e.local.Load().Clone() }

// Close fails transfers still in flight (their errors wrap ErrClosed,
// whatever the transport reported), closes transports and peers,
// unpublishes the local descriptor and stops background work. Batches stay
// readable (Status, Wait); everything else returns ErrClosed. It is
// idempotent and safe on a nil Engine.
func (e *Engine) Close() error {
	if e == nil {
		return nil
	}
	var err error
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		e.cancel()
		e.inbox.close()
		e.segs.closeAll()
		e.tmu.Lock()
		ts := e.transports.Load()
		// All at once: each bounds its own waits on peers, so Close
		// takes the longest of them, not their sum.
		errs := make([]error, len(ts.order))
		var wg sync.WaitGroup
		for k, i := range ts.order {
			wg.Go(func() {
				if cerr := ts.slots[i].Close(); cerr != nil {
					errs[k] = fmt.Errorf("engine: close %s: %w", ts.slots[i].Name(), cerr)
				}
			})
		}
		wg.Wait()
		for _, cerr := range errs {
			if cerr != nil && err == nil {
				err = cerr
			}
		}
		e.tmu.Unlock()
		// The transports are closed: no peer or NIC touches registered
		// memory any more, so its Memory may be unmapped.
		e.memMu.Lock()
		for _, r := range e.mem.load() {
			r.detach()
		}
		e.memMu.Unlock()
		e.wg.Wait()
		// Transfer adds to bg only under bgMu with closed unset, so
		// after this barrier nothing is added while bg.Wait runs.
		e.bgMu.Lock()
		closing := e.closed.Load()
		e.bgMu.Unlock()
		if closing {
			e.bg.Wait()
		}
		e.pubMu.Lock()
		if e.cfg.Store != nil && e.published {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.MetadataTimeout)
			if uerr := e.cfg.Store.Unpublish(ctx, e.cfg.Name); uerr != nil && !errors.Is(uerr, segment.ErrNotFound) && !errors.Is(uerr, segment.ErrClosed) && err == nil {
				err = fmt.Errorf("engine: unpublish %s: %w", e.cfg.Name, uerr)
			}
			cancel()
			e.published = false
		}
		e.pubMu.Unlock()
	})
	return err
}

// Install adds a transport: it is installed (its listener starts), every
// registered region is registered with it, and the local descriptor is
// republished with its protocol entry. Transports installed earlier are
// preferred in the local descriptor's protocol list. A transport that
// fails to register memory is closed.
func (e *Engine) Install(tr Transport) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if tr == nil {
		return fmt.Errorf("%w: install: nil transport", ErrInvalidRequest)
	}
	t := tr.Driver()
	if t == nil {
		return fmt.Errorf("%w: install: %T has no driver", ErrInvalidRequest, tr)
	}
	e.tmu.Lock()
	defer e.tmu.Unlock()
	old := e.transports.Load()
	if old.byName(t.Name()) >= 0 {
		return fmt.Errorf("%w: %s", ErrTransportExists, t.Name())
	}
	slot := -1
	for i, s := range old.slots {
		if s == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		return fmt.Errorf("%w: %d installed", ErrTooManyTransports, maxTransports)
	}
	if err := t.Install(host{e}); err != nil {
		return fmt.Errorf("engine: install %s: %w", t.Name(), err)
	}
	e.memMu.Lock()
	defer e.memMu.Unlock()
	rs := e.mem.load()
	for i, r := range rs {
		k, err := t.RegisterMemory(r)
		if err != nil {
			for _, r2 := range rs[:i] {
				t.UnregisterMemory(r2, r2.keys[slot])
				r2.keys[slot] = nil
			}
			t.Close()
			return fmt.Errorf("engine: install %s: register [%#x, %#x): %w", t.Name(), r.addr, r.addr+r.Len(), err)
		}
		r.keys[slot] = k
	}
	ns := *old
	ns.slots[slot] = t
	ns.names[slot] = t.Name()
	ns.reach[slot], _ = t.(driver.Reacher)
	ns.notifier[slot], _ = t.(driver.Notifier)
	ns.helper[slot], _ = t.(driver.Helper)
	ns.gen++
	ns.order = append(slices.Clone(old.order), slot)
	e.transports.Store(&ns)
	if err := e.republish(); err != nil {
		e.log.Warn("engine: republish after install", "transport", t.Name(), "err", err)
	}
	return nil
}

// Uninstall removes the named transport and closes it. It fails with
// ErrTransportBusy while the transport carries tasks in flight. Peers of
// that transport are closed; segments fall back to another transport they
// offer.
func (e *Engine) Uninstall(name string) error {
	e.tmu.Lock()
	defer e.tmu.Unlock()
	old := e.transports.Load()
	slot := old.byName(name)
	if slot < 0 {
		return fmt.Errorf("%w: %s not installed", ErrNoTransport, name)
	}
	// Flag, then count: Submit counts a task, then looks at the flag and
	// the set (admit), so either this sees the task (busy) or the task
	// sees the transport going and waits for the outcome. A refusal
	// changes nothing a submission or registration could have seen.
	old.closing[slot].Store(true)
	if n := old.inflight[slot].Load(); n > 0 {
		old.closing[slot].Store(false)
		return fmt.Errorf("%w: %s: %d tasks", ErrTransportBusy, name, n)
	}
	t := old.slots[slot]
	ns := *old
	ns.slots[slot] = nil
	ns.names[slot] = ""
	ns.reach[slot] = nil
	ns.notifier[slot] = nil
	ns.helper[slot] = nil
	ns.gen++
	ns.order = slices.DeleteFunc(slices.Clone(old.order), func(i int) bool { return i == slot })
	e.transports.Store(&ns)
	old.closing[slot].Store(false)
	e.segs.dropSlot(slot)
	e.memMu.Lock()
	for _, r := range e.mem.load() {
		t.UnregisterMemory(r, r.keys[slot])
		r.keys[slot] = nil
	}
	e.memMu.Unlock()
	err := t.Close()
	if perr := e.republish(); perr != nil {
		e.log.Warn("engine: republish after uninstall", "transport", name, "err", perr)
	}
	if err != nil {
		return fmt.Errorf("engine: uninstall %s: %w", name, err)
	}
	return nil
}

// Transports lists the installed transports' names in preference order.
func (e *Engine) Transports() []string {
	ts := e.transports.Load()
	out := make([]string, 0, len(ts.order))
	for _, i := range ts.order {
		out = append(out, ts.slots[i].Name())
	}
	return out
}

// republish rebuilds the local descriptor with a new version and publishes
// it through the store.
func (e *Engine) republish() error {
	e.pubMu.Lock()
	defer e.pubMu.Unlock()
	e.version++
	d := &segment.Descriptor{Name: e.cfg.Name, Epoch: e.epoch, Version: e.version, Protocols: []segment.Protocol{}}
	for _, r := range e.mem.load() {
		d.Buffers = append(d.Buffers, segment.Buffer{Addr: r.addr, Length: r.Len(), Location: r.location})
	}
	if d.Buffers == nil {
		d.Buffers = []segment.Buffer{}
	}
	ts := e.transports.Load()
	for _, i := range ts.order {
		if err := ts.slots[i].Describe(d); err != nil {
			return fmt.Errorf("engine: describe %s: %w", ts.slots[i].Name(), err)
		}
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("engine: local descriptor: %w", err)
	}
	e.local.Store(d)
	if e.cfg.Store == nil || e.cfg.Unlisted || e.closed.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.MetadataTimeout)
	defer cancel()
	if err := e.cfg.Store.Publish(ctx, d.Clone()); err != nil {
		return fmt.Errorf("engine: publish %s v%d: %w", d.Name, d.Version, err)
	}
	e.published = true
	return nil
}

// host is the engine as its transports see it.
type host struct{ e *Engine }

func (h host) LocalName() string    { return h.e.cfg.Name }
func (h host) Epoch() uint64        { return h.e.epoch }
func (h host) Logger() *slog.Logger { return h.e.log }
func (h host) Inbox() driver.Inbox  { return &h.e.inbox }
func (h host) AcquireLocal(addr, length uint64) ([]byte, driver.Region, error) {
	mem, r, err := h.e.acquireLocal(addr, length)
	if r == nil {
		return mem, nil, err // not a typed nil
	}
	return mem, r, err
}

var errAcquireBusy = fmt.Errorf("%w: region is being unregistered", ErrMemoryBusy)

func (e *Engine) acquireLocal(addr, length uint64) ([]byte, *region, error) {
	r := e.mem.find(addr, length)
	if r == nil || length == 0 {
		return nil, nil, ErrOutOfRange
	}
	if !r.pin() {
		return nil, nil, errAcquireBusy
	}
	return r.sliceAt(addr, length), r, nil
}
