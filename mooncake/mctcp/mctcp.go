// Package mctcp is Mooncake's TCP data protocol as a te transport, both
// ways: its target accepts Mooncake initiators (and te ones) on the port
// a descriptor advertises as tcp_data_port, checking every range against
// registered memory; its initiator reads and writes Mooncake targets (and
// te ones) over persistent, pipelined connections. The protocol is named
// mooncake.TEProtoTCP ("mooncake") in te descriptors, so it is used only
// where a program installs this transport.
//
// The wire has no authentication and no epochs: anyone who reaches the
// data port may read and write the registered memory. The target
// therefore listens on loopback by default, logs one warning when it
// listens elsewhere, and keeps te's bounds: ranges checked, connections
// bounded (in all and per source address, the longest-waiting one making
// room), every payload and reply bounded by IOTimeout (a watchdog closes
// the connections stalled mid-request).
package mctcp

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

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/sock"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// Defaults.
const (
	DefaultLanes             = 4
	MaxLanes                 = 16 // Mooncake's MC_TCP_LANES_PER_PEER bound
	DefaultSliceSize         = 1 << 20
	DefaultDialTimeout       = 5 * time.Second
	DefaultIOTimeout         = 30 * time.Second // Mooncake's status-frame timeout
	DefaultMaxConns          = 4096
	DefaultMaxConnsPerSource = 1024
)

// Config configures a Transport. Zero fields select defaults.
type Config struct {
	// Listen is the data listener's address. Default "127.0.0.1:0".
	Listen string
	// Advertise is the endpoint put into the local descriptor; default
	// the listener's address (an unspecified IP replaced by the first
	// non-loopback address).
	Advertise string
	// Version is the protocol version the target advertises (1 or 2).
	// Default 2. The initiator speaks what each target advertises.
	Version int
	// Lanes is the number of connections per remote segment (1-16).
	Lanes int
	// SliceSize is the largest request the transport asks the engine for.
	SliceSize uint64
	// DialTimeout bounds connecting a lane.
	DialTimeout time.Duration
	// IOTimeout fails a lane whose oldest request saw no answer for this
	// long; on the target it bounds reading the rest of a request and
	// writing one reply (to IOTimeout and a quarter: a watchdog checks),
	// so a stalled peer cannot keep memory pinned.
	IOTimeout time.Duration
	// MaxConns and MaxConnsPerSource bound the connections the target
	// serves, in all and per source address; at a bound the connection
	// that has waited longest for its initiator is closed to make room.
	MaxConns, MaxConnsPerSource int
}

// Errors; compare with errors.Is.
var (
	// ErrConnection: a lane's connection could not be made or broke. It
	// wraps driver.ErrTransient: the engine retries the slices on a fresh
	// connection.
	ErrConnection = fmt.Errorf("mctcp: connection lost: %w", driver.ErrTransient)
	// ErrTimeout: no answer within IOTimeout.
	ErrTimeout = errors.New("mctcp: no answer within the I/O timeout")
	// ErrProtocol: the peer broke the protocol.
	ErrProtocol = errors.New("mctcp: protocol violation")
	// ErrNoEndpoint: the remote descriptor offers no Mooncake TCP endpoint.
	ErrNoEndpoint = errors.New("mctcp: segment has no mooncake tcp endpoint")
)

var (
	errRejected   = fmt.Errorf("mctcp: target rejected the range: %w", driver.ErrOutOfRange)
	errPeerClosed = fmt.Errorf("mctcp: lanes closed (segment closed, gone or restarted, or engine closed): %w", driver.ErrClosed)
)

// Transport is the Mooncake TCP transport. Create it with New and hand it
// to engine.Install.
type Transport struct {
	cfg  Config
	host driver.Host
	log  *slog.Logger

	ln       *sock.Listener // without the event loop
	lp       *loop          // the event loop, serving the listener
	endpoint string

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	mu        sync.Mutex
	closed    bool
	conns     map[sock.Conn]*sconn
	perSource map[netip.Addr]int
	spare     sync.Pool    // *sconn, buffers of closed connections
	handoff   chan *sconn  // admit to an idle server goroutine
	idle      atomic.Int32 // server goroutines in next
	peers     map[*peer]struct{}
	// clock is the watchdog's time (unix nanoseconds), at most a tick
	// behind: the target stamps a connection's waits with it, not with
	// time.Now per request.
	clock atomic.Int64

	// Notifications (notify.go): the submission each slice of a
	// SubmitNotify belongs to, while any is pending.
	notes  atomic.Int64
	noteOf sync.Map // *driver.Slice -> *noteWait
}

