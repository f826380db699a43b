package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/segment"
)

// A Selector orders the transports that may carry requests to a remote
// segment, best first. candidates holds the names of the installed
// transports that remote offers and that reach it (shm: only on the same
// host and user), in remote's protocol order. Select returns the ones to
// use, in the order to try them; names that are not candidates are
// ignored, and returning none leaves the segment without a transport
// (ErrNoTransport).
//
// The engine calls it when a segment is opened, when its descriptor
// changes and after Install or Uninstall, never per request, from any
// goroutine. It must not keep or modify candidates.
type Selector func(remote *segment.Descriptor, candidates []string) []string

// Prefer returns a Selector that tries the named protocols first, in the
// order given, then every other candidate in the target's order.
func Prefer(names ...string) Selector {
	names = slices.Clone(names)
	return func(_ *segment.Descriptor, candidates []string) []string {
		out := make([]string, 0, len(candidates))
		for _, n := range names {
			if slices.Contains(candidates, n) && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		for _, c := range candidates {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
		return out
	}
}

// DefaultSelector is the engine's choice when Config.Selector is nil: a
// memory copy on the same host (shm), then RDMA, then TCP, then any other
// protocol both sides have.
var DefaultSelector = Prefer(segment.ProtoSHM, segment.ProtoRDMA, segment.ProtoTCP)

// route is the order in which requests without a transport hint try the
// transports for one state of a segment under one transport set.
type route struct {
	gen   uint32
	slots []int
	// failed has a bit per slot whose Connect failed for this state: it
	// is skipped while another one is left.
	failed atomic.Uint32
}

// routeOf returns st's route for ts, computing it when ts changed since.
// It does not allocate when the route is current.
func (e *Engine) routeOf(ts *transportSet, st *segState) *route {
	r := st.route.Load()
	if r != nil && r.gen == ts.gen {
		return r
	}
	nr := e.newRoute(ts, st.desc, st)
	if st.route.CompareAndSwap(r, nr) {
		return nr
	}
	if r = st.route.Load(); r != nil && r.gen == ts.gen {
		return r // a concurrent caller computed the same route first
	}
	return nr
}

func (e *Engine) newRoute(ts *transportSet, d *segment.Descriptor, st *segState) *route {
	var names []string
	var slots []int
	for i := range d.Protocols {
		name := d.Protocols[i].Name
		if slot := ts.byName(name); slot >= 0 && ts.usable(slot, d, st, name) {
			names = append(names, name)
			slots = append(slots, slot)
		}
	}
	sel := e.cfg.Selector
	if sel == nil {
		sel = DefaultSelector
	}
	r := &route{gen: ts.gen}
	if len(names) == 0 {
		return r
	}
	for _, n := range sel(d, slices.Clone(names)) {
		if i := slices.Index(names, n); i >= 0 && !slices.Contains(r.slots, slots[i]) {
			r.slots = append(r.slots, slots[i])
		}
	}
	return r
}

// first is the first slot of r not marked failed; when every one failed
// it is the best one again (the error of connecting it is what the caller
// sees). ok is false when r is empty.
func (r *route) first() (slot int, ok bool) {
	f := r.failed.Load()
	for _, s := range r.slots {
		if f&(1<<s) == 0 {
			return s, true
		}
	}
	if len(r.slots) == 0 {
		return -1, false
	}
	return r.slots[0], true
}

// pickSlot chooses the transport for a request: the request's hint, else
// the segment's OpenOptions.Transport (forced: no fallback), else the
// first transport of the segment's route (Config.Selector) that has not
// failed to connect. A hint must be installed, offered by the target and
// reach it. It does not allocate unless it fails or the transport set
// changed.
func (e *Engine) pickSlot(ts *transportSet, st *segState, hint, force string) (slot int, forced bool, err error) {
	if hint == "" {
		hint = force
	}
	d := st.desc
	if hint != "" {
		slot := ts.byName(hint)
		if slot < 0 {
			return -1, true, fmt.Errorf("%w: %q is not installed", ErrNoTransport, hint)
		}
		if !offers(d, hint) {
			return -1, true, fmt.Errorf("%w: %s does not offer %q", ErrNoTransport, d.Name, hint)
		}
		if !ts.usable(slot, d, st, hint) {
			if x, ok := ts.slots[slot].(driver.UnreachableExplainer); ok {
				if why := x.Unreachable(d); why != nil {
					return -1, true, fmt.Errorf("%w: %q cannot reach %s from here: %w", ErrNoTransport, hint, d.Name, why)
				}
			}
			return -1, true, fmt.Errorf("%w: %q cannot reach %s from here", ErrNoTransport, hint, d.Name)
		}
		return slot, true, nil
	}
	if slot, ok := e.routeOf(ts, st).first(); ok {
		return slot, false, nil
	}
	return -1, false, fmt.Errorf("%w: %s offers %v", ErrNoTransport, d.Name, protoNames(d))
}

// fallback marks slot as failed to connect for st and returns the next
// slot of its route to try; ok is false when none is left. The first
// failure of a transport for a state is logged.
func (e *Engine) fallback(ts *transportSet, s *remoteSegment, st *segState, slot int, err error) (next int, ok bool) {
	r := e.routeOf(ts, st)
	old := r.failed.Or(1 << slot)
	next = -1
	f := old | 1<<slot
	for _, x := range r.slots {
		if f&(1<<x) == 0 {
			next = x
			break
		}
	}
	if old&(1<<slot) == 0 {
		to := "none left"
		if next >= 0 {
			to = ts.names[next]
		}
		e.log.Warn("engine: transport failed to connect; falling back", "segment", s.name, "transport", ts.names[slot], "next", to, "err", err)
	}
	return next, next >= 0
}

// connected records that slot connected for st: a transport that failed
// earlier is used again.
func (e *Engine) connected(ts *transportSet, st *segState, slot int) {
	if r := st.route.Load(); r != nil && r.gen == ts.gen && r.failed.Load()&(1<<slot) != 0 {
		r.failed.And(^uint32(1 << slot))
	}
}

// connectError marks a transport's Connect failing, which moves a segment
// on to its next transport.
type connectError struct{ err error }

func (c *connectError) Error() string { return c.err.Error() }
func (c *connectError) Unwrap() error { return c.err }

func isConnectError(err error) bool {
	var c *connectError
	return errors.As(err, &c)
}

// connect returns a connected peer for requests to s in state st, the
// slot it belongs to: the slot pickSlot chooses, or, when its transport
// fails to connect and the choice was not forced, the next one of the
// route. A task t, when not nil, is counted in flight on each slot before
// its connection attempt (admit), and no longer after a failed one; each
// of its attempts is bounded by Config.MetadataTimeout within ctx.
// Without a task, ctx bounds all attempts.
func (e *Engine) connect(ctx context.Context, s *remoteSegment, st *segState, ts *transportSet, hint string, t *task) (int, *peerRef, error) {
	slot, forced, err := e.pickSlot(ts, st, hint, s.force)
	if err != nil {
		return -1, nil, err
	}
	for {
		if t != nil {
			if err := e.admit(t, ts, slot); err != nil {
				return -1, nil, err
			}
		}
		var p *peerRef
		if t != nil {
			p, err = e.peerFor(ctx, s, st, slot)
		} else {
			p, err = e.peer(ctx, s, st, slot)
		}
		if err == nil {
			e.connected(ts, st, slot)
			return slot, p, nil
		}
		if t != nil {
			t.tin.Add(-1)
			t.tin = nil
		}
		if forced || !isConnectError(err) || e.closed.Load() || ctx.Err() != nil {
			return -1, nil, err
		}
		next, ok := e.fallback(ts, s, st, slot, err)
		if !ok {
			return -1, nil, err
		}
		slot = next
	}
}

// SegmentTransports lists the transports requests to segment id use when
// they name none, in the order the engine tries them: the first is the
// one in use. A transport that failed to connect comes last. A segment
// opened with OpenOptions.Transport lists only that one; LocalSegment
// lists none (its transfers are copies in this process).
func (e *Engine) SegmentTransports(id SegmentID) ([]string, error) {
	if id == LocalSegment {
		return []string{}, nil
	}
	s := e.segs.get(id)
	if s == nil {
		return nil, fmt.Errorf("%w: id %d", ErrSegmentNotFound, id)
	}
	st := s.state.Load()
	if st.gone {
		return nil, fmt.Errorf("%w: %s is gone", ErrSegmentNotFound, s.name)
	}
	ts := e.transports.Load()
	if s.force != "" {
		return []string{s.force}, nil
	}
	r := e.routeOf(ts, st)
	f := r.failed.Load()
	out := make([]string, 0, len(r.slots))
	for _, slot := range r.slots {
		if f&(1<<slot) == 0 {
			out = append(out, ts.names[slot])
		}
	}
	for _, slot := range r.slots {
		if f&(1<<slot) != 0 {
			out = append(out, ts.names[slot])
		}
	}
	return out, nil
}
