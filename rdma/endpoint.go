package rdma

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/uverbs"
)

// Endpoint states, in the order they can be reached.
const (
	epConnecting int32 = iota
	epReady
	epBroken // a QP failed: drain, destroy, rebuild on next use
	epFailed // the handshake failed
	epClosed // the peer closed, the endpoint was evicted, or the transport closed
)

type pend struct {
	s    *driver.Slice
	tr   *noteTrack
	rkey uint32
	mark *outNote // instead of s: the note's markers on every QP
	// since is when a mark started waiting (rail clock).
	since time.Duration
}

type qpState struct {
	qp      railQP
	credits int
	// notes is how many notification SENDs the target can receive on
	// this QP now (its posted receives not yet used).
	notes int
	ep    *endpoint
}

// endpoint is QPsPerPath QPs from one local rail to one remote rail of one
// peer incarnation.
type endpoint struct {
	p     *peer
	r     *rail
	rrail int
	slot  int // index in p.eps
	id    uint32
	state atomic.Int32
	fail  atomic.Pointer[error]
	qps   []*qpState
	// busy counts slices handed to the rail and not yet completed; only
	// idle endpoints are evicted. posted counts those of them posted
	// (the owner's inflight, readable by Inspect).
	busy   atomic.Int64
	posted atomic.Int64
	// ctr counts the traffic from this endpoint's local rail to its peer
	// (by name: it outlives the endpoint).
	ctr *railCounters
	// visited is SIEVE's bit, set on use.
	visited atomic.Bool
	// prev and next link the transport's endpoint list (store.mu).
	prev, next *endpoint
	inStore    bool

	// Rail owner only.
	waiting  []pend
	notes    []*outNote // notifications waiting for the endpoint or a credit
	inflight int
	rr       int
	blocked  bool
	torn     bool
}

func (ep *endpoint) setFailure(err error) {
	if err != nil {
		ep.fail.CompareAndSwap(nil, &err)
	}
}

func (ep *endpoint) failure() error {
	if p := ep.fail.Load(); p != nil {
		return *p
	}
	return fmt.Errorf("rdma: endpoint to %s closed: %w", ep.p.name, driver.ErrTransient)
}

// pickQP returns the QP with the most free send slots, i.e. the fewest
// work requests outstanding (ties round robin), or nil if none has one: a
// QP that completes faster than the others gets more of the slices, so
// the QPs of a path finish a batch together.
func (ep *endpoint) pickQP() *qpState {
	var best *qpState
	n := len(ep.qps)
	for i := range n {
		if q := ep.qps[(ep.rr+i)%n]; q.credits > 0 && (best == nil || q.credits > best.credits) {
			best = q
		}
	}
	if ep.rr++; ep.rr == n {
		ep.rr = 0
	}
	return best
}

// peer is the transport's state for one incarnation of a remote segment:
// its control connection and its endpoints.
type peer struct {
	t       *Transport
	name    string
	epoch   uint64
	addr    string
	nRemote int
	// mc is set for a Mooncake segment (Config.Mooncake): addr is then its
	// handshake socket.
	mc  *mcPeer
	eps []atomic.Pointer[endpoint] // [local rail*nRemote + remote rail]
	// railDownUntil is, per remote rail, until when (unix ns) the target
	// reported it down; slices avoid the local rails paired with it.
	railDownUntil []atomic.Int64

	epMu   sync.Mutex // creating endpoints
	nextID uint32
	// goMu guards waiting: Close sets it before it waits for wg, and
	// released adds to wg only while it is not set (a WaitGroup must not
	// gain work while it is waited for). released runs on a rail's owner,
	// which must not wait on epMu.
	goMu    sync.Mutex
	waiting bool

	hsMu  sync.Mutex // one exchange at a time on conn
	conn  net.Conn
	rd    *bufio.Reader
	resp  chan frame
	dead  chan struct{} // closed when the control connection ends
	cause error         // why it ended (set before dead closes)

	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool
	wg     sync.WaitGroup
}

