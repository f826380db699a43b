package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// SegmentID names an opened segment within one engine.
type SegmentID uint64

// LocalSegment is the engine's own segment; it needs no OpenSegment.
// Transfers to it are copies within this process.
const LocalSegment SegmentID = 0

// OpenOptions tunes OpenSegment. Nil means defaults.
type OpenOptions struct {
	// Transport forces one transport for the segment instead of the
	// engine's choice (Config.Selector), without falling back to another
	// when it fails to connect.
	Transport string
}

// remoteSegment is an opened segment.
type remoteSegment struct {
	id    SegmentID
	name  string
	force string // OpenOptions.Transport
	refs  int    // OpenSegment calls not yet matched by CloseSegment; under segTable.mu

	state    atomic.Pointer[segState]
	connMu   sync.Mutex // serialises Connect calls and state swaps
	inflight atomic.Int64
	stop     context.CancelFunc // ends the watch
}

// segState is one incarnation of a remote segment as currently known.
type segState struct {
	desc *segment.Descriptor
	gone bool
	// fetched is when desc came from the store.
	fetched time.Time
	// route is the order requests without a hint try the transports
	// in (Config.Selector), for the transport set it was computed for.
	route atomic.Pointer[route]
	peers [maxTransports]atomic.Pointer[peerRef]
	// reach caches, per transport slot, what its Reacher said about desc:
	// the transport set's generation << 2 | 1 (reaches) or 2 (does not).
	reach [maxTransports]atomic.Uint32
}

// peerRef is a transport's Peer for one segment state, with the
// counters of its traffic.
type peerRef struct {
	p     driver.Peer
	stats *peerStats
}

type segTable struct {
	mu     sync.RWMutex
	byID   map[SegmentID]*remoteSegment
	byName map[string]*remoteSegment
	next   SegmentID
}

func (t *segTable) init() {
	t.byID = map[SegmentID]*remoteSegment{}
	t.byName = map[string]*remoteSegment{}
	t.next = 1
}

func (t *segTable) get(id SegmentID) *remoteSegment {
	t.mu.RLock()
	s := t.byID[id]
	t.mu.RUnlock()
	return s
}

// acquire returns the segment with its in-flight count raised for one
// task. Counting under the read lock pairs with CloseSegment checking the
// count and removing the segment under the write lock: a task is never
// started (nor a connection made) on a closed segment.
func (t *segTable) acquire(id SegmentID) *remoteSegment {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := t.byID[id]
	if s != nil {
		s.inflight.Add(1)
	}
	return s
}

// closeAll closes every peer and stops every watch (engine Close).
func (t *segTable) closeAll() {
	t.mu.Lock()
	segs := make([]*remoteSegment, 0, len(t.byID))
	for _, s := range t.byID {
		segs = append(segs, s)
	}
	t.byID = map[SegmentID]*remoteSegment{}
	t.byName = map[string]*remoteSegment{}
	t.mu.Unlock()
	for _, s := range segs {
		s.stop()
		s.connMu.Lock()
		closePeers(s.state.Load(), -1)
		s.connMu.Unlock()
	}
}

// dropSlot closes every peer of one transport slot (Uninstall).
func (t *segTable) dropSlot(slot int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, s := range t.byID {
		s.connMu.Lock()
		if st := s.state.Load(); st != nil {
			if ref := st.peers[slot].Swap(nil); ref != nil {
				ref.p.Close()
			}
		}
		s.connMu.Unlock()
	}
}

// closePeers closes the peers of st (all slots when slot < 0).
func closePeers(st *segState, slot int) {
	if st == nil {
		return
	}
	for i := range st.peers {
		if slot >= 0 && i != slot {
			continue
		}
		if ref := st.peers[i].Swap(nil); ref != nil {
			ref.p.Close()
		}
	}
}

