package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/internal/ratelog"
	"github.com/rdmago/te/segment"
)

// Defaults, chosen by measurement (go test -bench 'Lanes|SliceSize' ./tcp)
// on the 2-core loopback VM, batch 128, GB/s (two runs each, busy machine):
//
//	lanes  WRITE 4KiB  64KiB     1MiB      READ 4KiB  64KiB     1MiB
//	1      3.10-3.47   1.96-2.14 2.45-2.74      3.14-3.37  2.47-2.52 2.53-2.93
//	2      2.85-3.00   2.37-2.60 3.88-3.91      2.85-2.96  2.16-2.37 2.67-3.20
//	4      1.84-2.01   1.79-2.16 3.31-4.20      1.65-2.44  4.40-4.49 4.34-4.79
//
// Small bursts do best on one connection, large ones on four, so a
// submission uses one lane per laneShare bytes it carries, up to Lanes = 4.
// With one lane per MiB, 4 lanes measured 3.4-3.5 / 2.4-2.5 / 4.0-4.2 GB/s (WRITE)
// and 2.4-3.1 / 3.8-4.6 / 4.8-5.0 GB/s (READ). One 64 MiB request cut into
// slices of 256 KiB, 1 MiB, 4 MiB, 16 MiB moved 3.4, 3.3, 2.9, 2.4 GB/s:
// 1 MiB slices keep per-slice overhead low and still spread over lanes.
const (
	DefaultLanes       = 4
	DefaultSliceSize   = 1 << 20
	DefaultDialTimeout = 5 * time.Second
	DefaultIOTimeout   = 10 * time.Second
	DefaultMaxConns    = 4096
	// DefaultMaxConnsPerSource bounds one address's share of MaxConns.
	DefaultMaxConnsPerSource = 1024
)

// Config configures a Transport. Zero fields select defaults.
type Config struct {
	// Listen is the data listener's address. Default "127.0.0.1:0".
	Listen string
	// DialOnly: no listener. The transport only connects to other
	// segments (an initiator that serves nothing) and adds no entry to
	// the local descriptor.
	DialOnly bool
	// Advertise is the endpoint put into the local descriptor; default
	// the listener's address (with an unspecified IP replaced by the
	// first non-loopback address of the host).
	Advertise string
	// Lanes is the number of connections per remote segment.
	Lanes int
	// SliceSize is the largest slice the transport asks the engine for.
	SliceSize uint64
	// DialTimeout bounds connecting a lane (and its HELLO write).
	DialTimeout time.Duration
	// IOTimeout fails a lane whose oldest outstanding request saw no
	// reply for this long; on the target side it bounds writing a batch
	// of replies and reading one payload, so a stalled initiator cannot
	// keep registered memory pinned. It must exceed the time one slice
	// (SliceSize, or the engine's) takes on the wire. A connection must
	// also send its HELLO within it.
	IOTimeout time.Duration
	// MaxConns bounds the initiator connections served at once (each
	// holds buffers). At the bound a new connection takes the slot of
	// the one that has waited longest for its initiator (idle, stalled
	// or still in its handshake); when every connection is busy it is
	// closed on accept.
	MaxConns int
	// MaxConnsPerSource bounds the connections from one IP address the
	// same way, so one host cannot take every slot. Default
	// DefaultMaxConnsPerSource (at most MaxConns).
	MaxConnsPerSource int
	// Auth is the cluster secret: with it, every connection starts with
	// a mutual challenge-response (package auth) and a peer without the
	// secret gets no lane and no byte of memory. Nil: no authentication
	// (a listener on a non-loopback address then logs a warning).
	Auth *auth.Secret
}

// Errors; compare with errors.Is.
var (
	// ErrConnection: the lane's connection could not be made or broke;
	// every slice in flight on it failed with it. It wraps
	// driver.ErrTransient, so the engine retries such slices (Config.Retries)
	// on a fresh connection.
	ErrConnection = fmt.Errorf("tcp: connection lost: %w", driver.ErrTransient)
	// ErrTimeout: a lane saw no reply within Config.IOTimeout; its
	// connection was closed and its slices failed. A silent peer is not
	// retried. It wraps driver.ErrTimeout.
	ErrTimeout = control.Mark(errors.New("tcp: no reply within the I/O timeout"), driver.ErrTimeout)
	// ErrProtocol: the peer sent a frame that breaks the protocol.
	ErrProtocol = errors.New("tcp: protocol violation")
	// ErrNoEndpoint: the remote descriptor has no usable tcp endpoint.
	ErrNoEndpoint = errors.New("tcp: segment has no tcp endpoint")
)