type frame struct {
	h       wire.Header
	payload []byte
}

func newPeer(t *Transport, name string, epoch uint64, nRemote int, addr string) *peer {
	ctx, cancel := context.WithCancel(t.ctx)
	return &peer{t: t, name: name, epoch: epoch, addr: addr, nRemote: nRemote,
		eps: make([]atomic.Pointer[endpoint], len(t.rails)*nRemote), railDownUntil: make([]atomic.Int64, nRemote),
		ctx: ctx, cancel: cancel}
}

// errRemoteRailDown marks a handshake the target refused because the
// rail it was for is down: nothing was posted, so the slices that waited
// for it move to another rail without using up an engine retry.
var errRemoteRailDown = errors.New("rdma: the target's rail is down")

// remoteRailBackoff is how long a remote rail the target reported down is
// avoided before a handshake on it is tried again.
const remoteRailBackoff = time.Second

// usable returns the mask of local rails whose paired remote rail is not
// known to be down; all rails when every pairing is.
func (p *peer) usable(nLocal int) uint64 {
	now := int64(0)
	mask := ^uint64(0)
	for rr := range p.railDownUntil {
		until := p.railDownUntil[rr].Load()
		if until == 0 {
			continue
		}
		if now == 0 {
			now = time.Now().UnixNano()
		}
		if until > now {
			for l := rr; l < nLocal; l += p.nRemote {
				mask &^= 1 << (l % 64)
			}
		}
	}
	if mask == 0 {
		return ^uint64(0)
	}
	return mask
}

// endpoint returns the endpoint from local rail r to remote rail rr,
// starting its handshake on first use. Concurrent first uses share it.
func (p *peer) endpoint(r *rail, rr int) (*endpoint, error) {
	i := r.idx*p.nRemote + rr
	if ep := p.eps[i].Load(); ep != nil {
		if st := ep.state.Load(); st <= epReady {
			if !ep.visited.Load() {
				ep.visited.Store(true)
			}
			return ep, nil
		}
	}
	p.epMu.Lock()
	defer p.epMu.Unlock()
	if p.closed.Load() {
		return nil, fmt.Errorf("rdma: peer %s closed: %w", p.name, driver.ErrPeerReset)
	}
	old := p.eps[i].Load()
	if old != nil && old.state.Load() <= epReady {
		return old, nil
	}
	p.nextID++
	ep := &endpoint{p: p, r: r, rrail: rr, slot: i, id: p.nextID, ctr: p.t.counters(p.name, r.idx)}
	if err := p.t.store.add(ep); err != nil {
		return nil, err
	}
	p.eps[i].Store(ep)
	p.wg.Add(1)
	go p.connect(ep)
	return ep, nil
}

// connect runs ep's handshake and hands the result to the rail's owner.
func (p *peer) connect(ep *endpoint) {
	defer p.wg.Done()
	hs := p.handshake
	if p.mc != nil {
		hs = p.mcHandshake
	}
	if err := hs(ep); err != nil {
		ep.r.call(func() {
			for _, q := range ep.qps {
				q.qp.Close()
			}
		})
		ep.qps = nil
		ep.setFailure(err)
		ep.state.CompareAndSwap(epConnecting, epFailed)
		p.t.store.remove(ep)
		p.eps[ep.slot].CompareAndSwap(ep, nil)
	} else if ep.ctr.connects.Add(1); !ep.state.CompareAndSwap(epConnecting, epReady) {
		// Closed meanwhile: the owner tears it down when itemReady comes.
		ep.r.enqueue(item{kind: itemClose, ep: ep, err: ep.failure()})
	}
	ep.r.enqueue(item{kind: itemReady, ep: ep})
}

