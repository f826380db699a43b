// Package p2p is the embedded segment store: it needs no server. Every
// process listens on a small handshake socket and serves the descriptors it
// publishes; a segment's name is that socket's address, host:port, so an
// initiator that knows the name can fetch the descriptor straight from the
// owner (Mooncake calls this P2PHANDSHAKE).
//
// Open it with Open (or stores.Open, package segment/stores, which knows
// every scheme te carries) and a URI such as
//
//	p2p://                                  listen on 127.0.0.1, any free port
//	p2p://127.0.0.1:15001                   a fixed port
//	p2p://0.0.0.0?ports=15000-17000         a free port drawn from a range
//	p2p://0.0.0.0:0?advertise=10.0.0.5      the host put in the segment name
//
// or directly with New. Further query parameters: poll, grace, ttl and
// timeout (Go durations) set Options.PollInterval, Grace, CacheTTL and
// Timeout.
//
// Every connection opens with te's authenticated handshake (internal/control
// with the label "p2p"): with Options.Auth set, client and server each prove
// the cluster secret, and a peer without it gets no descriptor (the error
// matches auth.ErrDenied; a peer that does not speak te, auth.ErrNotTE).
// Server-side connections are bounded (MaxConns, MaxConnsPerSource); at the
// bound the connection that has waited longest for its client makes room,
// so idle connections cannot lock out descriptor fetches.
//
// A process may publish its address as a segment name, or names of the form
// address/suffix when it exposes several segments; a name that does not start
// with the store's own address could never be fetched by a peer and is
// refused. A Store must be closed; Close stops the listener, drops every
// connection and joins every goroutine the store started.
package p2p

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/listen"
	"github.com/rdmago/te/segment"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Listen is the handshake listener's address, host:port. Port 0 picks
	// a free port (or one from PortMin..PortMax). Default 127.0.0.1:0.
	Listen string
	// PortMin and PortMax, when both set and Listen's port is 0, bound the
	// port: a free one is drawn at random from [PortMin, PortMax], as
	// Mooncake draws from 15000–17000.
	PortMin, PortMax int
	// Advertise is the host written into the local segment name when
	// Listen's host is unspecified (0.0.0.0 or ::). Default: the first
	// non-loopback address of an interface that is up.
	Advertise string
	// PollInterval is how often Watch asks a peer for its descriptor.
	// Default 1 s.
	PollInterval time.Duration
	// Grace is how long a peer may stay unreachable (its connection
	// refused or reset, or answering nonsense) before Watch reports it
	// gone (nil). Default 3 × PollInterval.
	Grace time.Duration
	// SlowGrace is how long a peer may leave every poll unanswered
	// within Timeout before Watch reports it gone: a busy host answers
	// late but still serves its transfers, which a gone report would
	// drop; a host that vanished without a reset is seen this way too.
	// Default 1 min, at least Grace.
	SlowGrace time.Duration
	// CacheTTL is how long a fetched descriptor stays in List. Default 1 min.
	CacheTTL time.Duration
	// Timeout bounds one exchange with a peer when ctx has no earlier
	// deadline, and each write of a response. Default 3 s.
	Timeout time.Duration
	// IdleTimeout closes server-side connections that send nothing for this
	// long. Default 2 min.
	IdleTimeout time.Duration
	// MaxConns bounds the server-side connections open at once. At the
	// bound a new connection takes the slot of the one that has waited
	// longest for its client (idle between requests, or in its
	// handshake); only when every connection is busy is it closed on
	// accept. Default 1024.
	MaxConns int
	// MaxConnsPerSource bounds one IP address's connections the same
	// way. Default 256 (at most MaxConns).
	MaxConnsPerSource int
	// Auth is the cluster secret: with it, every connection (both ways)
	// opens with a mutual challenge-response (package auth), and a peer
	// without the secret gets no descriptor. Nil: no authentication (a
	// listener on a non-loopback address then logs a warning).
	Auth *auth.Secret
	// Logger receives warnings (failed handshakes, rate-limited, with
	// the peer's address; an unauthenticated listener). Nil discards
	// them.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 3 * o.PollInterval
	}
	if o.SlowGrace <= 0 {
		o.SlowGrace = time.Minute
	}
	o.SlowGrace = max(o.SlowGrace, o.Grace)
	if o.CacheTTL <= 0 {
		o.CacheTTL = time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 2 * time.Minute
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.MaxConnsPerSource <= 0 {
		o.MaxConnsPerSource = 256
	}
	o.MaxConnsPerSource = min(o.MaxConnsPerSource, o.MaxConns)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Store is the embedded peer-to-peer segment store. It is safe for
// concurrent use.
type Store struct {
	opts    Options
	ln      net.Listener
	addr    string // advertised host:port: the local segment's name
	epoch   uint64 // random per store: this incarnation, in handshakes
	authLog *control.Log
	gate    *acceptor.Gate[netip.Addr, net.Conn] // server-side connections
	closing chan struct{}
	life    context.Context // cancelled by Close
	kill    context.CancelFunc
	once    sync.Once
	wg      sync.WaitGroup // accept loop, connection handlers, watchers

	mu      sync.Mutex // guards the fields below
	closed  bool
	local   map[string]*localSeg
	cache   map[string]cached
	conns   map[net.Conn]struct{} // client connections
	peers   map[string]*peer      // client connections by dial address
	changed chan struct{}         // closed and replaced on every local change
}

// localSeg is a published descriptor and its ready-made response frame.
type localSeg struct {
	d     *segment.Descriptor
	frame []byte
}

type cached struct {
	d  *segment.Descriptor
	at time.Time
}

// peer is one reusable client connection; sem serialises exchanges on it.
type peer struct {
	sem  chan struct{}
	conn net.Conn // owned by whoever holds sem
}

var _ segment.Store = (*Store)(nil)

// Open starts a store from a p2p:// metadata URI (the forms above).
func Open(ctx context.Context, uri string) (*Store, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("p2p: metadata %q: %w", uri, err)
	}
	opts, err := ParseURI(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, opts)
}