// Replies with a failure status map to these (pre-allocated: no
// allocation on the error path either).
var (
	errRemoteRange = fmt.Errorf("tcp: target refused: %w", driver.ErrOutOfRange)
	errRemoteBusy  = fmt.Errorf("tcp: target refused: %w", driver.ErrMemoryBusy)
	errRemoteStale = fmt.Errorf("tcp: target has a new epoch: %w", driver.ErrPeerReset)
	errRemoteBad   = fmt.Errorf("tcp: target refused a bad request: %w", ErrProtocol)
	errTooLarge    = fmt.Errorf("tcp: slice larger than %d bytes: %w", maxPayload, engine.ErrInvalidRequest)
	errPeerClosed  = fmt.Errorf("tcp: lanes closed (segment closed, gone or restarted, or engine closed): %w", driver.ErrClosed)
)

func statusErr(s status) error {
	switch s {
	case statusOK:
		return nil
	case statusOutOfRange:
		return errRemoteRange
	case statusBusy:
		return errRemoteBusy
	case statusStaleEpoch:
		return errRemoteStale
	case statusNotifyFull:
		return errNotifyFull
	case statusNotDelivered:
		return errNotDelivered
	}
	return errRemoteBad
}

// Transport is the TCP transport. Create it with New and hand it to
// engine.Install, which drives it through Driver (the engine/driver
// contract); its own methods are for inspection.
type Transport struct {
	cfg  Config
	host driver.Host
	log  *slog.Logger

	ln       net.Listener
	endpoint string

	ctx    context.Context // cancelled by Close: aborts dials
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once // a second Close waits for the first
	mu        sync.Mutex
	closed    bool
	gate      *acceptor.Gate[netip.Addr, *net.TCPConn] // accepted connections, by source address
	peers     map[*peer]struct{}
	traffic   map[laneKey]*laneCounters
	// live holds the accepted connections past their handshake,
	// servedBy the counts of ended ones, by initiator name.
	live     map[*sconn]struct{}
	servedBy map[string]*laneCounters
	authLog  *control.Log
	lostLog  *ratelog.Log
	notes    noteTable // target: notes partly marked
	// peak is the most connections served since the last release of
	// their memory; releasing: a release is pending.
	peak      int
	releasing bool

	// Lanes whose replies a waiter may read (waitread.go): listed under
	// cmu, wanted while callers of Wait ask.
	cmu    sync.Mutex
	claims []*reader
	wanted atomic.Bool
}

// New returns a TCP transport; it starts listening on Install.
func New(cfg Config) *Transport {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = DefaultLanes
	}
	if cfg.SliceSize == 0 {
		cfg.SliceSize = DefaultSliceSize
	}
	cfg.SliceSize = min(cfg.SliceSize, maxPayload)
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
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
	cfg.MaxConnsPerSource = min(cfg.MaxConnsPerSource, cfg.MaxConns)
	t := &Transport{cfg: cfg, gate: acceptor.NewGate[netip.Addr, *net.TCPConn](cfg.MaxConns, cfg.MaxConnsPerSource), peers: map[*peer]struct{}{}}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// sliceSize returns Config.SliceSize.
func (t *Transport) sliceSize() uint64 { return t.cfg.SliceSize }

// Endpoint is the advertised data address (after Install).
func (t *Transport) Endpoint() string { return t.endpoint }

// install starts the listener and the lane watchdog.
func (t *Transport) install(h driver.Host) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return driver.ErrClosed
	}
	if t.host != nil {
		return fmt.Errorf("tcp: already installed")
	}
	if t.cfg.DialOnly {
		t.host, t.log = h, h.Logger()
		t.authLog = control.NewLog(t.log, "tcp", 0)
		t.lostLog = ratelog.New(t.log, 0)
		t.wg.Add(1)
		go t.watchdog()
		return nil
	}
	ln, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("tcp: listen %s: %w", t.cfg.Listen, err)
	}
	ep := t.cfg.Advertise
	if ep == "" {
		ep, err = advertised(ln.Addr().(*net.TCPAddr))
		if err != nil {
			ln.Close()
			return err
		}
	}
	t.host, t.log, t.ln, t.endpoint = h, h.Logger(), ln, ep
	t.authLog = control.NewLog(t.log, "tcp", 0)
	t.lostLog = ratelog.New(t.log, 0)
	auth.WarnUnauthenticated(t.log, "tcp", ln.Addr(), t.cfg.Auth)
	t.wg.Add(2)
	go t.acceptLoop()
	go t.watchdog()
	return nil
}