// OpenSegment resolves a segment by name through the store and returns its
// ID; opening the same name again returns the same ID (each OpenSegment
// should be matched by a CloseSegment). The local segment's own name
// returns LocalSegment. The segment's transport is the first of its
// candidates in Config.Selector's order (by default shm when the segment
// is on this host, else rdma, else tcp) that connects, unless opts names
// one (requests may name another, Request.Transport); it is connected
// before OpenSegment returns. While open, the descriptor is kept
// fresh through the store's Watch: a new version (new buffers) replaces it,
// a new epoch (the owner restarted) also drops the transports' cached
// connections. An unknown name fails with an error wrapping
// ErrSegmentNotFound (and segment.ErrNotFound).
func (e *Engine) OpenSegment(ctx context.Context, name string, opts *OpenOptions) (SegmentID, error) {
	if e.closed.Load() {
		return 0, ErrClosed
	}
	if name == e.cfg.Name {
		return LocalSegment, nil
	}
	var force string
	if opts != nil {
		force = opts.Transport
	}
	e.segs.mu.Lock()
	if s := e.segs.byName[name]; s != nil {
		s.refs++
		e.segs.mu.Unlock()
		if force != "" && force != s.force {
			e.CloseSegment(s.id)
			return 0, fmt.Errorf("%w: segment %s is already open with transport %q", ErrNoTransport, name, s.force)
		}
		return s.id, nil
	}
	e.segs.mu.Unlock()

	if e.cfg.Store == nil {
		return 0, fmt.Errorf("%w: %s (no metadata store configured)", ErrSegmentNotFound, name)
	}
	d, err := e.cfg.Store.Get(ctx, name)
	if err != nil {
		if errors.Is(err, segment.ErrNotFound) {
			return 0, fmt.Errorf("%w: %s: %v", ErrSegmentNotFound, name, err)
		}
		return 0, fmt.Errorf("engine: open segment %s: %w", name, err)
	}
	if err := d.Validate(); err != nil {
		return 0, fmt.Errorf("engine: open segment %s: %w", name, err)
	}
	s := &remoteSegment{name: name, force: force}
	st, err := e.newState(s, d.Clone())
	if err != nil {
		return 0, fmt.Errorf("engine: open segment %s: %w", name, err)
	}
	s.state.Store(st)
	if _, _, err := e.connect(ctx, s, st, e.transports.Load(), "", nil); err != nil {
		return 0, fmt.Errorf("engine: open segment %s: %w", name, err)
	}

	e.segs.mu.Lock()
	if other := e.segs.byName[name]; other != nil {
		// Lost a race with a concurrent OpenSegment of the same name.
		other.refs++
		e.segs.mu.Unlock()
		closePeers(st, -1)
		return other.id, nil
	}
	s.id = e.segs.next
	e.segs.next++
	s.refs = 1
	e.segs.byID[s.id] = s
	e.segs.byName[name] = s
	wctx, stop := context.WithCancel(e.ctx)
	s.stop = stop
	e.segs.mu.Unlock()

	ch, err := e.cfg.Store.Watch(wctx, name)
	if err != nil {
		e.log.Warn("engine: segment watch unavailable; descriptor will not refresh", "segment", name, "err", err)
	} else {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for nd := range ch {
				e.watched(wctx, s, nd)
			}
		}()
	}
	return s.id, nil
}

// newState makes the state for descriptor d, which must leave a transport
// to use.
func (e *Engine) newState(s *remoteSegment, d *segment.Descriptor) (*segState, error) {
	st := &segState{desc: d, fetched: time.Now()}
	if _, _, err := e.pickSlot(e.transports.Load(), st, "", s.force); err != nil {
		return nil, err
	}
	return st, nil
}

func protoNames(d *segment.Descriptor) []string {
	out := make([]string, len(d.Protocols))
	for i, p := range d.Protocols {
		out[i] = p.Name
	}
	return out
}

// peer returns the connected Peer of slot for st, connecting on first use.
func (e *Engine) peer(ctx context.Context, s *remoteSegment, st *segState, slot int) (*peerRef, error) {
	if ref := st.peers[slot].Load(); ref != nil {
		return ref, nil
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if ref := st.peers[slot].Load(); ref != nil {
		return ref, nil
	}
	if s.state.Load() != st && s.state.Load() != nil {
		return nil, fmt.Errorf("%w: %s changed while connecting", ErrPeerReset, s.name)
	}
	t := e.transports.Load().slots[slot]
	if t == nil {
		return nil, fmt.Errorf("%w: transport uninstalled", ErrNoTransport)
	}
	p, err := t.Connect(ctx, st.desc)
	if err != nil {
		return nil, &connectError{fmt.Errorf("engine: connect %s over %s: %w", s.name, t.Name(), err)}
	}
	ref := &peerRef{p: p, stats: e.stats.peer(s.name, t.Name())}
	st.peers[slot].Store(ref)
	return ref, nil
}

// watched installs a descriptor the store's watch reported (nil: gone).
// The store read it before it sent it, and a SyncSegment may have fetched
// a later one since: a report that would replace the incarnation, or say
// the segment is gone, is first checked against the store, so that a
// stale one cannot drop the endpoints of the current incarnation (epochs
// are random and cannot be ordered). Within an incarnation, versions
// order the reports and refresh drops an older one itself.
func (e *Engine) watched(ctx context.Context, s *remoteSegment, d *segment.Descriptor) {
	cur := s.state.Load()
	if d != nil && !cur.gone && segment.SameIncarnation(cur.desc, d) {
		e.refresh(s, d)
		return
	}
	if d == nil && cur.gone {
		return
	}
	gctx, cancel := context.WithTimeout(ctx, e.cfg.MetadataTimeout)
	got, err := e.cfg.Store.Get(gctx, s.name)
	cancel()
	switch {
	case err == nil:
		d = got
	case errors.Is(err, segment.ErrNotFound):
		d = nil
	case ctx.Err() != nil:
		return // the segment is closing
	default:
		// The store cannot be reached to check: the report is the
		// latest word it gave.
	}
	e.refresh(s, d)
}

// refresh installs descriptor d of s (nil: gone).
func (e *Engine) refresh(s *remoteSegment, d *segment.Descriptor) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	old := s.state.Load()
	if d == nil {
		ns := &segState{desc: old.desc, gone: true, fetched: time.Now()}
		s.state.Store(ns)
		closePeers(old, -1)
		e.log.Info("engine: segment gone", "segment", s.name)
		return
	}
	if d.Validate() != nil {
		e.log.Warn("engine: ignoring invalid descriptor from store", "segment", s.name)
		return
	}
	same := segment.SameIncarnation(old.desc, d)
	if same && !old.gone && d.Version <= old.desc.Version {
		return
	}
	ns, err := e.newState(s, d.Clone())
	if err != nil {
		e.log.Warn("engine: segment update unusable", "segment", s.name, "err", err)
		ns = &segState{desc: d.Clone(), fetched: time.Now()}
	}
	if same && !old.gone {
		// Same process: keep the connections of every transport whose
		// protocol entry (endpoint, attributes) did not change and that
		// does not say otherwise (samePeer).
		ts := e.transports.Load()
		var stale []*peerRef
		for i := range old.peers {
			ref := old.peers[i].Load()
			if ref == nil {
				continue
			}
			if t := ts.slots[i]; t != nil && samePeer(t, old.desc, d) {
				ns.peers[i].Store(ref)
			} else {
				stale = append(stale, ref)
			}
		}
		s.state.Store(ns)
		for _, ref := range stale {
			ref.p.Close()
		}
		return
	}
	s.state.Store(ns)
	closePeers(old, -1)
	e.log.Info("engine: segment restarted; endpoints dropped", "segment", s.name, "epoch", d.Epoch)
}