// ParseURI turns a p2p:// metadata URI into Options.
func ParseURI(u *url.URL) (Options, error) {
	var o Options
	if u.Scheme != "p2p" {
		return o, fmt.Errorf("p2p: metadata %q: scheme is not p2p", u.String())
	}
	if u.Path != "" && u.Path != "/" {
		return o, fmt.Errorf("p2p: metadata %q: unexpected path %q", u.String(), u.Path)
	}
	if u.Host != "" {
		o.Listen = u.Host
		if u.Port() == "" {
			o.Listen = net.JoinHostPort(u.Hostname(), "0")
		}
	}
	dur := func(key, v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("p2p: metadata %q: %s=%q is not a positive duration", u.String(), key, v)
		}
		return d, nil
	}
	for key, vals := range u.Query() {
		v := vals[len(vals)-1]
		var err error
		switch key {
		case "ports":
			lo, hi, ok := strings.Cut(v, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if !ok || err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
				return o, fmt.Errorf("p2p: metadata %q: ports=%q is not a range lo-hi within 1-65535", u.String(), v)
			}
			o.PortMin, o.PortMax = a, b
		case "advertise":
			o.Advertise = v
		case "poll":
			o.PollInterval, err = dur(key, v)
		case "grace":
			o.Grace, err = dur(key, v)
		case "slowgrace":
			o.SlowGrace, err = dur(key, v)
		case "ttl":
			o.CacheTTL, err = dur(key, v)
		case "timeout":
			o.Timeout, err = dur(key, v)
		default:
			return o, fmt.Errorf("p2p: metadata %q: unknown parameter %q (known: ports, advertise, poll, grace, slowgrace, ttl, timeout)", u.String(), key)
		}
		if err != nil {
			return o, err
		}
	}
	return o, nil
}

