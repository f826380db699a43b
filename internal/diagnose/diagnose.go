// Package diagnose finds where transfers to a segment stop, layer by
// layer, against the live peer: the descriptor in the store, the transport
// the engine would choose, the local range, then each tcp lane or rdma
// rail with a small probe transfer, and last a transfer through the engine
// itself. Each layer is one Check: PASS, or FAIL with the cause found and
// what to do. te diagnose prints them; a program whose transfer is stuck
// may run the same walk on its own engine.
//
// The order follows the path of one request: the descriptor and its
// epoch, the transport chosen, the local range registered, the endpoint
// connected (dial and handshake per lane, port, GID, MTU, route and QP per
// rail), the target's answer for the range, bytes moved and verified.
// Layers after a failed one that depend on it are reported SKIP.
package diagnose

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
)

// Status is a layer's verdict.
type Status string

// Verdicts.
const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP" // not checked: a layer below it failed
)

// Layer names one layer of the walk.
type Layer string

// The layers, in the order of the walk.
const (
	LayerDescriptor Layer = "descriptor" // fetched from the store, its age
	LayerEpoch      Layer = "epoch"      // a cached descriptor vs the store's
	LayerTransport  Layer = "transport"  // the protocol the engine chooses
	LayerLocal      Layer = "local"      // the local range is registered
	// tcp, per lane
	LayerTCPDial  Layer = "tcp.dial"
	LayerTCPHello Layer = "tcp.hello"
	LayerTCPRange Layer = "tcp.range" // the receiver's answer for the probe range
	LayerTCPProbe Layer = "tcp.probe"
	// rdma, per rail
	LayerRDMAPort    Layer = "rdma.port"
	LayerRDMAGID     Layer = "rdma.gid"
	LayerRDMAMTU     Layer = "rdma.mtu"
	LayerRDMARoute   Layer = "rdma.route"
	LayerRDMAQP      Layer = "rdma.qp"
	LayerRDMATimeout Layer = "rdma.timeout"
	LayerRDMARKey    Layer = "rdma.rkey"
	LayerRDMAProbe   Layer = "rdma.probe"
	// through the engine, the chosen transport
	LayerTransfer Layer = "transfer"
)

// Check is one line of a report.
type Check struct {
	Layer Layer  `json:"layer"`
	Unit  string `json:"unit,omitempty"` // "lane 2", "rail 0 rxe0:1"
	// Status is PASS, FAIL or SKIP.
	Status Status `json:"status"`
	// Detail says what was found, for every status.
	Detail string `json:"detail,omitempty"`
	// Fix says what to do, on FAIL.
	Fix string `json:"fix,omitempty"`
	// Err is the failure, for errors.Is (the transports' and engine's
	// errors, auth.ErrDenied, auth.ErrNotTE, engine.ErrPeerReset, ...).
	Err error `json:"-"`
}

// Report is the walk's result.
type Report struct {
	Segment  string  `json:"segment"`
	Protocol string  `json:"protocol,omitempty"` // the transport checked
	Checks   []Check `json:"checks"`
	// Seconds is how long the walk took.
	Seconds float64 `json:"seconds"`
}

// OK reports whether every layer passed.
func (r *Report) OK() bool {
	if len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if c.Status != Pass {
			return false
		}
	}
	return true
}

// Failed returns the failed checks, in walk order.
func (r *Report) Failed() []Check {
	var f []Check
	for _, c := range r.Checks {
		if c.Status == Fail {
			f = append(f, c)
		}
	}
	return f
}

// Find returns the checks of one layer.
func (r *Report) Find(l Layer) []Check {
	var f []Check
	for _, c := range r.Checks {
		if c.Layer == l {
			f = append(f, c)
		}
	}
	return f
}

