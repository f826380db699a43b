package diagnose

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/providers"
)

// rail is what the walk learns about one local rail.
type rail struct {
	unit   string
	dev    segment.Device // local, as the engine's descriptor has it
	remote segment.Device // the remote rail it pairs with (rdma: local index mod remote rails)
	rr     int            // the remote rail's index
	gid    uverbs.GIDEntry
	gidOK  bool
	checks map[Layer]Check
}

// rdmaLayers are the per-rail layers, in report order.
var rdmaLayers = []Layer{LayerRDMAPort, LayerRDMAGID, LayerRDMAMTU, LayerRDMARoute, LayerRDMAQP, LayerRDMATimeout, LayerRDMARKey, LayerRDMAProbe}

// rdma checks each local rail of the engine's rdma transport against the
// remote rail its slices go to: the port, the GIDs, the MTUs, the route,
// the QP settings and the rkeys from what the devices and descriptors say,
// then a probe per rail through a probe engine whose memory prefers that
// rail (which must carry the probe's bytes: its counters say so).
func (w *walk) rdma(ctx context.Context) bool {
	ld, rd := rails(w.cfg.Engine.LocalDescriptor()), rails(w.desc)
	switch {
	case len(ld.Devices) == 0:
		w.fail(LayerRDMAPort, "", engine.ErrNoTransport, "the engine's rdma transport has no rail", installFix(segment.ProtoRDMA))
		return false
	case len(rd.Devices) == 0:
		w.fail(LayerRDMAPort, "", segment.ErrInvalid, "the segment offers rdma but publishes no rail", "restart the peer with an RDMA device (te devices on its host)")
		return false
	}
	var opts *uverbs.Options
	var tune rdma.Config
	if w.cfg.RDMA != nil {
		tune = *w.cfg.RDMA
	}
	if opts = tune.Options; opts == nil || len(opts.Providers) == 0 {
		opts = providers.Options() // what rdma.New defaults to
		tune.Options = opts
	}
	rs := make([]*rail, len(ld.Devices))
	for i, d := range ld.Devices {
		rr := i % len(rd.Devices)
		r := &rail{unit: fmt.Sprintf("rail %d %s:%d", i, d.Name, d.Port), dev: d, remote: rd.Devices[rr], rr: rr, checks: map[Layer]Check{}}
		rs[i] = r
		w.railStatic(r, opts, tune)
		w.railRKey(r)
	}
	w.railProbes(ctx, rs, tune)
	ok := true
	for _, l := range rdmaLayers {
		var cs []Check
		for _, r := range rs {
			c, found := r.checks[l]
			if !found {
				c = Check{Layer: l, Status: Skip, Detail: "not checked: a layer below failed"}
			}
			c.Layer, c.Unit = l, r.unit
			ok = ok && c.Status == Pass
			cs = append(cs, c)
		}
		w.rep.Checks = append(w.rep.Checks, collapse(cs, "rails")...)
	}
	return ok
}

func (r *rail) pass(l Layer, detail string) { r.checks[l] = Check{Status: Pass, Detail: detail} }

func (r *rail) fail(l Layer, err error, detail, fix string) {
	r.checks[l] = Check{Status: Fail, Detail: detail, Fix: fix, Err: err}
}

func (r *rail) passed(ls ...Layer) bool {
	for _, l := range ls {
		if r.checks[l].Status != Pass {
			return false
		}
	}
	return true
}