// New starts a store listening on opts.Listen.
func New(ctx context.Context, opts Options) (*Store, error) {
	opts.setDefaults()
	ln, err := listen.TCP(ctx, opts.Listen, opts.PortMin, opts.PortMax)
	if err != nil {
		return nil, fmt.Errorf("p2p: listen: %w", err)
	}
	addr, err := listen.Advertised(ln.Addr().(*net.TCPAddr), opts.Advertise)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("p2p: %w", err)
	}
	var eb [8]byte
	rand.Read(eb[:]) // never fails (crypto/rand since Go 1.24)
	s := &Store{
		opts:    opts,
		ln:      ln,
		addr:    addr,
		epoch:   binary.LittleEndian.Uint64(eb[:]) | 1,
		authLog: control.NewLog(opts.Logger, "p2p", 0),
		gate:    acceptor.NewGate[netip.Addr, net.Conn](opts.MaxConns, opts.MaxConnsPerSource),
		closing: make(chan struct{}),
		local:   map[string]*localSeg{},
		cache:   map[string]cached{},
		conns:   map[net.Conn]struct{}{},
		peers:   map[string]*peer{},
		changed: make(chan struct{}),
	}
	auth.WarnUnauthenticated(opts.Logger, "p2p", ln.Addr(), opts.Auth)
	s.life, s.kill = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Name returns the name of this process's segment: the advertised address
// of the handshake listener, host:port.
func (s *Store) Name() string { return s.addr }

// ListenAddr returns the listener's actual address.
func (s *Store) ListenAddr() net.Addr { return s.ln.Addr() }

// dialAddr returns the address a segment name is served on: the part
// before the first '/', which must be host:port with a numeric port.
func dialAddr(name string) (string, error) {
	if name == "" || len(name) > maxNameLen {
		return "", fmt.Errorf("%w: p2p: segment name of %d bytes", segment.ErrNotFound, len(name))
	}
	addr, _, _ := strings.Cut(name, "/")
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return "", fmt.Errorf("%w: p2p: segment name %q is not host:port[/suffix]", segment.ErrNotFound, name)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%w: p2p: segment name %q has no valid port", segment.ErrNotFound, name)
	}
	return addr, nil
}

// Publish makes d the descriptor served under d.Name. The name must be the
// store's Name, or Name()+"/"+suffix.
func (s *Store) Publish(ctx context.Context, d *segment.Descriptor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := segment.Marshal(d)
	if err != nil {
		return fmt.Errorf("p2p: publish: %w", err)
	}
	if d.Name != s.addr && !strings.HasPrefix(d.Name, s.addr+"/") {
		return fmt.Errorf("%w: p2p: publish %q: name must be this store's address %s (or %s/<suffix>)", segment.ErrInvalid, d.Name, s.addr, s.addr)
	}
	if len(d.Name) > maxNameLen {
		return fmt.Errorf("%w: p2p: publish: name longer than %d bytes", segment.ErrInvalid, maxNameLen)
	}
	e := &localSeg{d: d.Clone(), frame: appendFrame(make([]byte, 0, headerLen+len(b)), frameDescriptor, b)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	s.local[d.Name] = e
	s.notifyLocked()
	return nil
}

// Unpublish stops serving a descriptor this store published; peers then get
// ErrNotFound.
func (s *Store) Unpublish(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	if _, ok := s.local[name]; !ok {
		return fmt.Errorf("%w: p2p: unpublish %q: not published here", segment.ErrNotFound, name)
	}
	delete(s.local, name)
	s.notifyLocked()
	return nil
}

func (s *Store) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Get returns the current descriptor of a segment. Local segments are
// answered from memory; others are fetched from the owner named by the
// segment's address. ErrNotFound: the owner answered that it has no such
// segment (or the name cannot be a p2p name); ErrUnavailable: the owner could
// not be reached or did not speak the protocol.
func (s *Store) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, segment.ErrClosed
	}
	if e, ok := s.local[name]; ok {
		s.mu.Unlock()
		return e.d.Clone(), nil
	}
	s.mu.Unlock()
	addr, err := dialAddr(name)
	if err != nil {
		return nil, err
	}
	t, payload, err := s.exchange(ctx, addr, name)
	if err != nil {
		return nil, err
	}
	switch t {
	case frameDescriptor:
		d, err := segment.Unmarshal(payload)
		if err != nil {
			return nil, fmt.Errorf("p2p: get %s: %w", name, err)
		}
		if d.Name != name {
			return nil, fmt.Errorf("%w: p2p: get %s: peer answered with segment %q", segment.ErrInvalid, name, d.Name)
		}
		s.mu.Lock()
		s.cache[name] = cached{d: d.Clone(), at: time.Now()}
		s.mu.Unlock()
		return d, nil
	case frameNotFound:
		s.mu.Lock()
		delete(s.cache, name)
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: p2p: get %s: peer %s has no such segment", segment.ErrNotFound, name, addr)
	case frameError:
		return nil, fmt.Errorf("%w: p2p: get %s: peer %s refused: %s", segment.ErrUnavailable, name, addr, sanitize(payload))
	}
	return nil, fmt.Errorf("%w: p2p: get %s: peer %s answered with a %s frame", segment.ErrUnavailable, name, addr, typeName(t))
}