var _ driver.Transport = (*Transport)(nil)

// New returns a transport; it listens on Install.
func New(cfg Config) *Transport {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Version != 1 {
		cfg.Version = mooncake.DefaultTCPVersion
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = DefaultLanes
	}
	cfg.Lanes = min(cfg.Lanes, MaxLanes)
	if cfg.SliceSize == 0 {
		cfg.SliceSize = DefaultSliceSize
	}
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
	t := &Transport{cfg: cfg, conns: map[sock.Conn]*sconn{}, perSource: map[netip.Addr]int{}, peers: map[*peer]struct{}{}}
	t.spare.New = func() any { return newSconn(&t.clock) }
	t.handoff = make(chan *sconn)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t
}

// Name returns mooncake.TEProtoTCP.
func (t *Transport) Name() string { return mooncake.TEProtoTCP }

// Driver returns t itself: it implements the engine/driver contract
// directly. engine.Install calls it.
func (t *Transport) Driver() driver.Transport { return t }

// SliceSize returns Config.SliceSize.
func (t *Transport) SliceSize() uint64 { return t.cfg.SliceSize }

// Endpoint is the advertised data address (after Install).
func (t *Transport) Endpoint() string { return t.endpoint }

// Install starts the data listener and the lane watchdog.
func (t *Transport) Install(h driver.Host) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return driver.ErrClosed
	}
	if t.host != nil {
		return errors.New("mctcp: already installed")
	}
	ln, err := net.Listen("tcp", t.cfg.Listen)
	if err != nil {
		return fmt.Errorf("mctcp: listen %s: %w", t.cfg.Listen, err)
	}
	ep := t.cfg.Advertise
	if ep == "" {
		ep = advertised(ln.Addr().(*net.TCPAddr))
	}
	// Connections are accepted with raw calls (sock.Listener): NODELAY
	// set, so status words leave at once; no keepalive probes (four
	// system calls each, and Mooncake's initiator may open a connection
	// per request): a connection idle for its initiator is what
	// admission closes first.
	t.clock.Store(time.Now().UnixNano())
	t.host, t.endpoint = h, ep
	if t.log = h.Logger(); t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	// The event loop where the kernel has epoll (loop.go); elsewhere a
	// goroutine per connection (server.go).
	if p, err := newPoller(); err == nil {
		rl, err := sock.NewRawListener(ln.(*net.TCPListener), true)
		if err == nil {
			if err = p.AddListener(rl, listenToken); err != nil {
				rl.Close()
			}
		}
		if err != nil {
			p.Close()
			t.host = nil
			return fmt.Errorf("mctcp: listen %s: %w", t.cfg.Listen, err)
		}
		t.lp = newLoop(t, p, rl)
		mooncake.WarnExposed(t.log, "the Mooncake TCP data port", rl.Addr())
		t.wg.Add(2)
		go t.lp.serve()
		go t.watchdog()
		return nil
	}
	sl, err := sock.NewListener(ln.(*net.TCPListener), true)
	if err != nil {
		t.host = nil
		return fmt.Errorf("mctcp: listen %s: %w", t.cfg.Listen, err)
	}
	t.ln = sl
	mooncake.WarnExposed(t.log, "the Mooncake TCP data port", sl.Addr())
	t.wg.Add(2)
	go func() {
		defer t.wg.Done()
		accept := func() (accepted, error) {
			c, peer, err := sl.Accept()
			return accepted{c, peer}, err
		}
		acceptor.Run(t.log, "mctcp", sl.Addr(), t.ctx.Done(), accept, t.admit)
	}()
	go t.watchdog()
	return nil
}

func advertised(a *net.TCPAddr) string {
	if !a.IP.IsUnspecified() {
		return a.String()
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, ad := range addrs {
			if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return net.JoinHostPort(ipn.IP.String(), strconv.Itoa(a.Port))
			}
		}
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port))
}

// Describe adds the protocol entry: the data endpoint and the version.
func (t *Transport) Describe(d *segment.Descriptor) error {
	if t.endpoint == "" {
		return errors.New("mctcp: not installed")
	}
	d.Protocols = append(d.Protocols, segment.Protocol{
		Name:     mooncake.TEProtoTCP,
		Endpoint: t.endpoint,
		TCP:      &segment.TCP{Wire: t.cfg.Version},
	})
	return nil
}