// handshake creates ep's QPs, asks the target for its side and connects
// them; the QPs are created and connected on the rail's owner (rail.call).
func (p *peer) handshake(ep *endpoint) (err error) {
	t, r := p.t, ep.r
	ctx, cancel := context.WithTimeout(p.ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	m := connectMsg{Initiator: t.host.LocalName(), InitEpoch: t.host.Epoch(), TargetEpoch: p.epoch, ID: ep.id,
		LocalRail: uint16(r.idx), RemoteRail: uint16(ep.rrail),
		Port: portInfo{GID: r.port.GID.GID, LID: lidOf(r.port), MTU: r.port.Attr.ActiveMTU}}
	psns := make([]uverbs.PSN, t.cfg.QPsPerPath)
	r.call(func() {
		for i := range t.cfg.QPsPerPath {
			var qp railQP
			if qp, err = r.v.CreateQP(r.sendDepth, 1); err != nil {
				return
			}
			credits := min(r.sendDepth, qp.SendDepth())
			ep.qps = append(ep.qps, &qpState{qp: qp, ep: ep, credits: credits})
			psns[i] = randPSN()
			m.QPs = append(m.QPs, qpInfo{QPN: qp.QPN(), PSN: psns[i]})
		}
	})
	if err != nil {
		return err
	}
	f, err := p.exchange(ctx, hsConnect, m.encode())
	if err != nil {
		return err
	}
	switch f.h.Type {
	case hsReject:
		rj, err := decodeReject(f.payload)
		if err != nil {
			return err
		}
		err = fmt.Errorf("%w by %s: %s", errRejected, p.name, rj.Msg)
		switch rj.Code {
		case rejectStaleEpoch:
			return fmt.Errorf("%w: %w", err, driver.ErrPeerReset)
		case rejectLimit:
			return fmt.Errorf("%w: %w", err, driver.ErrTransient)
		case rejectBadRail, rejectInternal:
			// The target's rail is down, or its QP could not reach us
			// over it (address resolution timed out: a link just went
			// down or came back): steer this peer's slices to the other
			// rails for a while and retry there.
			if ep.rrail < len(p.railDownUntil) {
				p.railDownUntil[ep.rrail].Store(time.Now().Add(remoteRailBackoff).UnixNano())
			}
			return fmt.Errorf("%w: %w: %w", err, errRemoteRailDown, driver.ErrTransient)
		}
		return err
	case hsAccept:
	default:
		return fmt.Errorf("rdma: handshake with %s: %w: unexpected %v frame", p.name, wire.ErrFrame, f.h.Type)
	}
	a, err := decodeAccept(f.payload)
	if err != nil {
		return err
	}
	if a.ID != ep.id || len(a.QPs) != len(ep.qps) {
		return fmt.Errorf("rdma: handshake with %s: %w: accept for endpoint %d with %d QPs, want %d with %d",
			p.name, wire.ErrFrame, a.ID, len(a.QPs), ep.id, len(ep.qps))
	}
	r.call(func() {
		for i, q := range ep.qps {
			q.notes = int(a.Notes)
			remote := uverbs.Endpoint{QPN: a.QPs[i].QPN, PSN: a.QPs[i].PSN, GID: a.Port.GID, MTU: a.Port.MTU, LID: a.Port.LID}
			if err = q.qp.Connect(psns[i], remote, t.tune()); err != nil {
				err = fmt.Errorf("rdma: connect QP %#x to %s rail %d: %w", uint32(q.qp.QPN()), p.name, ep.rrail, err)
				return
			}
		}
	})
	return err
}

// exchange sends one request on the control connection (dialing it first
// if needed) and returns the response.
func (p *peer) exchange(ctx context.Context, t wire.Type, payload []byte) (frame, error) {
	p.hsMu.Lock()
	defer p.hsMu.Unlock()
	if p.conn == nil {
		if err := p.dial(ctx); err != nil {
			return frame{}, err
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		p.conn.SetWriteDeadline(dl)
	}
	if err := hsProto.Write(p.conn, t, 0, payload); err != nil {
		return frame{}, fmt.Errorf("rdma: handshake with %s: %w: %w", p.name, err, driver.ErrTransient)
	}
	select {
	case f := <-p.resp:
		return f, nil
	case <-p.dead:
		return frame{}, p.cause
	case <-ctx.Done():
		// The answer may still come: drop the connection rather than
		// match it to the next request.
		p.conn.Close()
		return frame{}, fmt.Errorf("rdma: handshake with %s: %w: %w", p.name, ctx.Err(), driver.ErrTransient)
	}
}

func (p *peer) dial(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return fmt.Errorf("rdma: control connection to %s (%s): %w: %w", p.name, p.addr, err, driver.ErrPeerReset)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlivePeriod(5 * time.Second)
	}
	rd := bufio.NewReader(c)
	if err := p.authenticate(ctx, c, rd); err != nil {
		c.Close()
		return err
	}
	p.conn, p.rd = c, rd
	p.resp, p.dead = make(chan frame, 1), make(chan struct{})
	p.wg.Add(1)
	go p.readLoop(c, p.rd, p.resp, p.dead)
	return nil
}

// authenticate runs te's handshake on a fresh control connection: the
// target must prove it holds the cluster secret before we prove we do,
// and before any endpoint is asked for.
func (p *peer) authenticate(ctx context.Context, c net.Conn, rd *bufio.Reader) error {
	t := p.t
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
		defer c.SetDeadline(time.Time{})
	}
	err := handshake.Dial(control.Stream(rd, c, &hsProto), t.cfg.Auth, auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()},
		auth.Party{Name: p.name, Epoch: p.epoch})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, control.ErrStale):
		err = control.Mark(err, driver.ErrPeerReset)
	case errors.Is(err, control.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
		err = control.Mark(err, driver.ErrTransient)
	}
	return fmt.Errorf("rdma: control connection to %s (%s): %w", p.name, p.addr, err)
}