// samePeer reports whether a Peer that t connected for descriptor a
// still fits b, a later version of the same incarnation: both offer t's
// protocol, and t agrees when it is a driver.PeerKeeper (rdma: its entry
// but for the keys of buffers added or removed), else t's protocol entry
// (endpoint, version, typed part, extra fields) is unchanged. The engine
// knows nothing else of what a Peer was built from.
func samePeer(t driver.Transport, a, b *segment.Descriptor) bool {
	name := t.Name()
	pa, oka := a.Protocol(name)
	pb, okb := b.Protocol(name)
	if !oka || !okb {
		return false
	}
	if k, ok := t.(driver.PeerKeeper); ok {
		return k.KeepPeer(a, b)
	}
	return pa.Equal(pb)
}

// SyncSegment fetches the segment's descriptor from the store now, instead
// of waiting for the watch to report a change.
func (e *Engine) SyncSegment(ctx context.Context, id SegmentID) error {
	if id == LocalSegment {
		return nil
	}
	s := e.segs.get(id)
	if s == nil {
		return fmt.Errorf("%w: id %d", ErrSegmentNotFound, id)
	}
	d, err := e.cfg.Store.Get(ctx, s.name)
	if errors.Is(err, segment.ErrNotFound) {
		e.refresh(s, nil)
		return fmt.Errorf("%w: %s: %v", ErrSegmentNotFound, s.name, err)
	}
	if err != nil {
		return fmt.Errorf("engine: sync segment %s: %w", s.name, err)
	}
	e.refresh(s, d)
	return nil
}

// SegmentDescriptor returns a copy of the descriptor currently cached for
// an opened segment (or the local one).
func (e *Engine) SegmentDescriptor(id SegmentID) (*segment.Descriptor, error) {
	if id == LocalSegment {
		return e.LocalDescriptor(), nil
	}
	s := e.segs.get(id)
	if s == nil {
		return nil, fmt.Errorf("%w: id %d", ErrSegmentNotFound, id)
	}
	st := s.state.Load()
	if st.gone {
		return nil, fmt.Errorf("%w: %s is gone", ErrSegmentNotFound, s.name)
	}
	return st.desc.Clone(), nil
}

// CloseSegment releases one OpenSegment of id. The last release closes the
// segment's connections; it fails with ErrSegmentBusy while tasks to the
// segment are in flight. Closing LocalSegment does nothing.
func (e *Engine) CloseSegment(id SegmentID) error {
	if id == LocalSegment {
		return nil
	}
	e.segs.mu.Lock()
	s := e.segs.byID[id]
	if s == nil {
		e.segs.mu.Unlock()
		return fmt.Errorf("%w: id %d", ErrSegmentNotFound, id)
	}
	if s.refs > 1 {
		s.refs--
		e.segs.mu.Unlock()
		return nil
	}
	if n := s.inflight.Load(); n > 0 {
		e.segs.mu.Unlock()
		return fmt.Errorf("%w: %s: %d tasks", ErrSegmentBusy, s.name, n)
	}
	delete(e.segs.byID, id)
	delete(e.segs.byName, s.name)
	e.segs.mu.Unlock()
	s.stop()
	s.connMu.Lock()
	closePeers(s.state.Load(), -1)
	s.connMu.Unlock()
	return nil
}
