package rdma

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
)

// Mooncake's RDMA wire (Config.Mooncake), checked against Mooncake
// 777cc778's rdma_endpoint.cpp, rdma_transport.cpp and config.h. The data
// path is the transport's own: rails, MRs, owner goroutines, endpoints of
// QPsPerPath QPs from a local rail to a remote device. What changes is how
// an endpoint is set up and what is published:
//
//   - The descriptor entry is mooncake.TEProtoRDMA; package mooncake
//     translates it to and from Mooncake's segment descriptor (devices in
//     rail order, one rkey per device per buffer, a priority matrix in
//     devices order), and package mooncake/p2p serves it.
//   - An endpoint is set up by one Connection message to the peer's
//     handshake socket (mooncake/p2p.SendConnection): NIC paths
//     "server@device" of both ends, this rail's LID and GID, the QP
//     numbers; the reply carries the peer's, the NIC paths swapped, or a
//     refusal in reply_msg. When the reply carries the ready_ack key, a
//     second Connection message with ready_ack true follows once the QPs
//     are ready to send, as Mooncake's active side sends it.
//   - The passive side (HandleConnection, wired to the handshake socket
//     by p2p.Store.HandleConnections) finds its rail by the device in
//     peer_nic_path and answers with responder QPs connected to the
//     offered ones; an endpoint is named by (rail, the peer's
//     local_nic_path), as Mooncake's endpoint store names it, so a repeat
//     of the same record gets the same QPs and a new one replaces them.
//   - QPs are connected as Mooncake connects its own: PSN 0 both ways,
//     path MTU the rail's active MTU (at most 4096, Mooncake's MC_MTU;
//     the handshake carries no MTU, so both ends must run the same one),
//     max_dest_rd_atomic and max_rd_atomic 16 (fewer where the device has
//     fewer), min_rnr_timer 12, hop limit 16, RNR retry 7, and on hardware
//     ACK timeout 14 and retry count 7 (Config.QPTimeout and RetryCount
//     override the two). These two are each end's own and need not match
//     the peer's: where the provider sets its own defaults (rxe's ~1.07 s
//     ACK timeout, because 6.1's rxe replays the wrong WQE when a
//     retransmission races late ACKs and the responder NAKs it as an
//     invalid request) they are the provider's.
//
// The wire has no authentication, no epochs and no lease: the passive
// side bounds what it holds (MaxInitiatorQPs per source address,
// MaxTargetQPs in all, the oldest endpoint making room) rather than
// tying QPs to a connection, and answers one handshake at a time, as
// Mooncake's listener does.

// mcQPMax caps the QPs one Connection message may ask for.
const mcQPMax = maxQPsPerMsg

// Mooncake's QP attributes (rdma_endpoint.cpp, config.h defaults).
const (
	mcTimeout     = 14
	mcRetryCnt    = 7
	mcRNRRetry    = 7
	mcMinRNRTimer = 12
	mcRdAtomic    = 16
	mcHopLimit    = 16
)

// proto is the name of the transport's descriptor entry.
func (t *Transport) proto() string {
	if t.cfg.Mooncake {
		return mooncake.TEProtoRDMA
	}
	return segment.ProtoRDMA
}

// mcTune is the QP attributes of a Mooncake endpoint on r.
func (t *Transport) mcTune(r *rail) uverbs.ConnectConfig {
	to, rc := t.qpTiming(r.port)
	c := uverbs.ConnectConfig{Timeout: to, RetryCnt: rc, RNRRetry: mcRNRRetry,
		MinRNRTimer: mcMinRNRTimer, MaxRdAtomic: mcRdAtomic, MaxDestRdAtomic: mcRdAtomic, HopLimit: mcHopLimit,
		MTU: min(r.port.Attr.ActiveMTU, uverbs.MTU4096)}
	if r.port.MaxRdAtomic > 0 {
		c.MaxRdAtomic = min(c.MaxRdAtomic, r.port.MaxRdAtomic)
	}
	if r.port.MaxDestRdAtomic > 0 {
		c.MaxDestRdAtomic = min(c.MaxDestRdAtomic, r.port.MaxDestRdAtomic)
	}
	return c
}