// railStatic checks what the device, the kernel and the descriptors say:
// port state, GID, MTU, route, QP timeouts.
func (w *walk) railStatic(r *rail, opts *uverbs.Options, tune rdma.Config) {
	dev, err := uverbs.LookupDevice(r.dev.Name)
	var c *uverbs.Context
	if err == nil {
		c, err = dev.Open(opts)
	}
	if err != nil {
		r.fail(LayerRDMAPort, err, fmt.Sprintf("cannot open %s: %v", r.dev.Name, err), "te devices says which devices this host has and why one does not open")
		return
	}
	defer c.Close()
	pa, err := c.QueryPort(r.dev.Port)
	if err != nil {
		r.fail(LayerRDMAPort, err, fmt.Sprintf("query port %d: %v", r.dev.Port, err), "te devices -v -d "+r.dev.Name)
		return
	}
	ents, err := c.QueryGIDTable()
	if err != nil {
		ents, err = dev.GIDs(int(r.dev.Port))
	}
	for _, g := range ents {
		if g.Port == int(r.dev.Port) && g.GID.String() == r.dev.GID {
			r.gid, r.gidOK = g, true
		}
	}
	netdev := r.gid.Netdev
	if netdev == "" {
		netdev = dev.Parent
	}
	if pa.State != uverbs.PortActive && pa.State != uverbs.PortActiveDefer {
		detail := fmt.Sprintf("%s port %d is %s (physical state %d)", r.dev.Name, r.dev.Port, pa.State, pa.PhysState)
		fix := "bring the port's link up"
		if netdev != "" {
			op := operstate(netdev)
			detail += fmt.Sprintf("; its netdev %s is %s", netdev, op)
			fix = fmt.Sprintf("bring %s up (ip link set %s up) and check its cable or peer end; the rail stays out of use until its port is ACTIVE", netdev, netdev)
		}
		r.fail(LayerRDMAPort, ErrRailDown, detail, fix)
		return
	}
	r.pass(LayerRDMAPort, fmt.Sprintf("%s port %d ACTIVE, link layer %s, netdev %s", r.dev.Name, r.dev.Port, linkLayer(pa.LinkLayer), orDash(netdev)))

	// GID: ours must be in the table, RoCE v2 over IPv4 (routable); the
	// peer's must be routable too.
	remote, rerr := netip.ParseAddr(r.remote.GID)
	switch {
	case err != nil || !r.gidOK:
		r.fail(LayerRDMAGID, uverbs.ErrNoGID, fmt.Sprintf("the rail's GID %s is not in %s port %d's GID table any more (its address was removed?)", r.dev.GID, r.dev.Name, r.dev.Port),
			"restore the netdev's address, or restart so the transport picks a GID that exists")
		return
	case pa.LinkLayer == uverbs.LinkLayerEthernet && r.gid.GID.Addr().IsLinkLocalUnicast():
		r.fail(LayerRDMAGID, ErrBadGID, fmt.Sprintf("local GID[%d] %s (%s) is link-local: RoCE v2 routes by IP and a link-local GID reaches no peer (QPs fail at RTR or never get an ACK)", r.gid.Index, r.gid.GID, r.gid.Type),
			"use the RoCE v2 GID that maps the netdev's IPv4 address: drop a forced GID index (rdma.Config.GIDIndex) so te picks it; te devices -v lists the table")
		return
	case pa.LinkLayer == uverbs.LinkLayerEthernet && r.gid.Type != uverbs.GIDTypeRoCEv2:
		r.fail(LayerRDMAGID, ErrBadGID, fmt.Sprintf("local GID[%d] %s is %s, not RoCE v2: RoCE v1 does not cross an IP router", r.gid.Index, r.gid.GID, r.gid.Type),
			"use the RoCE v2 GID of the netdev's IPv4 address (te devices -v lists the table)")
		return
	case rerr != nil:
		r.fail(LayerRDMAGID, ErrBadGID, fmt.Sprintf("the peer's rail %d (%s) publishes GID %q, not an address", r.rr, r.remote.Name, r.remote.GID), "restart the peer so it republishes")
		return
	case pa.LinkLayer == uverbs.LinkLayerEthernet && remote.IsLinkLocalUnicast():
		r.fail(LayerRDMAGID, ErrBadGID, fmt.Sprintf("the peer's rail %d %s:%d publishes link-local GID %s: RoCE v2 routes by IP and cannot reach it", r.rr, r.remote.Name, r.remote.Port, remote),
			"on the peer, use the RoCE v2 GID of its netdev's IPv4 address: drop its forced GID index so te picks it")
		return
	}
	kind := "IPv6"
	if a := r.gid.GID.Addr(); a.Is4() || a.Is4In6() {
		kind = "IPv4-mapped"
	}
	r.pass(LayerRDMAGID, fmt.Sprintf("local GID[%d] %s %s %s; the peer's rail %d %s:%d GID %s", r.gid.Index, r.gid.GID, r.gid.Type, kind, r.rr, r.remote.Name, r.remote.Port, remote))

	// MTU: both ends' active MTUs and the netdev's.
	local, ndMTU := pa.ActiveMTU.Bytes(), 0
	if netdev != "" {
		if ifi, err := net.InterfaceByName(netdev); err == nil {
			ndMTU = ifi.MTU
		}
	}
	path := local
	if r.remote.MTU != 0 && int(r.remote.MTU) < path {
		path = int(r.remote.MTU)
	}
	mtus := fmt.Sprintf("local %s active MTU %d (netdev %s MTU %d), the peer's %s %d", r.dev.Name, local, orDash(netdev), ndMTU, r.remote.Name, r.remote.MTU)
	if r.remote.MTU != 0 && int(r.remote.MTU) != local {
		r.fail(LayerRDMAMTU, ErrMTU, "MTU mismatch: "+mtus+fmt.Sprintf("; QPs run at the smaller, %d, and a hop sized for the other drops frames: mixed MTUs across a fabric are a frequent cause of stalls", path),
			"give every rail's netdev the same MTU on both hosts and the switches between (ip link set DEV mtu 9000 or 1500 everywhere)")
	} else {
		r.pass(LayerRDMAMTU, mtus+fmt.Sprintf("; path MTU %d", path))
	}

	// Route: a rail's packets must leave through its own netdev.
	la, ra := r.gid.GID.Addr().Unmap(), remote.Unmap()
	if !la.Is4() || !ra.Is4() || pa.LinkLayer != uverbs.LinkLayerEthernet {
		r.pass(LayerRDMARoute, "not IPv4 RoCE: no IP route to check")
	} else if rs, err := netlink.RouteGetWithOptions(ra.AsSlice(), &netlink.RouteGetOptions{SrcAddr: la.AsSlice()}); err != nil || len(rs) == 0 {
		r.fail(LayerRDMARoute, ErrRoute, fmt.Sprintf("no route from %s to %s: %v", la, ra, err), fmt.Sprintf("add a route to %s from %s via the rail's netdev %s", ra, la, orDash(netdev)))
	} else if out := ifName(rs[0].LinkIndex); r.gid.Ifindex != 0 && rs[0].LinkIndex != r.gid.Ifindex {
		r.fail(LayerRDMARoute, ErrRoute, fmt.Sprintf("traffic from %s to %s leaves through %s, not the rail's netdev %s: the rail's packets go out on another interface (or loop back locally) and never reach the peer's rail", la, ra, out, orDash(netdev)),
			fmt.Sprintf("route each rail through its own interface: ip rule add from %s lookup 100; ip route add %s dev %s table 100 (or fix the subnets so the main table does)", la, ra, orDash(netdev)))
	} else {
		r.pass(LayerRDMARoute, fmt.Sprintf("%s -> %s leaves through %s", la, ra, out))
	}

	// ACK timeout and retries: what QPs are connected with.
	def := uverbs.HardwareRCDefaults
	if p, err := c.RCPort(r.dev.Port, r.gid.Index); err == nil {
		def = p.Defaults
	}
	to, rc := def.Timeout, def.RetryCnt
	if tune.QPTimeout != 0 {
		to = tune.QPTimeout
	}
	if tune.RetryCount != 0 {
		rc = tune.RetryCount
	}
	ack := time.Duration(4096<<to) * time.Nanosecond
	set := fmt.Sprintf("ACK timeout exponent %d (%v), retry count %d: a dead peer fails work after %v", to, ack.Round(time.Microsecond), rc, uverbs.RetryBound(to, rc).Round(time.Millisecond))
	switch {
	case to == 0 || to > 24:
		r.fail(LayerRDMATimeout, ErrQPTune, set+"; an exponent of 0 waits forever, above 24 for minutes: a dead peer hangs transfers", "set rdma.Config.QPTimeout between 14 (67 ms, hardware) and 18 (1 s, rxe)")
	case rc >= 7:
		r.fail(LayerRDMATimeout, ErrQPTune, set+"; a retry count of 7 retries forever on some devices", "set rdma.Config.RetryCount to 6 or less")
	default:
		r.pass(LayerRDMATimeout, set)
	}
}

