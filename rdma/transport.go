package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
)

// Transport is the RDMA transport. Create it with New and hand it to
// engine.Install, which drives it through Driver (the engine/driver
// contract); its own methods are for inspection.
type Transport struct {
	cfg  Config
	host driver.Host
	log  *slog.Logger

	// open opens the rails' verbs: openVerbs, or fakes in unit tests.
	open  func(*Config) ([]railVerbs, error)
	rails []*rail
	ln    net.Listener
	addr  string // advertised control address

	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool
	// running is set once Install has succeeded; Close tears down only
	// what a successful Install started (a failed one cleans up itself).
	running bool
	wg      sync.WaitGroup

	store store

	mu      sync.Mutex
	regs    map[uint64]*regKey // by region address, for Describe
	peers   map[*peer]struct{}
	traffic map[railKey]*railCounters
	// tracks are free notification trackers (notify_init.go).
	trackMu sync.Mutex
	tracks  []*noteTrack
	tgt     targetState
	// mc is the passive side of Mooncake's wire (Config.Mooncake); hs its
	// own handshake socket, when Config.Listen asks for one.
	mc mcTarget
	hs *p2p.Store
}

// regKey is a region's registration on every rail.
type regKey struct {
	mrs   []memReg
	lkeys []uint32
	rkeys []uint32
	// prefer is the mask of rails the region's location prefers.
	prefer uint64
}

// New returns a transport; devices are opened by Install.
func New(cfg Config) *Transport {
	cfg.defaults()
	t := &Transport{cfg: cfg, open: openVerbs, regs: map[uint64]*regKey{}, peers: map[*peer]struct{}{}}
	t.store.max = cfg.MaxEndpoints
	return t
}

// sliceSize is Config.SliceSize.
func (t *Transport) sliceSize() uint64 { return t.cfg.SliceSize }

// install opens a context, PD, CQ and owner goroutine per rail and starts
// the control listener.
func (t *Transport) install(h driver.Host) (err error) {
	if t.closed.Load() {
		return fmt.Errorf("rdma: install after Close: %w", driver.ErrClosed)
	}
	if t.host != nil {
		return fmt.Errorf("rdma: installed twice")
	}
	t.host, t.log = h, h.Logger()
	t.ctx, t.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			t.cancel()
			for _, r := range t.rails {
				r.closeVerbs()
			}
			t.rails, t.host = nil, nil
		}
	}()
	vs, err := t.open(&t.cfg)
	if err != nil {
		return err
	}
	if len(vs) == 0 {
		return fmt.Errorf("rdma: no rails")
	}
	for i, v := range vs {
		t.rails = append(t.rails, openRail(t, i, v))
	}
	if t.cfg.Mooncake {
		if err := t.checkMooncake(); err != nil {
			return err
		}
		// Endpoints are set up on the segment's handshake socket; its name
		// (ip:port of that socket in P2PHANDSHAKE mode) is the server
		// part of the NIC paths.
		t.addr = h.LocalName()
		if t.cfg.Listen != "" {
			if err := t.openHandshake(h); err != nil {
				return err
			}
		}
		t.tgt.init(t)
		for _, r := range t.rails {
			r.start()
		}
		t.running = true
		t.mc.start()
		t.log.Info("rdma: installed, speaking Mooncake's wire", "rails", t.railNames(), "server", t.addr)
		return nil
	}
	listen := t.cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
		if a := t.rails[0].port.GID.GID.Addr(); a.Is4() && !a.IsUnspecified() {
			listen = netip.AddrPortFrom(a, 0).String()
		}
	}
	if t.ln, err = net.Listen("tcp", listen); err != nil {
		return fmt.Errorf("rdma: control listener: %w", err)
	}
	t.addr = t.ln.Addr().String()
	if t.cfg.Advertise != "" {
		t.addr = t.cfg.Advertise
	}
	t.tgt.init(t)
	auth.WarnUnauthenticated(t.log, segment.ProtoRDMA, t.ln.Addr(), t.cfg.Auth)
	for _, r := range t.rails {
		r.start()
	}
	t.running = true
	t.wg.Add(1)
	go t.accept()
	t.log.Info("rdma: installed", "rails", t.railNames(), "control", t.addr)
	return nil
}