// RegisterMemory has nothing to do: the target checks every range.
func (t *Transport) RegisterMemory(driver.Region) (any, error) { return nil, nil }

// UnregisterMemory has nothing to do.
func (t *Transport) UnregisterMemory(driver.Region, any) error { return nil }

// Connect prepares the lanes to a remote segment and dials the first, so
// an unreachable peer is reported here.
func (t *Transport) Connect(ctx context.Context, remote *segment.Descriptor) (driver.Peer, error) {
	pr, ok := remote.Protocol(mooncake.TEProtoTCP)
	if !ok || pr.Endpoint == "" {
		return nil, fmt.Errorf("%w: %s", ErrNoEndpoint, remote.Name)
	}
	v := mooncake.DefaultTCPVersion
	if pr.TCP != nil && pr.TCP.Wire != 0 {
		if pr.TCP.Wire < 1 {
			return nil, fmt.Errorf("%w: %s advertises version %d", ErrProtocol, remote.Name, pr.TCP.Wire)
		}
		v = min(pr.TCP.Wire, mooncake.DefaultTCPVersion) // Mooncake speaks v2 to 3 and above
	}
	p := newPeer(t, remote.Name, pr.Endpoint, v == 2)
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

// Submit queues the slices on their peers' lanes.
func (t *Transport) Submit(ss []*driver.Slice) {
	for len(ss) > 0 {
		p, _ := ss[0].Peer.(*peer)
		n := 1
		for n < len(ss) && ss[n].Peer == ss[0].Peer {
			n++
		}
		if p == nil {
			for _, s := range ss[:n] {
				t.finish(s, 0, fmt.Errorf("mctcp: slice for a foreign peer %T: %w", s.Peer, driver.ErrClosed))
			}
		} else {
			p.submit(ss[:n])
		}
		ss = ss[n:]
	}
}

// Close stops the listener, closes every connection and fails every slice
// in flight. It is idempotent and safe before Install.
func (t *Transport) Close() error {
	if t == nil {
		return nil
	}
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.cancel()
		if t.ln != nil {
			t.ln.Close()
		}
		if t.lp != nil {
			t.lp.p.Wake() // the loop closes its listener and connections
		}
		for c := range t.conns {
			c.Close()
		}
		peers := make([]*peer, 0, len(t.peers))
		for p := range t.peers {
			peers = append(peers, p)
		}
		t.mu.Unlock()
		for _, p := range peers {
			p.Close()
		}
		t.wg.Wait()
		if t.lp != nil {
			t.lp.p.Close()
		}
	})
	return nil
}

func (t *Transport) forget(p *peer) {
	t.mu.Lock()
	delete(t.peers, p)
	t.mu.Unlock()
}

// watchdog fails lanes whose oldest request has seen no answer for
// IOTimeout, counting ticks without progress, and closes the target's
// connections stalled mid-request (sconn.stalled) for IOTimeout: a stalled
// peer cannot keep memory pinned for longer than IOTimeout and three
// ticks (a quarter of IOTimeout). It keeps t.clock: a stamp taken from it
// is up to a tick early, so a connection is closed once its stamp is
// IOTimeout and a tick old, never before IOTimeout has passed.
func (t *Transport) watchdog() {
	defer t.wg.Done()
	tick := max(t.cfg.IOTimeout/12, time.Millisecond)
	limit := int((t.cfg.IOTimeout + tick - 1) / tick)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var (
		lanes   []*lane
		stalled []accepted
	)
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
		}
		lanes, stalled = lanes[:0], stalled[:0]
		now := time.Now().UnixNano()
		t.clock.Store(now)
		since := now - int64(t.cfg.IOTimeout+tick)
		t.mu.Lock()
		for p := range t.peers {
			lanes = append(lanes, p.lanes...)
		}
		for c, sc := range t.conns {
			if s := sc.stalled.Load(); s != 0 && s <= since {
				stalled = append(stalled, accepted{c, sc.peer})
			}
		}
		t.mu.Unlock()
		for _, l := range lanes {
			l.checkStall(limit)
		}
		for _, a := range stalled {
			t.log.Debug("mctcp: connection stalled mid-request; closed", "remote", a.peer, "io_timeout", t.cfg.IOTimeout)
			a.c.Close()
		}
		clear(stalled)
	}
}

// newPoller is the event loop's poller; tests replace it with one that
// fails, to run the goroutine path (server.go) that builds without epoll
// take.
var newPoller = func() (*sock.Poller, error) { return sock.NewPoller(loopEvents) }