// Config says what to diagnose and with what.
type Config struct {
	// Engine is the initiator: its installed transports are the ones
	// checked, its registered memory the local side.
	Engine *engine.Engine
	// Store is the metadata store Engine resolves segments through.
	Store segment.Store
	// Segment is the peer's segment name.
	Segment string
	// Protocol forces one transport ("tcp", "rdma"); "" is the engine's
	// default choice.
	Protocol string
	// Local is the local range the probe transfer uses: registered
	// memory of Engine (the range of a stuck request, or a buffer
	// registered for the probe). Its first ProbeSize bytes are used.
	Local []byte
	// Register: register Local with Engine first, and report a failure
	// to do so (memlock limit, a NIC refusing the range) as the local
	// layer's. Local is unregistered when Run returns.
	Register bool
	// Cached, when set, is a descriptor of the segment the caller holds
	// (an engine's cached view): its epoch, version and rkeys are checked
	// against the store's.
	Cached *segment.Descriptor
	// Auth is the cluster secret the engine's transports use.
	Auth *auth.Secret
	// ProbeSize is the bytes each probe moves (default 4096). The probes
	// overwrite that many bytes at the start of the peer's first buffer
	// and restore them.
	ProbeSize int
	// Lanes is the tcp lanes probed (default tcp.DefaultLanes).
	Lanes int
	// RDMA is the configuration the engine's rdma transport runs with
	// (Options, GIDIndex, QPTimeout, RetryCount): the rails' probes use
	// the same. Nil: the defaults.
	RDMA *rdma.Config
	// Missing holds, per protocol, why the caller could not install
	// that transport: the transport layer says so when it is needed.
	Missing map[string]error
	// Timeout bounds each step that waits on the peer (default 3s).
	Timeout time.Duration
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// DefaultTimeout bounds each step that waits on the peer.
const DefaultTimeout = 3 * time.Second

// publishedAt is implemented by stores that know when a segment's current
// incarnation was published (the Consul store).
type publishedAt interface {
	PublishedAt(name string) (time.Time, bool)
}

// walk carries one Run.
type walk struct {
	cfg  Config
	rep  *Report
	desc *segment.Descriptor // the store's
}

func (w *walk) add(c Check) { w.rep.Checks = append(w.rep.Checks, c) }

func (w *walk) pass(l Layer, unit, detail string) {
	w.add(Check{Layer: l, Unit: unit, Status: Pass, Detail: detail})
}

func (w *walk) fail(l Layer, unit string, err error, detail, fix string) {
	w.add(Check{Layer: l, Unit: unit, Status: Fail, Detail: detail, Fix: fix, Err: err})
}

func (w *walk) skip(l Layer, unit, why string) {
	w.add(Check{Layer: l, Unit: unit, Status: Skip, Detail: why})
}

// Run walks the layers against the live peer. It returns an error only
// for a Config it cannot use; every finding about the peer is a Check.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Engine == nil || cfg.Store == nil || cfg.Segment == "" {
		return nil, errors.New("diagnose: Config needs Engine, Store and Segment")
	}
	if cfg.ProbeSize <= 0 {
		cfg.ProbeSize = 4096
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	start := time.Now()
	w := &walk{cfg: cfg, rep: &Report{Segment: cfg.Segment}}
	defer func() { w.rep.Seconds = time.Since(start).Seconds() }()

	if !w.descriptor(ctx) {
		w.skipRest(LayerEpoch, LayerTransport, LayerLocal, LayerTransfer)
		return w.rep, nil
	}
	w.epoch(ctx)
	proto, ok := w.transport()
	w.rep.Protocol = proto
	if cfg.Register && cfg.Local != nil {
		defer cfg.Engine.UnregisterLocalMemory(cfg.Local)
	}
	local := w.local(proto)
	if !ok {
		w.skipRest(LayerTransfer)
		return w.rep, nil
	}
	var below bool
	switch proto {
	case segment.ProtoTCP:
		below = w.tcp(ctx)
	case segment.ProtoRDMA:
		below = w.rdma(ctx)
	default:
		below = true
	}
	if !local || !below {
		w.skipRest(LayerTransfer)
		return w.rep, nil
	}
	w.transfer(ctx, proto)
	return w.rep, nil
}

func (w *walk) skipRest(ls ...Layer) {
	for _, l := range ls {
		w.skip(l, "", "not checked: a layer below failed")
	}
}

// descriptor fetches the segment's descriptor from the store.
func (w *walk) descriptor(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	d, err := w.cfg.Store.Get(ctx, w.cfg.Segment)
	if err != nil {
		cause, fix := storeCause(err, w.cfg.Segment, w.cfg.Timeout)
		w.fail(LayerDescriptor, "", err, cause, fix)
		return false
	}
	w.desc = d
	age := "age unknown (the store does not record publication times)"
	if _, ok := w.cfg.Store.(*p2p.Store); ok {
		age = "fetched now from the peer itself (p2p)"
	}
	if pa, ok := w.cfg.Store.(publishedAt); ok {
		if at, ok := pa.PublishedAt(d.Name); ok {
			age = "published " + w.cfg.Now().Sub(at).Round(time.Second).String() + " ago"
		}
	}
	var total uint64
	for _, b := range d.Buffers {
		total += b.Length
	}
	w.pass(LayerDescriptor, "", fmt.Sprintf("epoch %#x version %d, %d buffer(s) of %d bytes, protocols %s; %s",
		d.Epoch, d.Version, len(d.Buffers), total, protocolNames(d), age))
	if len(d.Buffers) == 0 {
		w.fail(LayerDescriptor, "", segment.ErrOutOfRange, "the segment exposes no buffer: there is nothing to transfer to",
			"register memory on the peer (te serve --buffer-size; Engine.RegisterLocalMemory) before initiators open it")
		return false
	}
	return true
}