func (t *Transport) railNames() []string {
	names := make([]string, len(t.rails))
	for i, r := range t.rails {
		names[i] = r.name
	}
	return names
}

// describe publishes the rails, the control endpoint and every buffer's
// per-rail rkeys.
func (t *Transport) describe(d *segment.Descriptor) error {
	part := &segment.RDMA{Devices: make([]segment.Device, 0, len(t.rails))}
	for _, r := range t.rails {
		part.Devices = append(part.Devices, segment.Device{Name: r.name, Port: r.port.Num, GID: r.port.GID.GID.String(),
			LID: lidOf(r.port), MTU: uint32(r.port.Attr.ActiveMTU.Bytes())})
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(d.Buffers) > 0 {
		part.RKeys = make([][]uint32, len(d.Buffers))
	}
	for i := range d.Buffers {
		k := t.regs[d.Buffers[i].Addr]
		if k == nil {
			return fmt.Errorf("rdma: describe: buffer at %#x is not registered with rdma", d.Buffers[i].Addr)
		}
		part.RKeys[i] = slices.Clone(k.rkeys)
	}
	d.Protocols = append(d.Protocols, segment.Protocol{Name: t.proto(), Endpoint: t.addr, RDMA: part})
	return nil
}

// registerMemory registers the region on every rail: local write, remote
// read and write.
func (t *Transport) registerMemory(reg driver.Region) (any, error) {
	k := &regKey{prefer: t.preferred(reg.Location())}
	for _, r := range t.rails {
		mr, err := r.v.RegMR(reg.Bytes())
		if err != nil {
			for _, m := range k.mrs {
				m.Close()
			}
			return nil, fmt.Errorf("rdma: register %d bytes at %#x on %s: %w", reg.Len(), reg.Addr(), r.name, err)
		}
		k.mrs = append(k.mrs, mr)
		k.lkeys = append(k.lkeys, mr.LKey())
		k.rkeys = append(k.rkeys, mr.RKey())
	}
	t.mu.Lock()
	t.regs[reg.Addr()] = k
	t.mu.Unlock()
	return k, nil
}

// unregisterMemory deregisters the region on every rail.
func (t *Transport) unregisterMemory(reg driver.Region, key any) error {
	k, ok := key.(*regKey)
	if !ok {
		return fmt.Errorf("rdma: unregister: foreign key %T", key)
	}
	t.mu.Lock()
	if t.regs[reg.Addr()] == k {
		delete(t.regs, reg.Addr())
	}
	t.mu.Unlock()
	var errs []error
	for _, m := range k.mrs {
		errs = append(errs, m.Close())
	}
	k.mrs = nil
	return errors.Join(errs...)
}

// connect returns the state for one incarnation of a remote segment.
// Endpoints are set up lazily, on the first slice for each rail pair.
func (t *Transport) connect(ctx context.Context, d *segment.Descriptor) (driver.Peer, error) {
	if t.closed.Load() {
		return nil, fmt.Errorf("rdma: %w", driver.ErrClosed)
	}
	if !t.running {
		return nil, fmt.Errorf("rdma: connect %s: not installed", d.Name)
	}
	p, ok := d.Protocol(t.proto())
	if !ok || p.Endpoint == "" {
		return nil, fmt.Errorf("rdma: %s: %w", d.Name, segment.ErrNoProtocol)
	}
	if p.RDMA == nil || len(p.RDMA.Devices) == 0 {
		return nil, fmt.Errorf("rdma: %s publishes no rails: %w", d.Name, segment.ErrInvalid)
	}
	for i, b := range d.Buffers {
		if n := len(p.RDMA.Keys(i)); n != len(p.RDMA.Devices) {
			return nil, fmt.Errorf("rdma: %s: buffer at %#x has %d rkeys for %d rails: %w", d.Name, b.Addr, n, len(p.RDMA.Devices), segment.ErrInvalid)
		}
	}
	pe := newPeer(t, d.Name, d.Epoch, len(p.RDMA.Devices), p.Endpoint)
	if t.cfg.Mooncake {
		pe.mc = &mcPeer{server: mooncake.NICServer(p, d.Name), devs: slices.Clone(p.RDMA.Devices)}
	}
	t.mu.Lock()
	t.peers[pe] = struct{}{}
	t.mu.Unlock()
	return pe, nil
}

func (t *Transport) forget(p *peer) {
	t.mu.Lock()
	delete(t.peers, p)
	t.mu.Unlock()
}

// pickRail chooses the local rail for a slice, among the usable ones (the
// peer's rail they pair with is not known to be down): the rails the memory's
// location prefers (Config.Priority, else the rails on its NUMA node) when
// one of them is up, else all that are up; of those, the one that would be
// done with its outstanding bytes first at its measured rate, so a slower
// rail takes fewer bytes, even of one batch submitted at once. Ties rotate
// with the attempt, so a retry leans to another rail.
func (t *Transport) pickRail(prefer, usable uint64, n int64, attempt int) *rail {
	if prefer&usable != 0 {
		if r := t.leastLoaded(prefer&usable, n, attempt); r != nil {
			return r
		}
	}
	if r := t.leastLoaded(usable, n, attempt); r != nil {
		return r
	}
	return t.leastLoaded(^uint64(0), n, attempt)
}

// leastLoaded returns the up rail of mask that would finish its
// outstanding bytes plus n soonest at its measured rate (a rail not yet
// measured counts as fast as the fastest one).
func (t *Transport) leastLoaded(mask uint64, n int64, attempt int) *rail {
	var top uint64
	for _, r := range t.rails {
		top = max(top, r.rate.Load())
	}
	if top == 0 {
		top = 1
	}
	var best *rail
	var bestT float64
	k := len(t.rails)
	for i := range k {
		r := t.rails[(i+attempt)%k]
		if mask&(1<<(r.idx%64)) == 0 || !r.up.Load() {
			continue
		}
		rate := r.rate.Load()
		if rate == 0 {
			rate = top
		}
		if d := float64(r.outstanding.Load()+n) / float64(rate); best == nil || d < bestT {
			best, bestT = r, d
		}
	}
	return best
}

// preferred returns the mask of rails that memory at location should use
// first: Config.Priority's devices for it, else the rails whose device is
// on the NUMA node of a "cpu:N" location; 0 for no preference.
func (t *Transport) preferred(location string) uint64 {
	var mask uint64
	if names, ok := t.cfg.Priority[location]; ok {
		for _, r := range t.rails {
			if slices.Contains(names, r.name) {
				mask |= 1 << (r.idx % 64)
			}
		}
		return mask
	}
	node, ok := strings.CutPrefix(location, "cpu:")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(node)
	if err != nil {
		return 0
	}
	for _, r := range t.rails {
		if r.numa == n {
			mask |= 1 << (r.idx % 64)
		}
	}
	return mask
}

// remoteRail pairs local rail i with a remote rail: the same index when the
// peer has that many, so rail k of one host talks to rail k of the other.
func remoteRail(local, nRemote int) int { return local % nRemote }

// routed is a slice on its way to a rail's owner.
type routed struct {
	s    *driver.Slice
	tr   *noteTrack
	ep   *endpoint
	rkey uint32
}

// submitChunk is how many slices Submit routes before it hands them to
// the rails' owners (on its stack: no allocation).
const submitChunk = 128

// submitSlices hands the slices to the rails' owners, taking each rail's queue
// lock and waking its owner once per call (per submitChunk slices); it
// never blocks on a peer and may be re-entered from Slice.Done on a retry.
func (t *Transport) submitSlices(ss []*driver.Slice, tr *noteTrack) {
	defer cost.Enqueue.Since(cost.Now())
	var buf [submitChunk]routed
	for len(ss) > 0 {
		n := min(len(ss), submitChunk)
		k := 0
		for _, s := range ss[:n] {
			if rt, ok := t.route(s, tr); ok {
				buf[k] = rt
				k++
				if tr != nil && tr.collect {
					tr.addEP(rt.ep)
				}
			}
		}
		if k > 0 {
			for _, r := range t.rails {
				r.enqueueSlices(buf[:k])
			}
			clear(buf[:k])
		}
		ss = ss[n:]
	}
}

// submit hands one slice to a rail's owner.
func (t *Transport) submit(s *driver.Slice, tr *noteTrack) {
	if rt, ok := t.route(s, tr); ok {
		rt.ep.r.enqueue(item{kind: itemSlice, s: rt.s, tr: rt.tr, ep: rt.ep, rkey: rt.rkey})
	}
}

// route picks the slice's rail and endpoint and counts it there; a slice
// that cannot go anywhere fails at once (false).
func (t *Transport) route(s *driver.Slice, tr *noteTrack) (routed, bool) {
	p, ok := s.Peer.(*peer)
	if !ok {
		sliceDone(s, tr, 0, fmt.Errorf("rdma: slice with a foreign peer %T", s.Peer))
		return routed{}, false
	}
	if t.closed.Load() {
		sliceDone(s, tr, 0, fmt.Errorf("rdma: %w", driver.ErrClosed))
		return routed{}, false
	}
	if p.closed.Load() {
		sliceDone(s, tr, 0, fmt.Errorf("rdma: peer %s closed: %w", p.name, driver.ErrPeerReset))
		return routed{}, false
	}
	r := t.pickRail(s.LocalKey.(*regKey).prefer, p.usable(len(t.rails)), int64(len(s.Local)), s.Attempt())
	if r == nil {
		sliceDone(s, tr, 0, fmt.Errorf("rdma: no rail is up (%d rails)", len(t.rails)))
		return routed{}, false
	}
	rr := remoteRail(r.idx, p.nRemote)
	keys := remoteKeys(s, t.proto())
	if rr >= len(keys) {
		sliceDone(s, tr, 0, fmt.Errorf("rdma: %s buffer at %#x has no rkey for rail %d", p.name, s.RemoteAddr, rr))
		return routed{}, false
	}
	ep, err := p.endpoint(r, rr)
	if err != nil {
		sliceDone(s, tr, 0, err)
		return routed{}, false
	}
	ep.busy.Add(1)
	r.outstanding.Add(int64(len(s.Local)))
	return routed{s: s, tr: tr, ep: ep, rkey: keys[rr]}, true
}

// remoteKeys returns the per-rail keys of the slice's remote buffer, from
// the descriptor's entry named proto. It does not allocate.
func remoteKeys(s *driver.Slice, proto string) []uint32 {
	for i := range s.Remote.Protocols {
		if p := &s.Remote.Protocols[i]; p.Name == proto {
			return p.RDMA.Keys(s.RemoteIndex)
		}
	}
	return nil
}

// Stats returns per-rail counters.
func (t *Transport) Stats() []RailStats {
	out := make([]RailStats, len(t.rails))
	for i, r := range t.rails {
		out[i] = r.stats()
	}
	return out
}

// rnrRetry is the QPs' RNR retry count. An initiator SENDs only against
// a receive the target has posted (a credit), so an RNR NAK is a broken
// promise, not a slow receiver: a few retries, then a failed SEND that is
// resent on a fresh endpoint, rather than the default's endless retry
// that would stall the QP's WRITEs behind it.
const rnrRetry = 6

func (t *Transport) tune() uverbs.ConnectConfig {
	return uverbs.ConnectConfig{Timeout: t.cfg.QPTimeout, RetryCnt: t.cfg.RetryCount, RNRRetry: rnrRetry}
}

// shutdown fails every slice in flight with ErrClosed, destroys every QP and
// registration and stops every goroutine. Idempotent.
func (t *Transport) shutdown() error {
	if t.closed.Swap(true) || !t.running {
		return nil
	}
	if t.ln != nil {
		t.ln.Close()
	}
	if t.hs != nil {
		t.hs.Close()
	}
	t.mu.Lock()
	peers := make([]*peer, 0, len(t.peers))
	for p := range t.peers {
		peers = append(peers, p)
	}
	t.mu.Unlock()
	for _, p := range peers {
		p.closed.Store(true) // endpoints fail with ErrClosed, not ErrPeerReset
		p.cancel()
		p.hsMu.Lock()
		if p.conn != nil {
			p.conn.Close()
		}
		p.hsMu.Unlock()
	}
	t.cancel()
	t.tgt.closeAll()
	t.mc.closeAll()
	t.wg.Wait()
	for _, r := range t.rails {
		r.stop()
	}
	for _, p := range peers {
		p.wg.Wait()
	}
	var errs []error
	t.mu.Lock()
	for a, k := range t.regs {
		for _, m := range k.mrs {
			errs = append(errs, m.Close())
		}
		delete(t.regs, a)
	}
	t.mu.Unlock()
	for _, r := range t.rails {
		errs = append(errs, r.closeVerbs())
		r.helpWG.Wait()
	}
	return errors.Join(errs...)
}