// advertised turns a listener address into one a peer can dial.
func advertised(a *net.TCPAddr) (string, error) {
	if !a.IP.IsUnspecified() {
		return a.String(), nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("tcp: advertise: %w", err)
	}
	for _, ad := range addrs {
		if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.IsGlobalUnicast() {
			return net.JoinHostPort(ipn.IP.String(), strconv.Itoa(a.Port)), nil
		}
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port)), nil
}

// describe adds the tcp protocol entry (none with DialOnly).
func (t *Transport) describe(d *segment.Descriptor) error {
	if t.cfg.DialOnly && t.host != nil {
		return nil
	}
	if t.endpoint == "" {
		return fmt.Errorf("tcp: not installed")
	}
	d.Protocols = append(d.Protocols, segment.Protocol{
		Name:     segment.ProtoTCP,
		Endpoint: t.endpoint,
		TCP:      &segment.TCP{Wire: wireVersion, Notify: true},
	})
	return nil
}

// registerMemory has nothing to do: the receiver checks ranges against the
// engine's registered memory on every access.
func (t *Transport) registerMemory(driver.Region) (any, error) { return nil, nil }

// unregisterMemory has nothing to do.
func (t *Transport) unregisterMemory(driver.Region, any) error { return nil }

// connect prepares the lanes to a remote segment and dials the first one,
// so an unreachable peer is reported here.
func (t *Transport) connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	pr, ok := remote.Protocol(segment.ProtoTCP)
	if !ok || pr.Endpoint == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoEndpoint, remote.Name)
	}
	// Speak the target's version: 3, or 2 (no vectors) with a target that
	// advertises 2 or no version.
	legacy := true
	if pr.TCP != nil {
		switch pr.TCP.Wire {
		case 0, wireLegacy:
		case wireVersion:
			legacy = false
		default:
			return nil, fmt.Errorf("%w: %s speaks tcp wire version %d, this process %d or %d", ErrProtocol, remote.Name, pr.TCP.Wire, wireLegacy, wireVersion)
		}
	}
	t.mu.Lock()
	closed, installed := t.closed, t.host != nil
	t.mu.Unlock()
	switch {
	case closed:
		return nil, driver.ErrClosed
	case !installed:
		return nil, fmt.Errorf("tcp: connect %s: not installed", remote.Name)
	}
	p := newPeer(t, remote.Name, pr.Endpoint, remote.Epoch, legacy)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, driver.ErrClosed
	}
	t.peers[p] = struct{}{}
	t.mu.Unlock()
	if err := p.lanes[0].connect(ctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// submitSlices queues the slices on their peers' lanes.
func (t *Transport) submitSlices(ss []*driver.Slice) {
	defer cost.Enqueue.Since(cost.Now())
	for len(ss) > 0 {
		p, _ := ss[0].Peer.(*peer)
		n := 1
		for n < len(ss) && ss[n].Peer == ss[0].Peer {
			n++
		}
		if p == nil {
			for _, s := range ss[:n] {
				s.Done(0, fmt.Errorf("tcp: slice for a foreign peer %T: %w", s.Peer, engine.ErrInvalidRequest))
			}
		} else {
			p.submit(ss[:n])
		}
		ss = ss[n:]
	}
}

// shutdown stops the listener, closes every connection and fails every slice
// in flight. It is idempotent and safe on a nil Transport; a Close that
// finds another in progress returns when that one is done.
func (t *Transport) shutdown() error {
	if t == nil {
		return nil
	}
	t.closeOnce.Do(t.close)
	return nil
}

func (t *Transport) close() {
	t.mu.Lock()
	t.closed = true
	t.cancel()
	if t.ln != nil {
		t.ln.Close()
	}
	t.gate.Close()
	peers := make([]*peer, 0, len(t.peers))
	for p := range t.peers {
		peers = append(peers, p)
	}
	t.mu.Unlock()
	for _, p := range peers {
		p.Close()
	}
	t.wg.Wait()
}

func (t *Transport) forget(p *peer) {
	t.mu.Lock()
	delete(t.peers, p)
	t.mu.Unlock()
}

// watchdog closes lanes whose oldest request has seen no reply for
// IOTimeout. It counts ticks without progress instead of reading clocks on
// the data path.
func (t *Transport) watchdog() {
	defer t.wg.Done()
	tick := max(t.cfg.IOTimeout/4, time.Millisecond)
	limit := int((t.cfg.IOTimeout + tick - 1) / tick)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var lanes []*lane
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
		}
		lanes = lanes[:0]
		t.mu.Lock()
		for p := range t.peers {
			lanes = append(lanes, p.lanes...)
		}
		t.mu.Unlock()
		for _, l := range lanes {
			l.checkStall(limit)
		}
	}
}