// sanitize makes a peer's message safe to print.
func sanitize(b []byte) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return '?'
		}
		return r
	}, string(b))
}

// exchange sends one request to addr and reads the response, reusing the
// peer's connection. A reused connection that fails (the peer restarted or
// closed it while idle) is replaced once by a fresh one.
func (s *Store) exchange(ctx context.Context, addr, name string) (frameType, []byte, error) {
	p := s.peer(addr)
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, nil, fmt.Errorf("%w: p2p: get %s: %w", segment.ErrUnavailable, name, ctx.Err())
	case <-s.closing:
		return 0, nil, segment.ErrClosed
	}
	defer func() { <-p.sem }()

	deadline := time.Now().Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	req := appendFrame(make([]byte, 0, headerLen+len(name)), frameGet, []byte(name))
	for {
		fresh := false
		if p.conn == nil {
			dctx, cancel := context.WithDeadline(ctx, deadline)
			var d net.Dialer
			c, err := d.DialContext(dctx, "tcp", addr)
			cancel()
			if err != nil {
				if cerr := ctxErr(ctx); cerr != nil {
					err = fmt.Errorf("%w (%w)", cerr, err)
				}
				return 0, nil, fmt.Errorf("%w: p2p: get %s: %w", segment.ErrUnavailable, name, err)
			}
			if !s.track(c) {
				c.Close()
				return 0, nil, segment.ErrClosed
			}
			if err := s.dialHandshake(ctx, c, addr, deadline); err != nil {
				s.untrack(c)
				if cerr := ctxErr(ctx); cerr != nil {
					err = fmt.Errorf("%w (%w)", cerr, err)
				}
				// One line: the handshake's error says what happened.
				if name != addr {
					err = fmt.Errorf("from %s: %w", addr, err)
				}
				return 0, nil, control.Mark(fmt.Errorf("p2p: get %s: %w", name, err), segment.ErrUnavailable)
			}
			p.conn, fresh = c, true
		}
		t, payload, err := roundTrip(ctx, p.conn, deadline, req)
		if err == nil {
			return t, payload, nil
		}
		s.untrack(p.conn)
		p.conn = nil
		if s.isClosing() {
			return 0, nil, segment.ErrClosed
		}
		if fresh || ctx.Err() != nil || !time.Now().Before(deadline) {
			if cerr := ctxErr(ctx); cerr != nil {
				err = fmt.Errorf("%w (%w)", cerr, err)
			}
			return 0, nil, fmt.Errorf("%w: p2p: get %s from %s: %w", segment.ErrUnavailable, name, addr, err)
		}
	}
}