func storeCause(err error, name string, timeout time.Duration) (cause, fix string) {
	switch {
	case errors.Is(err, segment.ErrNotFound):
		return fmt.Sprintf("the store has no segment %q: %v", name, err),
			"check the name (te segments lists what the store has) and that the peer runs and published it"
	case errors.Is(err, context.DeadlineExceeded) || cli.NetCause(err) == "timeout":
		return fmt.Sprintf("the store did not answer within %v: %v (with p2p metadata the store is the peer itself: a peer that accepts but does not answer is stopped, hung or overloaded)", timeout, err),
			"check the peer process (state T in ps means stopped: kill -CONT it) and the store's host; then run again"
	case cli.NetCause(err) == "refused":
		return fmt.Sprintf("nothing listens at the store's address: %v", err),
			"start the peer (te serve) or the metadata server; with p2p metadata the segment name is the host:port te serve printed"
	case errors.Is(err, auth.ErrDenied):
		return err.Error(), "give both sides the same cluster secret (--auth-file or $TE_AUTH_FILE)"
	case errors.Is(err, auth.ErrNotTE):
		return err.Error(), "the address is not a te metadata port: check the segment name and --metadata"
	}
	return err.Error(), "check --metadata and that the store is reachable from this host"
}

func protocolNames(d *segment.Descriptor) string {
	var n []string
	for _, p := range d.Protocols {
		s := p.Name
		if p.Endpoint != "" {
			s += "=" + p.Endpoint
		}
		n = append(n, s)
	}
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ",")
}

// epoch compares a cached descriptor with the store's.
func (w *walk) epoch(ctx context.Context) {
	c, d := w.cfg.Cached, w.desc
	switch {
	case c == nil:
		w.pass(LayerEpoch, "", fmt.Sprintf("no cached descriptor given: the store's (epoch %#x) is the one checked", d.Epoch))
	case c.Epoch != d.Epoch:
		w.fail(LayerEpoch, "", engine.ErrPeerReset,
			fmt.Sprintf("the peer restarted since its descriptor was cached: cached epoch %#x (version %d), the store has epoch %#x (version %d); requests addressed to the old epoch fail with a peer-reset error and its rkeys are void",
				c.Epoch, c.Version, d.Epoch, d.Version)+w.staleHello(ctx),
			"reopen the segment (Engine.SyncSegment, or CloseSegment and OpenSegment) so the engine takes the new descriptor; an engine's watch does this on its own unless the store's watch is broken")
	case c.Version != 0 && c.Version < d.Version:
		w.fail(LayerEpoch, "", engine.ErrOutOfRange,
			fmt.Sprintf("the cached descriptor is older than the store's: epoch %#x version %d cached, version %d in the store (buffers changed)", c.Epoch, c.Version, d.Version),
			"re-fetch the descriptor (Engine.SyncSegment)")
	default:
		w.pass(LayerEpoch, "", fmt.Sprintf("cached epoch %#x matches the store's", c.Epoch))
	}
}