// qpTiming is the ACK timeout exponent and retry count of the QPs on
// port: Config.QPTimeout and RetryCount, else the provider's defaults, or
// on hardware in Mooncake mode Mooncake's.
func (t *Transport) qpTiming(port uverbs.RCPort) (timeout, retry uint8) {
	timeout, retry = t.cfg.QPTimeout, t.cfg.RetryCount
	d := port.Defaults
	if t.cfg.Mooncake && d.Timeout == uverbs.HardwareRCDefaults.Timeout && d.RetryCnt == uverbs.HardwareRCDefaults.RetryCnt {
		d.Timeout, d.RetryCnt = mcTimeout, mcRetryCnt
	}
	if timeout == 0 {
		timeout = d.Timeout
	}
	if retry == 0 {
		retry = d.RetryCnt
	}
	return timeout, retry
}

// mcPeer is what an initiator needs of a Mooncake segment beyond the
// common peer: the server part of its NIC paths and its devices.
type mcPeer struct {
	server string
	devs   []segment.Device
}

// mcHandshake sets ep up over the peer's handshake socket (the Endpoint of
// its entry): QPs created and connected on the rail's owner, the exchange
// off it.
func (p *peer) mcHandshake(ep *endpoint) (err error) {
	t, r := p.t, ep.r
	ctx, cancel := context.WithTimeout(p.ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	if ep.rrail >= len(p.mc.devs) {
		return fmt.Errorf("rdma: %s has no device %d", p.name, ep.rrail)
	}
	dev := p.mc.devs[ep.rrail]
	req := mooncake.Handshake{LocalNICPath: mooncake.NICPath(t.host.LocalName(), r.name), PeerNICPath: mooncake.NICPath(p.mc.server, dev.Name),
		LocalLID: lidOf(r.port), LocalGID: netip.AddrFrom16(r.port.GID.GID), ReadyAckSupported: true}
	r.call(func() {
		for range t.cfg.QPsPerPath {
			var qp railQP
			if qp, err = r.v.CreateQP(r.sendDepth, 1); err != nil {
				return
			}
			ep.qps = append(ep.qps, &qpState{qp: qp, ep: ep, credits: min(r.sendDepth, qp.SendDepth())})
			req.QPNums = append(req.QPNums, uint32(qp.QPN()))
		}
	})
	if err != nil {
		return err
	}
	rep, err := p2p.SendConnection(ctx, p.addr, &req, t.cfg.HandshakeTimeout)
	if err != nil {
		return fmt.Errorf("rdma: handshake with %s (%s): %w: %w", p.name, p.addr, err, driver.ErrTransient)
	}
	if rep.ReplyMsg != "" {
		return fmt.Errorf("%w by %s (%s): %s", errRejected, p.name, req.PeerNICPath, rep.ReplyMsg)
	}
	if rep.LocalNICPath != req.PeerNICPath || rep.PeerNICPath != req.LocalNICPath {
		return fmt.Errorf("rdma: handshake with %s: the reply is for %s -> %s, not %s -> %s",
			p.name, rep.PeerNICPath, rep.LocalNICPath, req.LocalNICPath, req.PeerNICPath)
	}
	if len(rep.QPNums) != len(ep.qps) {
		return fmt.Errorf("rdma: handshake with %s: %d QPs answered for %d (both ends must use as many QPs per endpoint: Mooncake's MC_NUM_QP_PER_EP, te's QPsPerPath)",
			p.name, len(rep.QPNums), len(ep.qps))
	}
	remote := uverbs.Endpoint{LID: rep.LocalLID}
	gid := rep.LocalGID
	if !gid.IsValid() {
		// Mooncake then takes the GID and LID the descriptor publishes.
		if gid, err = netip.ParseAddr(dev.GID); err != nil {
			return fmt.Errorf("rdma: handshake with %s: no GID in the reply, and device %s's is %q", p.name, dev.Name, dev.GID)
		}
		remote.LID = dev.LID
	}
	remote.GID = uverbs.GIDFromAddr(gid)
	tune := t.mcTune(r)
	r.call(func() {
		for i, q := range ep.qps {
			remote.QPN = uverbs.QPN(rep.QPNums[i])
			if err = q.qp.Connect(0, remote, tune); err != nil {
				err = fmt.Errorf("rdma: connect QP %#x to %s: %w", uint32(q.qp.QPN()), req.PeerNICPath, err)
				return
			}
		}
	})
	if err != nil || !rep.ReadyAckSupported {
		return err
	}
	req.ReadyAck = true
	ack, err := p2p.SendConnection(ctx, p.addr, &req, t.cfg.HandshakeTimeout)
	switch {
	case err != nil:
		return fmt.Errorf("rdma: ready ack to %s (%s): %w: %w", p.name, p.addr, err, driver.ErrTransient)
	case ack.ReplyMsg != "":
		return fmt.Errorf("%w: ready ack by %s (%s): %s: %w", errRejected, p.name, req.PeerNICPath, ack.ReplyMsg, driver.ErrTransient)
	}
	return nil
}

// mcTarget is the passive side's endpoints.
type mcTarget struct {
	hs sync.Mutex // one handshake at a time (and Close)

	mu     sync.Mutex
	open   bool // installed and not closed
	eps    map[mcKey]*mcEP
	perSrc map[netip.Addr]int
	total  int
	seq    uint64
}

// mcKey names a passive endpoint as Mooncake's endpoint store does: the
// local rail and the peer's NIC path.
type mcKey struct {
	rail int
	peer string
}

type mcEP struct {
	key  mcKey
	src  netip.Addr
	r    *rail
	qps  []*tgtQP
	peer []uint32 // the peer's QP numbers
	seq  uint64   // order of setup, oldest first out
}

func (m *mcTarget) start() {
	m.mu.Lock()
	m.open = true
	m.eps = map[mcKey]*mcEP{}
	m.perSrc = map[netip.Addr]int{}
	m.mu.Unlock()
}

// HandleConnection answers one Connection message of Mooncake's RDMA
// endpoint handshake (mooncake.ConnectionHandler): the passive side of an
// endpoint from the sender's NIC to the rail named in peer_nic_path. It
// is for a transport with Config.Mooncake; hand it to the segment's
// handshake socket with p2p.Store.HandleConnections.
func (t *Transport) HandleConnection(ctx context.Context, from netip.Addr, req *mooncake.Handshake) *mooncake.Handshake {
	rep := &mooncake.Handshake{LocalNICPath: req.PeerNICPath, PeerNICPath: req.LocalNICPath, ReadyAckSupported: true}
	refuse := func(format string, a ...any) *mooncake.Handshake {
		rep.ReplyMsg = "te: " + fmt.Sprintf(format, a...)
		rep.QPNums, rep.LocalGID, rep.LocalLID = nil, netip.Addr{}, 0
		return rep
	}
	if !t.cfg.Mooncake {
		return refuse("this rdma transport does not speak Mooncake's wire")
	}
	_, dev, err := mooncake.SplitNICPath(req.PeerNICPath)
	if err != nil {
		return refuse("invalid peer_nic_path: %v", err)
	}
	if _, _, err := mooncake.SplitNICPath(req.LocalNICPath); err != nil {
		return refuse("invalid local_nic_path: %v", err)
	}
	m := &t.mc
	m.hs.Lock()
	defer m.hs.Unlock()
	m.mu.Lock()
	open := m.open
	m.mu.Unlock()
	if !open {
		return refuse("the transport is not running")
	}
	if err := ctx.Err(); err != nil {
		return refuse("%v", err)
	}
	var r *rail
	for _, x := range t.rails {
		if x.name == dev {
			r = x
		}
	}
	if r == nil {
		return refuse("no rail on device %q (rails: %s)", dev, strings.Join(t.railNames(), ", "))
	}
	if !r.up.Load() {
		return refuse("rail %s is down", r.name)
	}
	rep.LocalLID, rep.LocalGID = lidOf(r.port), netip.AddrFrom16(r.port.GID.GID)
	key := mcKey{rail: r.idx, peer: req.LocalNICPath}
	m.mu.Lock()
	old := m.eps[key]
	m.mu.Unlock()
	if req.ReadyAck {
		// Responder QPs post nothing: the ack only confirms the pairing.
		if old == nil || !slices.Equal(old.peer, req.QPNums) {
			return refuse("ready ack for QPs %v, which no endpoint of %s holds", req.QPNums, req.LocalNICPath)
		}
		rep.QPNums = old.local()
		return rep
	}
	if old != nil && slices.Equal(old.peer, req.QPNums) {
		rep.QPNums = old.local()
		return rep
	}
	n := len(req.QPNums)
	if n == 0 || n > mcQPMax {
		return refuse("%d QPs offered; 1 to %d per endpoint", n, mcQPMax)
	}
	if !req.LocalGID.IsValid() {
		return refuse("no local_gid: te needs the active side's GID in the record")
	}
	if old != nil {
		m.drop(old)
	}
	if n > t.cfg.MaxInitiatorQPs || n > t.cfg.MaxTargetQPs {
		return refuse("%d QPs exceed the bound of %d per source, %d in all", n, t.cfg.MaxInitiatorQPs, t.cfg.MaxTargetQPs)
	}
	m.makeRoom(from, n, t.cfg.MaxInitiatorQPs, t.cfg.MaxTargetQPs)
	ep := &mcEP{key: key, src: from, r: r, peer: slices.Clone(req.QPNums)}
	remote := uverbs.Endpoint{GID: uverbs.GIDFromAddr(req.LocalGID), LID: req.LocalLID}
	tune := t.mcTune(r)
	r.call(func() {
		for _, qpn := range req.QPNums {
			// A responder sends nothing: the smallest queues do.
			var qp railQP
			if qp, err = r.v.CreateQP(1, 1); err != nil {
				return
			}
			ep.qps = append(ep.qps, &tgtQP{qp: qp})
			remote.QPN = uverbs.QPN(qpn)
			if err = qp.Connect(0, remote, tune); err != nil {
				err = fmt.Errorf("connect QP %#x on %s to %s: %w", uint32(qp.QPN()), r.name, req.LocalGID, err)
				return
			}
		}
	})
	if err != nil {
		ep.close()
		t.log.Warn("rdma: Mooncake endpoint refused", "peer", req.LocalNICPath, "from", from, "err", err)
		return refuse("%v", err)
	}
	m.mu.Lock()
	m.seq++
	ep.seq = m.seq
	m.eps[key] = ep
	m.perSrc[from] += n
	m.total += n
	m.mu.Unlock()
	rep.QPNums = ep.local()
	return rep
}

// local returns the endpoint's QP numbers.
func (e *mcEP) local() []uint32 {
	out := make([]uint32, len(e.qps))
	for i, q := range e.qps {
		out[i] = uint32(q.qp.QPN())
	}
	return out
}

// close destroys the endpoint's QPs on their rail's owner.
func (e *mcEP) close() {
	e.r.call(func() {
		for _, q := range e.qps {
			e.r.closeTargetQP(q)
		}
	})
}

// drop forgets e and destroys its QPs (hs held).
func (m *mcTarget) drop(e *mcEP) {
	m.mu.Lock()
	if m.eps[e.key] == e {
		delete(m.eps, e.key)
		n := len(e.qps)
		if m.perSrc[e.src] -= n; m.perSrc[e.src] <= 0 {
			delete(m.perSrc, e.src)
		}
		m.total -= n
	}
	m.mu.Unlock()
	e.close()
}

// makeRoom drops the oldest endpoints of src while it would hold more
// than perSrc QPs with n more, then the oldest of all while the total
// would exceed total (hs held). The wire has no lease that says which
// endpoints are still used: the oldest one goes.
func (m *mcTarget) makeRoom(src netip.Addr, n, perSrc, total int) {
	for {
		m.mu.Lock()
		var victim *mcEP
		over := m.perSrc[src]+n > perSrc
		if over || m.total+n > total {
			for _, e := range m.eps {
				if (!over || e.src == src) && (victim == nil || e.seq < victim.seq) {
					victim = e
				}
			}
		}
		m.mu.Unlock()
		if victim == nil {
			return
		}
		m.drop(victim)
	}
}

// closeAll destroys every passive endpoint and refuses later handshakes
// (Close, before the rails' owners stop).
func (m *mcTarget) closeAll() {
	m.hs.Lock()
	defer m.hs.Unlock()
	m.mu.Lock()
	m.open = false
	eps := m.eps
	m.eps, m.perSrc, m.total = nil, nil, 0
	m.mu.Unlock()
	for _, e := range eps {
		e.close()
	}
}

// count counts the passive endpoints and their QPs (tests).
func (m *mcTarget) count() (eps, qps int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.eps), m.total
}