// dialHandshake authenticates a fresh client connection to addr (and the
// peer to this store) within deadline and until ctx ends.
func (s *Store) dialHandshake(ctx context.Context, c net.Conn, addr string, deadline time.Time) error {
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	return handshake.Dial(control.Stream(c, c, &responses), s.opts.Auth, auth.Party{Name: s.addr, Epoch: s.epoch}, auth.Party{Name: addr})
}

// ctxErr is ctx.Err(), or DeadlineExceeded once ctx's deadline has passed:
// a socket deadline set from ctx can fire a moment before ctx notices.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// roundTrip writes req and reads one response frame, within deadline and
// until ctx ends.
func roundTrip(ctx context.Context, c net.Conn, deadline time.Time, req []byte) (frameType, []byte, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	// Cancelling ctx pulls the deadline into the past, which unblocks I/O.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(req); err != nil {
		return 0, nil, err
	}
	var hdr [headerLen]byte
	return readFrame(c, hdr[:], segment.MaxEncodedSize)
}

func (s *Store) peer(addr string) *peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[addr]
	if !ok {
		p = &peer{sem: make(chan struct{}, 1)}
		s.peers[addr] = p
	}
	return p
}

func (s *Store) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// track records an open connection so Close can drop it; false once closed.
func (s *Store) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Store) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// List returns this store's descriptors and those fetched within CacheTTL,
// sorted by name.
func (s *Store) List(ctx context.Context) ([]*segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	out := make([]*segment.Descriptor, 0, len(s.local)+len(s.cache))
	for _, e := range s.local {
		out = append(out, e.d.Clone())
	}
	now := time.Now()
	for name, c := range s.cache {
		if now.Sub(c.at) > s.opts.CacheTTL {
			delete(s.cache, name)
			continue
		}
		if _, ok := s.local[name]; !ok {
			out = append(out, c.d.Clone())
		}
	}
	slices.SortFunc(out, func(a, b *segment.Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Watch polls a segment every PollInterval (local segments are also seen at
// once when published) and reports the descriptor whenever its Epoch or
// Version differs from the last one reported, or nil once it is gone: at
// once when its owner answers that it has no such segment, after Grace
// when the owner cannot be reached (refused, reset, nonsense), and after
// SlowGrace when it accepts but answers no poll within Timeout (a busy
// host's late answers are no sign that it went away). The first report is the segment's state
// when Watch starts. The channel is closed when ctx ends or the store is
// closed.
func (s *Store) Watch(ctx context.Context, name string) (<-chan *segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, err := dialAddr(name); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	// Close ends in-flight polls promptly through the store's life.
	return segment.GoWatch(ctx, s.life, &s.wg, func(ctx context.Context, rep *segment.WatchReport) {
		s.watch(ctx, name, rep)
	}), nil
}

func (s *Store) watch(ctx context.Context, name string, rep *segment.WatchReport) {
	var downSince, slowSince time.Time
	ticker := time.NewTicker(s.opts.PollInterval)
	defer ticker.Stop()
	for {
		s.mu.Lock()
		changed := s.changed
		s.mu.Unlock()

		pctx, pcancel := context.WithTimeout(ctx, s.opts.Timeout)
		d, err := s.Get(pctx, name)
		pcancel()
		switch {
		case ctx.Err() != nil || errors.Is(err, segment.ErrClosed):
			return
		case err == nil:
			downSince, slowSince = time.Time{}, time.Time{}
			if !rep.Send(ctx, d) {
				return
			}
		case errors.Is(err, segment.ErrNotFound):
			downSince, slowSince = time.Time{}, time.Time{}
			if !rep.Send(ctx, nil) {
				return
			}
		case timedOut(err): // no answer in time: busy, or silently gone
			now := time.Now()
			if slowSince.IsZero() {
				slowSince = now
			}
			if now.Sub(slowSince) >= s.opts.SlowGrace && !rep.Send(ctx, nil) {
				return
			}
		default: // unreachable or answering nonsense
			now := time.Now()
			if downSince.IsZero() {
				downSince = now
			}
			if now.Sub(downSince) >= s.opts.Grace && !rep.Send(ctx, nil) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-changed:
		}
	}
}

// timedOut reports whether err is a poll that got no answer in time (a
// dial, handshake or exchange past its deadline), not a refusal.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// Close stops the listener, drops every connection, ends every Watch and
// forgets the published descriptors. It is idempotent and safe on a nil
// Store.
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	var err error
	s.once.Do(func() {
		close(s.closing)
		s.kill()
		err = s.ln.Close()
		s.mu.Lock()
		s.closed = true
		s.gate.Close()
		for c := range s.conns {
			c.Close()
		}
		clear(s.conns)
		clear(s.local)
		clear(s.cache)
		s.mu.Unlock()
	})
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("p2p: close: %w", err)
	}
	return nil
}

// acceptLoop serves the handshake listener until Close.
func (s *Store) acceptLoop() {
	defer s.wg.Done()
	acceptor.Run(s.opts.Logger, "p2p", s.ln.Addr(), s.closing, s.ln.Accept, s.admit)
}

// admit serves c under the admission policy (internal/acceptor.Gate): at
// MaxConns (or MaxConnsPerSource for c's address) the connection that
// has waited longest for its client is closed to make room, so idle
// connections cannot lock out descriptor fetches.
func (s *Store) admit(c net.Conn) {
	var src netip.Addr
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		src = ta.AddrPort().Addr().Unmap()
	}
	slot, ok := s.gate.Admit(src, c, func() { c.Close() })
	if !ok {
		c.Close()
		return
	}
	s.wg.Add(1) // the accept loop holds the group: no race with Close's Wait
	go s.serveConn(slot)
}

// serveConn answers requests on one connection until the peer closes it,
// idles past IdleTimeout, sends a malformed frame, or the store closes.
// Nothing is answered before the client passed the handshake (within
// Timeout).
func (s *Store) serveConn(sc *acceptor.Slot[netip.Addr, net.Conn]) {
	c := sc.Conn()
	defer s.wg.Done()
	defer func() {
		s.gate.Leave(sc)
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(s.opts.Timeout))
	_, err := handshake.Accept(control.Stream(c, c, &requests), s.opts.Auth, auth.Party{Name: s.addr, Epoch: s.epoch}, nil)
	if err != nil {
		s.authLog.Failed(c.RemoteAddr(), err)
		if errors.Is(err, control.ErrMalformed) || errors.Is(err, auth.ErrNotTE) {
			s.reply(c, appendFrame(nil, frameError, truncate([]byte(err.Error()), maxErrorLen)))
		}
		return
	}
	var hdr [headerLen]byte
	for {
		sc.Wait()
		c.SetDeadline(time.Now().Add(s.opts.IdleTimeout))
		// Requests never carry descriptors: a descriptor frame is refused
		// before its payload is read.
		t, payload, err := readFrame(c, hdr[:], 0)
		sc.Work()
		if err != nil {
			if errors.Is(err, errFrame) {
				s.reply(c, appendFrame(nil, frameError, truncate([]byte(err.Error()), maxErrorLen)))
			}
			return
		}
		if t != frameGet {
			s.reply(c, appendFrame(nil, frameError, []byte(fmt.Sprintf("p2p: unexpected %v frame from a client", typeName(t)))))
			return
		}
		if !s.reply(c, s.answer(payload)) {
			return
		}
	}
}

// answer returns the response frame for a request for name.
func (s *Store) answer(name []byte) []byte {
	s.mu.Lock()
	e, ok := s.local[string(name)]
	s.mu.Unlock()
	if ok {
		return e.frame // immutable once published
	}
	return appendFrame(make([]byte, 0, headerLen+len(name)), frameNotFound, name)
}

func (s *Store) reply(c net.Conn, frame []byte) bool {
	c.SetWriteDeadline(time.Now().Add(s.opts.Timeout))
	_, err := c.Write(frame)
	return err == nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