// transport says which installed transport requests to the segment use.
func (w *walk) transport() (string, bool) {
	d, installed := w.desc, w.cfg.Engine.Transports()
	offered := make([]string, 0, len(d.Protocols))
	for _, p := range d.Protocols {
		offered = append(offered, p.Name)
	}
	if w.cfg.Protocol != "" {
		switch {
		case !slices.Contains(installed, w.cfg.Protocol):
			w.fail(LayerTransport, "", errors.Join(engine.ErrNoTransport, w.cfg.Missing[w.cfg.Protocol]), fmt.Sprintf("%s is not installed here%s (installed: %s)", w.cfg.Protocol, why(w.cfg.Missing[w.cfg.Protocol]), strings.Join(installed, ",")),
				installFix(w.cfg.Protocol))
			return w.cfg.Protocol, false
		case !slices.Contains(offered, w.cfg.Protocol):
			w.fail(LayerTransport, "", engine.ErrNoTransport, fmt.Sprintf("the segment does not offer %s (it offers: %s)", w.cfg.Protocol, strings.Join(offered, ",")),
				"serve it on the peer (te serve --protocol "+w.cfg.Protocol+") or use what it offers")
			return w.cfg.Protocol, false
		}
		w.pass(LayerTransport, "", fmt.Sprintf("%s (forced; the segment offers %s)", w.cfg.Protocol, strings.Join(offered, ",")))
		return w.cfg.Protocol, true
	}
	var both []string
	for _, p := range installed {
		if slices.Contains(offered, p) && p != segment.ProtoSHM {
			both = append(both, p)
		}
	}
	order := engine.DefaultSelector(d, both)
	if len(order) == 0 {
		var whys []string
		var errs []error
		for _, p := range offered {
			if err := w.cfg.Missing[p]; err != nil {
				whys = append(whys, p+why(err))
				errs = append(errs, err)
			}
		}
		detail := fmt.Sprintf("no transport in common: the segment offers %s, this side has %s", strings.Join(offered, ","), strings.Join(installed, ","))
		fix := "install a transport the peer offers, or serve one this side has"
		if len(whys) > 0 {
			detail += "; not installed: " + strings.Join(whys, "; ")
			fix = installFix(offered[0])
		}
		w.fail(LayerTransport, "", errors.Join(append(errs, engine.ErrNoTransport)...), detail, fix)
		return "", false
	}
	w.pass(LayerTransport, "", fmt.Sprintf("%s (order %s; the segment offers %s)", order[0], strings.Join(order, ","), strings.Join(offered, ",")))
	return order[0], true
}