// railRKey checks the remote rail's rkeys: one per rail for each buffer,
// and, with a cached descriptor, the same as the peer's current ones.
func (w *walk) railRKey(r *rail) {
	d, rd := w.desc, rails(w.desc)
	b, keys := d.Buffers[0], rd.Keys(0)
	if len(keys) != len(rd.Devices) {
		r.fail(LayerRDMARKey, segment.ErrInvalid, fmt.Sprintf("the peer's buffer %#x has %d rkeys for %d rails", b.Addr, len(keys), len(rd.Devices)), "restart the peer so it republishes")
		return
	}
	cur := keys[r.rr]
	if c := w.cfg.Cached; c != nil {
		crd := rails(c)
		for j, cb := range c.Buffers {
			ck := crd.Keys(j)
			if r.rr >= len(ck) || (cb.Addr != b.Addr && c.Epoch == d.Epoch) {
				continue
			}
			if old := ck[r.rr]; old != cur || c.Epoch != d.Epoch {
				r.fail(LayerRDMARKey, engine.ErrPeerReset, fmt.Sprintf("the cached rkey %#x of buffer %#x on the peer's rail %d is of epoch %#x; the peer now has epoch %#x, buffer %#x with rkey %#x: WRITE and READ with the cached one fail with a remote access error", old, cb.Addr, r.rr, c.Epoch, d.Epoch, b.Addr, cur),
					"reopen the segment (Engine.SyncSegment) so requests carry the peer's current rkeys")
				return
			}
		}
	}
	r.pass(LayerRDMARKey, fmt.Sprintf("buffer %#x rkey %#x on the peer's rail %d (epoch %#x)", b.Addr, cur, r.rr, d.Epoch))
}