// openHandshake opens the transport's own handshake socket on
// Config.Listen: its Connection messages are this transport's endpoint
// handshakes, its Notify messages go to the engine's inbox, and its
// address is the descriptor entry's endpoint (Mooncake's rpc_meta where
// the store publishes one).
func (t *Transport) openHandshake(h driver.Host) error {
	st, err := p2p.New(context.Background(), p2p.Options{Listen: t.cfg.Listen, Timeout: t.cfg.HandshakeTimeout, Logger: t.log})
	if err != nil {
		return fmt.Errorf("rdma: Mooncake handshake socket: %w", err)
	}
	st.HandleConnections(t)
	st.ReceiveNotifications(h.Inbox())
	t.hs, t.addr = st, st.Name()
	return nil
}

// errMooncakeAuth: Mooncake's wire has no authentication.
var errMooncakeAuth = errors.New("rdma: Mooncake's wire has no authentication; Config.Auth must be nil with Config.Mooncake")

// checkMooncake checks what Mooncake mode needs at Install.
func (t *Transport) checkMooncake() error {
	if t.cfg.Auth != nil {
		return errMooncakeAuth
	}
	if name := t.host.LocalName(); strings.Contains(name, "@") || name == "" {
		return fmt.Errorf("rdma: segment name %q cannot be the server part of Mooncake NIC paths (server@device): it must be non-empty and have no '@'", name)
	}
	return nil
}

// mcSendNote sends n as Mooncake's Notify message to its peer's handshake
// socket (its submission's slices have all completed), off the caller's
// goroutine. Mooncake's Notify has no ID to drop a second copy by, so a
// failed send is not retried: it may have arrived; its error is not
// transient.
func (t *Transport) mcSendNote(n *outNote) {
	p := n.p
	p.goMu.Lock()
	if p.closed.Load() || p.waiting {
		p.goMu.Unlock()
		n.finish(fmt.Errorf("rdma: peer %s closed: %w", p.name, driver.ErrPeerReset))
		return
	}
	p.wg.Add(1)
	p.goMu.Unlock()
	rec := p2p.NotifyRecord{Name: n.name, NotifyMsg: string(n.msg)}
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(p.ctx, t.cfg.HandshakeTimeout)
		defer cancel()
		err := p2p.SendNotify(ctx, p.addr, rec, t.cfg.HandshakeTimeout)
		if err != nil {
			err = fmt.Errorf("rdma: notification to %s (%s): %w", p.name, p.addr, err)
		}
		n.finish(err)
	}()
}