func why(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

func installFix(proto string) string {
	if proto == segment.ProtoRDMA {
		return "this host needs an RDMA device with an active port (te devices says which; te rxe add NETDEV makes a Soft-RoCE one), or check tcp with --protocol tcp"
	}
	return "install it (te diagnose --protocol " + proto + "; Engine.Install)"
}

// local checks that the probe's local range is registered memory.
func (w *walk) local(proto string) bool {
	l := w.cfg.Local
	if len(l) == 0 {
		w.fail(LayerLocal, "", engine.ErrNotRegistered, "no local range given for the probe", "pass registered memory (Config.Local; te diagnose --local-size)")
		return false
	}
	if w.cfg.Register {
		if err := w.cfg.Engine.RegisterLocalMemory(l, "cpu"); err != nil {
			w.fail(LayerLocal, "", err, fmt.Sprintf("registering %d bytes failed: %v", len(l), err),
				"lower --local-size, or raise the locked-memory limit (ulimit -l; LimitMEMLOCK= in a systemd unit) that RDMA registration counts against")
			return false
		}
	}
	addr, n := engine.AddrOf(l), uint64(min(len(l), w.cfg.ProbeSize))
	ld := w.cfg.Engine.LocalDescriptor()
	rp, _ := ld.Protocol(segment.ProtoRDMA)
	for i, b := range ld.Buffers {
		if !b.Contains(addr, n) {
			continue
		}
		detail := fmt.Sprintf("[%#x, +%d) inside registered buffer %#x (%d bytes, %s)", addr, n, b.Addr, b.Length, b.Location)
		if rails := rp.RDMA; proto == segment.ProtoRDMA && rails != nil && len(rails.Keys(i)) < len(rails.Devices) {
			w.fail(LayerLocal, "", engine.ErrNotRegistered, detail+fmt.Sprintf(", but registered with %d of %d rails", len(rails.Keys(i)), len(rails.Devices)),
				"re-register the memory after installing rdma")
			return false
		}
		w.pass(LayerLocal, "", detail)
		return true
	}
	var regs []string
	for _, b := range ld.Buffers {
		regs = append(regs, fmt.Sprintf("[%#x, +%d)", b.Addr, b.Length))
	}
	if len(regs) == 0 {
		regs = append(regs, "none")
	}
	w.fail(LayerLocal, "", engine.ErrNotRegistered,
		fmt.Sprintf("[%#x, +%d) is not inside registered memory (registered: %s): every request with this local range fails at Submit", addr, n, strings.Join(regs, " ")),
		"register the buffer first (engine.Alloc, then Engine.RegisterLocalMemory), and keep requests inside it")
	return false
}

// probeRange is the target range the probes use: the start of the first
// buffer, n bytes per unit (lane or rail), at most units of them.
func (w *walk) probeRange(units int) (addr uint64, n int) {
	b := w.desc.Buffers[0]
	n = w.cfg.ProbeSize
	if uint64(n*units) > b.Length {
		n = int(b.Length) / units
	}
	return b.Addr, n
}

// transfer moves the probe through the engine: WRITE of Local to the
// segment, READ back into Local, compared.
func (w *walk) transfer(ctx context.Context, proto string) {
	e := w.cfg.Engine
	ctx, cancel := context.WithTimeout(ctx, 2*w.cfg.Timeout)
	defer cancel()
	id, err := e.OpenSegment(ctx, w.cfg.Segment, &engine.OpenOptions{Transport: proto})
	if err != nil {
		w.fail(LayerTransfer, "", err, "the engine could not open the segment: "+err.Error(), fixFor(err))
		return
	}
	defer e.CloseSegment(id)
	addr, n := w.probeRange(1)
	n = min(n, len(w.cfg.Local))
	loc := w.cfg.Local[:n]
	orig := make([]byte, n)
	start := time.Now()
	if err := e.Transfer(ctx, []engine.Request{{Op: engine.Read, Local: loc, Target: id, TargetAddr: addr}}); err != nil {
		w.fail(LayerTransfer, "", err, "READ through the engine: "+err.Error(), fixFor(err))
		return
	}
	copy(orig, loc)
	for i := range loc {
		loc[i] = byte(i*13) ^ 0x5a ^ orig[i]&0x80
	}
	pat := slices.Clone(loc)
	err = e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: loc, Target: id, TargetAddr: addr}})
	if err == nil {
		clear(loc)
		err = e.Transfer(ctx, []engine.Request{{Op: engine.Read, Local: loc, Target: id, TargetAddr: addr}})
	}
	elapsed := time.Since(start)
	if err != nil {
		w.fail(LayerTransfer, "", err, "WRITE/READ through the engine: "+err.Error(), fixFor(err))
		return
	}
	same := slices.Equal(loc, pat)
	copy(loc, orig)
	rerr := e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: loc, Target: id, TargetAddr: addr}})
	switch {
	case !same:
		w.fail(LayerTransfer, "", engine.ErrInvalidRequest, fmt.Sprintf("%d bytes written over %s read back different: another writer of that range, or a broken transport", n, proto),
			"run again; if it repeats, report it with this output")
	case rerr != nil:
		w.fail(LayerTransfer, "", rerr, "restoring the peer's original bytes: "+rerr.Error(), fixFor(rerr))
	default:
		w.pass(LayerTransfer, "", fmt.Sprintf("%s: %d bytes READ, WRITE, READ back and verified at %#x through the engine in %v", proto, n, addr, elapsed.Round(time.Microsecond)))
	}
}

// fixFor says what to do about an engine or transport error.
func fixFor(err error) string {
	switch {
	case errors.Is(err, auth.ErrDenied):
		return "give both sides the same cluster secret (--auth-file or $TE_AUTH_FILE)"
	case errors.Is(err, auth.ErrNotTE):
		return "the endpoint is not a te port: the descriptor names another service; restart the peer so it republishes"
	case errors.Is(err, engine.ErrPeerReset):
		return "the peer restarted: reopen the segment (Engine.SyncSegment) so requests carry its new epoch"
	case errors.Is(err, engine.ErrOutOfRange):
		return "the peer no longer holds that range: re-fetch its descriptor (Engine.SyncSegment) and address its current buffers"
	case errors.Is(err, engine.ErrNotRegistered):
		return "register the local buffer (Engine.RegisterLocalMemory) and keep requests inside it"
	case errors.Is(err, engine.ErrNoTransport):
		return "install a transport the segment offers"
	case errors.Is(err, context.DeadlineExceeded):
		return "the peer did not answer in time: check that its process runs (not stopped) and the network between"
	}
	switch cli.NetCause(err) {
	case "refused":
		return "nothing listens at the peer's endpoint: the peer stopped or its listener closed; restart it (te serve) so it republishes"
	case "unreachable":
		return "no route to the peer's endpoint: check addresses, routes and firewalls"
	case "timeout":
		return "the peer did not answer in time: check that its process runs (not stopped) and the network between"
	}
	return "see the cause; te diagnose after a fix shows the next layer"
}