// railProbes moves a probe over each rail whose static checks passed,
// through an engine of its own whose rdma transport has the same rails
// and settings, each rail's probe memory preferring that rail.
func (w *walk) railProbes(ctx context.Context, rs []*rail, tune rdma.Config) {
	var todo []*rail
	rd := rails(w.desc)
	for _, r := range rs {
		if r.passed(LayerRDMAPort, LayerRDMAGID, LayerRDMAMTU, LayerRDMARoute, LayerRDMATimeout) && len(rd.Keys(0)) == len(rd.Devices) {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return
	}
	cfg := tune
	cfg.Devices, cfg.Priority = nil, map[string][]string{}
	idx := -1
	for i, r := range rs {
		cfg.Devices = append(cfg.Devices, r.dev.Name)
		cfg.Priority[probeLocation(i)] = []string{r.dev.Name}
		if i == 0 || idx == r.gid.Index {
			idx = r.gid.Index
		} else {
			idx = -2
		}
	}
	if idx >= 0 { // the GIDs the engine's rails use
		cfg.GIDIndex = &idx
	}
	cfg.Listen, cfg.Advertise, cfg.Auth = "127.0.0.1:0", "", w.cfg.Auth
	cfg.HandshakeTimeout = w.cfg.Timeout
	cfg.SliceTimeout = 2 * w.cfg.Timeout
	failAll := func(err error, detail, fix string) {
		for _, r := range todo {
			r.fail(LayerRDMAQP, err, detail, fix)
		}
	}
	pe, err := engine.New(engine.Config{Name: w.cfg.Engine.Name() + "/diagnose", Store: w.cfg.Store, Unlisted: true, MetadataTimeout: w.cfg.Timeout})
	if err != nil {
		failAll(err, "probe engine: "+err.Error(), fixFor(err))
		return
	}
	defer pe.Close()
	tr := rdma.New(cfg)
	if err := pe.Install(tr); err != nil {
		failAll(err, "probe transport on "+strings.Join(cfg.Devices, ",")+": "+err.Error(), installFix(segment.ProtoRDMA))
		return
	}
	octx, cancel := context.WithTimeout(ctx, 2*w.cfg.Timeout)
	id, err := pe.OpenSegment(octx, w.cfg.Segment, &engine.OpenOptions{Transport: segment.ProtoRDMA})
	cancel()
	if err != nil {
		failAll(err, "opening the segment over rdma: "+err.Error(), qpFix(err))
		return
	}
	defer pe.CloseSegment(id)
	addr, n := w.probeRange(len(rs))
	for _, r := range todo {
		i := slices.Index(rs, r)
		w.railProbe(ctx, pe, tr, id, r, i, addr+uint64(i*n), n)
	}
}

// rails is the rdma entry of d: its rails and keys (empty when d has none).
func rails(d *segment.Descriptor) *segment.RDMA {
	if p, ok := d.Protocol(segment.ProtoRDMA); ok && p.RDMA != nil {
		return p.RDMA
	}
	return &segment.RDMA{}
}

func probeLocation(i int) string { return fmt.Sprintf("diagnose:rail%d", i) }

// railProbe moves one rail's probe: READ, WRITE a pattern, READ back,
// compare, WRITE the original back; the rail's counters must show it.
func (w *walk) railProbe(ctx context.Context, pe *engine.Engine, tr *rdma.Transport, id engine.SegmentID, r *rail, i int, addr uint64, n int) {
	mem, err := engine.Alloc(n)
	if err != nil {
		r.fail(LayerRDMAQP, err, "probe memory: "+err.Error(), "lower --probe-size")
		return
	}
	defer mem.Close()
	if err := pe.RegisterLocalMemory(mem.Bytes(), probeLocation(i)); err != nil {
		r.fail(LayerRDMAQP, err, fmt.Sprintf("registering %d bytes with %s: %v", n, r.dev.Name, err), "raise the locked-memory limit (ulimit -l) or lower --probe-size")
		return
	}
	defer pe.UnregisterLocalMemory(mem.Bytes())
	before := railBytes(tr, i)
	buf := mem.Bytes()
	ctx, cancel := context.WithTimeout(ctx, 2*w.cfg.Timeout)
	defer cancel()
	start := time.Now()
	xfer := func(op engine.Op) error {
		return pe.Transfer(ctx, []engine.Request{{Op: op, Local: buf, Target: id, TargetAddr: addr}})
	}
	err = xfer(engine.Read)
	orig := slices.Clone(buf)
	var pat []byte
	if err == nil {
		for j := range buf {
			buf[j] = ^orig[j] ^ byte(j*11+i)
		}
		pat = slices.Clone(buf)
		err = xfer(engine.Write)
	}
	same := false
	if err == nil {
		clear(buf)
		if err = xfer(engine.Read); err == nil {
			same = slices.Equal(buf, pat)
			copy(buf, orig)
			err = xfer(engine.Write)
		}
	}
	elapsed := time.Since(start)
	if err != nil {
		w.railFailure(r, err, addr, n)
		return
	}
	r.pass(LayerRDMAQP, fmt.Sprintf("connected to the peer's rail %d: QPs reached RTS and carried the probe", r.rr))
	moved := railBytes(tr, i) - before
	switch {
	case !same:
		r.fail(LayerRDMAProbe, engine.ErrInvalidRequest, fmt.Sprintf("%d bytes written over %s read back different: another writer of that range, or a broken path", n, r.dev.Name), "run again; if it repeats, report it with this output")
	case moved < uint64(4*n):
		r.fail(LayerRDMAProbe, ErrRailDown, fmt.Sprintf("the probe completed but rail %s carried %d of its %d bytes: the transport moved it to another rail, so this one is down or refused", r.dev.Name, moved, 4*n),
			"see the rail's port and route lines; the transport uses the rail again once its port is ACTIVE")
	default:
		r.pass(LayerRDMAProbe, fmt.Sprintf("%d bytes READ, WRITE, READ back, verified and restored over %s -> %s in %v", n, r.dev.Name, r.remote.Name, elapsed.Round(time.Microsecond)))
	}
}

func railBytes(tr *rdma.Transport, i int) uint64 {
	if st := tr.Stats(); i < len(st) {
		return st[i].Bytes
	}
	return 0
}

// railFailure puts a failed probe at its layer: a refused memory access
// at the rkeys, a connection that never completed work at the probe, the
// rest (handshake, QP modify, restarted peer) at the QP.
func (w *walk) railFailure(r *rail, err error, addr uint64, n int) {
	switch {
	case errors.Is(err, uverbs.ErrCompletionAccess):
		r.pass(LayerRDMAQP, fmt.Sprintf("connected to the peer's rail %d: QPs reached RTS", r.rr))
		var rkey uint32
		if ks := rails(w.desc).Keys(0); r.rr < len(ks) {
			rkey = ks[r.rr]
		}
		r.fail(LayerRDMARKey, err, fmt.Sprintf("the peer's NIC refused [%#x, +%d) with rkey %#x: %v", addr, n, rkey, err),
			"the rkey is not the peer's current one for that range (it restarted or re-registered): reopen the segment (Engine.SyncSegment)")
	case errors.Is(err, uverbs.ErrCompletionTransient), errors.Is(err, rdma.ErrSliceTimeout), errors.Is(err, context.DeadlineExceeded):
		r.pass(LayerRDMAQP, fmt.Sprintf("connected to the peer's rail %d: QPs reached RTS", r.rr))
		r.fail(LayerRDMAProbe, err, fmt.Sprintf("work posted on %s never completed: %v; the packets do not reach the peer's rail or its ACKs do not come back", r.dev.Name, err),
			"check the GIDs, the route and the MTU lines of this rail on both hosts, and that nothing between drops UDP port 4791")
	default:
		r.fail(LayerRDMAQP, err, fmt.Sprintf("connecting to the peer's rail %d: %v", r.rr, err), qpFix(err))
	}
}

func qpFix(err error) string {
	if errors.Is(err, engine.ErrPeerReset) {
		return fixFor(err)
	}
	s := err.Error()
	if strings.Contains(s, "RTR") || strings.Contains(s, "modify") || strings.Contains(s, "connect QP") {
		return "the QP could not be connected to the peer's GID: check both rails' GIDs (RoCE v2, IPv4-mapped) and that each can route to the other"
	}
	return fixFor(err)
}

// Errors a Check wraps for rdma findings that have no error of their own.
var (
	ErrRailDown = errors.New("diagnose: rail down")
	ErrBadGID   = errors.New("diagnose: GID cannot route")
	ErrMTU      = errors.New("diagnose: MTU mismatch")
	ErrRoute    = errors.New("diagnose: rail traffic leaves through another interface")
	ErrQPTune   = errors.New("diagnose: QP timeout settings")
)

func operstate(netdev string) string {
	b, err := os.ReadFile("/sys/class/net/" + netdev + "/operstate")
	if err != nil {
		return "in an unknown state"
	}
	return strings.TrimSpace(string(b))
}

func ifName(idx int) string {
	if ifi, err := net.InterfaceByIndex(idx); err == nil {
		return ifi.Name
	}
	return fmt.Sprintf("ifindex %d", idx)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func linkLayer(l uverbs.LinkLayer) string {
	if l == uverbs.LinkLayerEthernet {
		return "Ethernet (RoCE)"
	}
	return "InfiniBand"
}