// readLoop owns the control connection's reads. When the connection ends
// (the target died or closed it), every endpoint of this peer is closed at
// once: posted work flushes instead of waiting out the QP retry bound.
func (p *peer) readLoop(c net.Conn, rd *bufio.Reader, resp chan frame, dead chan struct{}) {
	defer p.wg.Done()
	var hdr [wire.HeaderLen]byte
	var err error
	// Credit frames come with every notification: read into one buffer,
	// decoded into one slice.
	buf := make([]byte, 0, 2+maxCreditsPerMsg*creditLen)
	var creds []credit
	for {
		var h wire.Header
		var payload []byte
		if h, payload, err = hsProto.Read(rd, hdr[:], buf); err != nil {
			break
		}
		if h.Type == hsCredit {
			if creds, err = decodeCredits(payload, creds[:0]); err != nil {
				break
			}
			p.creditsFor(creds)
			continue
		}
		payload = append([]byte(nil), payload...) // buf is reused
		select {
		case resp <- frame{h, payload}:
		default:
			err = fmt.Errorf("%w: unsolicited %v frame", wire.ErrFrame, h.Type)
		}
		if err != nil {
			break
		}
	}
	c.Close()
	p.cause = fmt.Errorf("rdma: control connection to %s ended: %v: %w", p.name, err, driver.ErrPeerReset)
	close(dead)
	p.hsMu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.hsMu.Unlock()
	if !p.closed.Load() {
		p.t.log.Warn("rdma: control connection ended", "peer", p.name, "err", err)
		p.closeEndpoints(p.cause)
	}
}

func (p *peer) closeEndpoints(err error) {
	for i := range p.eps {
		if ep := p.eps[i].Swap(nil); ep != nil {
			p.t.store.remove(ep)
			if !ep.state.CompareAndSwap(epConnecting, epClosed) {
				ep.r.enqueue(item{kind: itemClose, ep: ep, err: err})
			} else {
				ep.setFailure(err)
			}
		}
	}
}

// released is called by the rail owner after ep's QPs are destroyed.
func (p *peer) released(ep *endpoint) {
	p.eps[ep.slot].CompareAndSwap(ep, nil)
	p.t.store.remove(ep)
	p.goMu.Lock()
	defer p.goMu.Unlock()
	if p.closed.Load() || p.waiting {
		return
	}
	// Tell the target to drop its side; best effort, off the owner.
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.hsMu.Lock()
		defer p.hsMu.Unlock()
		if p.conn != nil {
			p.conn.SetWriteDeadline(time.Now().Add(p.t.cfg.HandshakeTimeout))
			hsProto.Write(p.conn, hsRelease, 0, encodeRelease(ep.id))
		}
	}()
}

// Close fails the peer's slices still in flight with ErrPeerReset and
// releases its endpoints and control connection. Idempotent.
func (p *peer) Close() error {
	// Under epMu: no endpoint is created past this point.
	p.epMu.Lock()
	already := p.closed.Swap(true)
	p.epMu.Unlock()
	if already {
		return nil
	}
	p.closeEndpoints(fmt.Errorf("rdma: peer %s closed: %w", p.name, driver.ErrPeerReset))
	p.cancel()
	p.hsMu.Lock()
	if p.conn != nil {
		p.conn.Close()
	}
	p.hsMu.Unlock()
	p.goMu.Lock()
	p.waiting = true
	p.goMu.Unlock()
	p.wg.Wait()
	p.t.forget(p)
	return nil
}

func lidOf(p uverbs.RCPort) uint16 {
	if p.Attr.LinkLayer == uverbs.LinkLayerInfiniBand {
		return p.Attr.LID
	}
	return 0
}

func randPSN() uverbs.PSN {
	var b [4]byte
	rand.Read(b[:])
	return uverbs.PSN(binary.LittleEndian.Uint32(b[:]) & 0xffffff)
}

// store bounds the endpoints held at once and picks idle ones to evict
// with SIEVE: a hand walks from the oldest entry, sparing (and clearing)
// those used since it last passed.
type store struct {
	mu    sync.Mutex
	max   int
	n     int
	head  *endpoint // newest
	tail  *endpoint // oldest
	hand  *endpoint
	evict atomic.Uint64
}

var errStoreFull = errors.New("rdma: endpoint store full of busy endpoints")

func (s *store) add(ep *endpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.n >= s.max {
		v := s.victim()
		if v == nil {
			return fmt.Errorf("%w (%d): %w", errStoreFull, s.max, driver.ErrTransient)
		}
		s.unlink(v)
		s.evict.Add(1)
		if v.p.eps[v.slot].CompareAndSwap(v, nil) {
			v.r.enqueue(item{kind: itemClose, ep: v, err: fmt.Errorf("rdma: endpoint evicted: %w", driver.ErrTransient)})
		}
	}
	ep.inStore = true
	ep.next = s.head
	if s.head != nil {
		s.head.prev = ep
	}
	s.head = ep
	if s.tail == nil {
		s.tail = ep
	}
	s.n++
	return nil
}

// victim runs the SIEVE hand over at most two laps; busy or connecting
// endpoints are never evicted.
func (s *store) victim() *endpoint {
	for range 2*s.n + 1 {
		if s.hand == nil {
			s.hand = s.tail
		}
		ep := s.hand
		if ep == nil {
			return nil
		}
		s.hand = ep.prev
		if ep.visited.Load() {
			ep.visited.Store(false)
			continue
		}
		if ep.busy.Load() == 0 && ep.state.Load() != epConnecting {
			return ep
		}
	}
	return nil
}

func (s *store) remove(ep *endpoint) {
	s.mu.Lock()
	s.unlink(ep)
	s.mu.Unlock()
}

func (s *store) unlink(ep *endpoint) {
	if !ep.inStore {
		return
	}
	ep.inStore = false
	if s.hand == ep {
		s.hand = ep.prev
	}
	if ep.prev != nil {
		ep.prev.next = ep.next
	} else {
		s.head = ep.next
	}
	if ep.next != nil {
		ep.next.prev = ep.prev
	} else {
		s.tail = ep.prev
	}
	ep.prev, ep.next = nil, nil
	s.n--
}
