package p2p

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/listen"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// Options configure a Store. The zero value listens on 127.0.0.1, on a
// free port.
type Options struct {
	// Listen is the handshake listener's address, host:port. Port 0 picks
	// a free port, from PortMin..PortMax when both are set (Mooncake draws
	// from 15000-17000). Default "127.0.0.1:0".
	Listen string
	// PortMin and PortMax bound the port drawn when Listen's port is 0.
	PortMin, PortMax int
	// Advertise is the host of the segment name when Listen's host is
	// unspecified (0.0.0.0, ::). Default: the first non-loopback IPv4
	// address of an interface that is up, else 127.0.0.1.
	Advertise string
	// Timeout bounds one exchange: on the server, reading the request and
	// writing the reply (Mooncake gives a client 5 s); on the client, when
	// the context has no earlier deadline. Default 5 s.
	Timeout time.Duration
	// MaxMessage bounds a message's length. Default DefaultMaxMessage.
	MaxMessage int
	// MaxConns bounds the connections served at once. At the bound the
	// one that has waited longest for its client (to send its request,
	// or to close after the reply) makes room; when every one is being
	// answered, the new one is closed (internal/acceptor.Gate). Each
	// lasts at most Timeout. Default 256.
	MaxConns int
	// MaxConnsPerSource bounds one IP address's share. Default 64.
	MaxConnsPerSource int
	// PollInterval is how often Watch fetches a peer's descriptor.
	// Default 1 s.
	PollInterval time.Duration
	// Grace is how long a peer may stay unreachable before Watch reports
	// it gone. Default 3 × PollInterval.
	Grace time.Duration
	// CacheTTL is how long a fetched descriptor stays in List. Default 1 min.
	CacheTTL time.Duration
	// Logger receives warnings (an exposed listener) and debug lines
	// (refused requests). Nil discards them.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxMessage <= 0 {
		o.MaxMessage = DefaultMaxMessage
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 256
	}
	if o.MaxConnsPerSource <= 0 {
		o.MaxConnsPerSource = 64
	}
	o.MaxConnsPerSource = min(o.MaxConnsPerSource, o.MaxConns)
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Grace <= 0 {
		o.Grace = 3 * o.PollInterval
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Store is a segment.Store over Mooncake's P2PHANDSHAKE socket. Its Name,
// ip:port of the listener, is the only segment it publishes: give it to
// engine.Config.Name. Published descriptors must offer the Mooncake TCP
// transport (mooncake.TEProtoTCP); they are served translated to
// Mooncake's format. Get fetches any Mooncake (or te) peer's descriptor by
// its ip:port name. It is safe for concurrent use; Close must be called.
type Store struct {
	opts Options
	ln   net.Listener
	name string

	life    context.Context // cancelled by Close
	kill    context.CancelFunc
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	reply    atomic.Pointer[[]byte] // the Metadata reply frame; nil: none
	versions mooncake.Versions
	// inbox receives Notify messages (the engine's, ReceiveNotifications);
	// nil: they are answered as not delivered.
	inbox atomic.Pointer[inboxRef]
	// conns answers Connection messages (HandleConnections); nil: they
	// are refused.
	conns  atomic.Pointer[connRef]
	noteID atomic.Uint64

	mu     sync.Mutex
	closed bool
	local  *segment.Descriptor
	cache  map[string]cached
	// gate admits served connections (internal/acceptor.Gate).
	gate *acceptor.Gate[netip.Addr, net.Conn]
}

type cached struct {
	d  *segment.Descriptor
	at time.Time
}

var _ segment.Store = (*Store)(nil)

// New starts a Store listening on opts.Listen.
func New(ctx context.Context, opts Options) (*Store, error) {
	opts.setDefaults()
	ln, err := listen.TCP(ctx, opts.Listen, opts.PortMin, opts.PortMax)
	if err != nil {
		return nil, fmt.Errorf("mooncake/p2p: listen: %w", err)
	}
	name, err := listen.Advertised(ln.Addr().(*net.TCPAddr), opts.Advertise)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("mooncake/p2p: %w", err)
	}
	s := &Store{opts: opts, ln: ln, name: name, closing: make(chan struct{}),
		cache: map[string]cached{}, gate: acceptor.NewGate[netip.Addr, net.Conn](opts.MaxConns, opts.MaxConnsPerSource)}
	s.life, s.kill = context.WithCancel(context.Background())
	mooncake.WarnExposed(opts.Logger, "the P2PHANDSHAKE socket", ln.Addr())
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		acceptor.Run(opts.Logger, "mooncake/p2p", ln.Addr(), s.closing, ln.Accept, s.admit)
	}()
	return s, nil
}

// Name is the local segment's name: the advertised ip:port of the
// handshake listener.
func (s *Store) Name() string { return s.name }

// ListenAddr is the listener's address.
func (s *Store) ListenAddr() net.Addr { return s.ln.Addr() }

// Publish serves d, translated to Mooncake's format, to Metadata requests.
// d.Name must be Name(). A descriptor that offers no Mooncake protocol is
// kept (Get returns it) but not served.
func (s *Store) Publish(ctx context.Context, d *segment.Descriptor) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d == nil || d.Name != s.name {
		return fmt.Errorf("%w: mooncake/p2p: publish: the segment name must be this store's address %s", segment.ErrInvalid, s.name)
	}
	// A descriptor without a Mooncake protocol (an engine's first, before
	// its transports are installed) is kept but not served: Metadata
	// requests are closed unanswered until one is published.
	var frame *[]byte
	md, err := mooncake.FromTE(d, mooncake.FromOptions{Name: s.name})
	switch {
	case errors.Is(err, mooncake.ErrNoProtocol):
	case err != nil:
		return fmt.Errorf("mooncake/p2p: publish %s: %w", d.Name, err)
	default:
		body, err := mooncake.Encode(md)
		if err != nil {
			return fmt.Errorf("mooncake/p2p: publish %s: %w", d.Name, err)
		}
		if len(body)+1 > s.opts.MaxMessage {
			return fmt.Errorf("%w: mooncake/p2p: publish %s: descriptor of %d bytes exceeds the %d-byte message bound", segment.ErrInvalid, d.Name, len(body), s.opts.MaxMessage)
		}
		f := AppendMessage(nil, Metadata, body)
		frame = &f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	s.local = d.Clone()
	s.reply.Store(frame)
	return nil
}

// Unpublish stops serving the descriptor: Metadata requests are then
// closed unanswered, which a Mooncake initiator reports as an unknown
// segment.
func (s *Store) Unpublish(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	if s.local == nil || name != s.name {
		return fmt.Errorf("%w: mooncake/p2p: unpublish %q: not published here", segment.ErrNotFound, name)
	}
	s.local = nil
	s.reply.Store(nil)
	return nil
}

// Get returns a segment's descriptor: the local one from memory, any other
// fetched from its owner (name is ip:port) and translated to te's.
func (s *Store) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, segment.ErrClosed
	}
	if s.local != nil && name == s.name {
		d := s.local.Clone()
		s.mu.Unlock()
		return d, nil
	}
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	var self []byte
	if p := s.reply.Load(); p != nil {
		self = (*p)[9:]
	}
	md, err := fetch(ctx, name, self, s.opts.Timeout, s.opts.MaxMessage)
	if err != nil {
		if s.life.Err() != nil {
			return nil, segment.ErrClosed
		}
		return nil, err
	}
	d, err := mooncake.ToTE(md, mooncake.ToOptions{Name: name})
	if err != nil {
		return nil, fmt.Errorf("mooncake/p2p: get %s: %w", name, err)
	}
	s.versions.Stamp(d)
	s.mu.Lock()
	s.cache[name] = cached{d: d.Clone(), at: time.Now()}
	s.mu.Unlock()
	return d, nil
}

// List returns the local descriptor and those fetched within CacheTTL.
func (s *Store) List(ctx context.Context) ([]*segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	var out []*segment.Descriptor
	if s.local != nil {
		out = append(out, s.local.Clone())
	}
	now := time.Now()
	for name, c := range s.cache {
		if now.Sub(c.at) > s.opts.CacheTTL {
			delete(s.cache, name)
			continue
		}
		if s.local == nil || name != s.name {
			out = append(out, c.d.Clone())
		}
	}
	slices.SortFunc(out, func(a, b *segment.Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Watch fetches the segment every PollInterval and reports it when its
// epoch or version changes, or nil after Grace without an answer.
func (s *Store) Watch(ctx context.Context, name string) (<-chan *segment.Descriptor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, segment.ErrClosed
	}
	return segment.GoWatch(ctx, s.life, &s.wg, func(ctx context.Context, rep *segment.WatchReport) {
		var downSince time.Time
		tk := time.NewTicker(s.opts.PollInterval)
		defer tk.Stop()
		for {
			d, err := s.Get(ctx, name)
			switch {
			case ctx.Err() != nil || errors.Is(err, segment.ErrClosed):
				return
			case err == nil:
				downSince = time.Time{}
				if !rep.Send(ctx, d) {
					return
				}
			default:
				if downSince.IsZero() {
					downSince = time.Now()
				}
				if time.Since(downSince) >= s.opts.Grace && !rep.Send(ctx, nil) {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}), nil
}

// Close stops the listener, drops every connection and ends every Watch.
// It is idempotent and safe on a nil Store.
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	s.once.Do(func() {
		close(s.closing)
		s.kill()
		s.ln.Close()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.gate.Close()
	})
	s.wg.Wait()
	return nil
}

// admit serves c under the admission policy (internal/acceptor.Gate): at
// MaxConns (or MaxConnsPerSource for c's address) the connection that has
// waited longest for its client (to send its request, or to close after
// the reply) is closed to make room; one being answered is kept, and when
// all are, c is closed. Each lasts at most Timeout.
func (s *Store) admit(c net.Conn) {
	var src netip.Addr
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		src = ta.AddrPort().Addr().Unmap()
	}
	slot, ok := s.gate.Admit(src, c, func() { c.Close() })
	if !ok {
		c.Close()
		s.opts.Logger.Debug("mooncake/p2p: connection refused at the bound", "remote", c.RemoteAddr())
		return
	}
	s.wg.Add(1) // the accept loop holds the group: no race with Close's Wait
	go s.serve(slot)
}

func (s *Store) serve(slot *acceptor.Slot[netip.Addr, net.Conn]) {
	c := slot.Conn()
	defer s.wg.Done()
	defer func() {
		s.gate.Leave(slot)
		c.Close()
	}()
	deadline := time.Now().Add(s.opts.Timeout)
	c.SetDeadline(deadline)
	t, body, err := ReadMessage(c, s.opts.MaxMessage)
	slot.Work()
	if err != nil {
		s.opts.Logger.Debug("mooncake/p2p: bad request", "remote", c.RemoteAddr(), "err", err)
		return
	}
	reply, err := s.answer(t, body, c.RemoteAddr())
	if err != nil {
		s.opts.Logger.Debug("mooncake/p2p: request refused", "remote", c.RemoteAddr(), "type", t, "err", err)
		return
	}
	if _, err := c.Write(reply); err != nil {
		return
	}
	slot.Wait()
	// Like Mooncake: half-close, then let the client close first, so the
	// reply is never cut short by a reset. Bytes after the request are
	// dropped (one request per connection).
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, int64(s.opts.MaxMessage)))
}

// answer builds the reply to one request, or refuses it (the connection is
// then closed unanswered, as Mooncake does).
func (s *Store) answer(t Type, body []byte, from net.Addr) ([]byte, error) {
	if err := checkJSON(body); err != nil {
		return nil, err
	}
	switch t {
	case Metadata:
		if p := s.reply.Load(); p != nil {
			return *p, nil
		}
		return nil, errors.New("no descriptor published")
	case Probe:
		return AppendMessage(nil, Probe, []byte(`{"status":"success"}`+"\n")), nil
	case Notify:
		// An empty notify_msg tells a Mooncake sender that the
		// notification was not delivered.
		if err := s.deliver(body, from); err != nil {
			s.opts.Logger.Debug("mooncake/p2p: notification not delivered", "remote", from, "err", err)
			return AppendMessage(nil, Notify, []byte(`{"name":"","notify_msg":""}`+"\n")), nil
		}
		return AppendMessage(nil, Notify, []byte(`{"name":"","notify_msg":"success"}`+"\n")), nil
	case Connection, Untyped:
		req, err := mooncake.DecodeHandshake(body)
		if err != nil {
			return nil, err
		}
		// Without a handler (no Mooncake RDMA transport installed) the
		// reply, with the NIC paths swapped as Mooncake's passive side
		// writes them, refuses the endpoint in reply_msg.
		rep := &mooncake.Handshake{LocalNICPath: req.PeerNICPath, PeerNICPath: req.LocalNICPath,
			ReplyMsg: "te: no Mooncake RDMA transport serves this segment; use the tcp protocol"}
		if h := s.conns.Load(); h != nil {
			var ip netip.Addr
			if ta, ok := from.(*net.TCPAddr); ok {
				ip = ta.AddrPort().Addr().Unmap()
			}
			ctx, cancel := context.WithTimeout(s.life, s.opts.Timeout)
			rep = h.HandleConnection(ctx, ip, req)
			cancel()
		}
		rec, err := rep.Encode()
		if err != nil {
			return nil, err
		}
		return AppendMessage(nil, t, rec), nil
	}
	return nil, fmt.Errorf("%w: unknown type %d", ErrMalformed, t)
}

type inboxRef struct{ driver.Inbox }

type connRef struct{ mooncake.ConnectionHandler }

// HandleConnections hands the Connection messages of Mooncake's RDMA
// endpoint handshake to h (a Mooncake RDMA transport, package rdma with
// Config.Mooncake); nil refuses them again, as a store without one does.
func (s *Store) HandleConnections(h mooncake.ConnectionHandler) {
	if h == nil {
		s.conns.Store(nil)
		return
	}
	s.conns.Store(&connRef{h})
}

// ReceiveNotifications implements driver.NotifyReceiver: Notify messages
// go to ib (the engine does this when it starts with this store).
func (s *Store) ReceiveNotifications(ib driver.Inbox) {
	if ib == nil {
		s.inbox.Store(nil)
		return
	}
	s.inbox.Store(&inboxRef{ib})
}

// NotifySender is the sender name of notifications that arrive on the
// handshake socket: Mooncake's Notify message names no sender, so the
// sender is its IP address, "mooncake@" + ip.
func NotifySender(ip netip.Addr) string { return "mooncake@" + ip.String() }

// deliver hands a Notify message to the inbox: its name and notify_msg
// become the notification's Name and Msg, its sender NotifySender of the
// connection's address. Each message is a new notification (the wire has
// no IDs to deduplicate by).
func (s *Store) deliver(body []byte, from net.Addr) error {
	ref := s.inbox.Load()
	if ref == nil {
		return errors.New("no engine receives notifications")
	}
	rec, err := DecodeNotify(body)
	if err != nil {
		return err
	}
	var ip netip.Addr
	if ta, ok := from.(*net.TCPAddr); ok {
		ip = ta.AddrPort().Addr().Unmap()
	}
	ctx, cancel := context.WithTimeout(s.life, s.opts.Timeout)
	defer cancel()
	return ref.Deliver(ctx, &driver.Delivery{From: driver.Sender{Name: NotifySender(ip), Epoch: 1},
		ID: s.noteID.Add(1), Name: []byte(rec.Name), Msg: []byte(rec.NotifyMsg)})
}

// SendNotify sends a Notify message to the handshake socket at addr
// (ip:port), as Mooncake's sendNotifyByName does, and reports whether the
// receiver took it (a non-empty notify_msg in its reply). Errors wrap
// segment.ErrUnavailable (no answer) or ErrRefused.
func SendNotify(ctx context.Context, addr string, rec NotifyRecord, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	body, err := EncodeNotify(rec)
	if err != nil {
		return err
	}
	t, reply, err := exchange(ctx, addr, Notify, body, timeout, DefaultMaxMessage)
	if err != nil {
		return err
	}
	if t != Notify {
		return fmt.Errorf("%w: mooncake/p2p: %s answered Notify with a %v message", segment.ErrUnavailable, addr, t)
	}
	r, err := DecodeNotify(reply)
	if err != nil {
		return fmt.Errorf("mooncake/p2p: %s's reply to Notify: %w", addr, err)
	}
	if r.NotifyMsg == "" {
		return fmt.Errorf("%w: %s did not take the notification", ErrRefused, addr)
	}
	return nil
}

// SendConnection sends one Connection message (an RDMA endpoint
// handshake record) to the handshake socket at addr (ip:port) and returns
// the peer's record, as Mooncake's sendHandshake does. A reply whose
// ReplyMsg is set is returned with a nil error: the caller decides what a
// refusal means. Errors wrap segment.ErrUnavailable (no answer) or
// mooncake.ErrHandshake (an answer that is not a record).
func SendConnection(ctx context.Context, addr string, req *mooncake.Handshake, timeout time.Duration) (*mooncake.Handshake, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	body, err := req.Encode()
	if err != nil {
		return nil, err
	}
	t, reply, err := exchange(ctx, addr, Connection, body, timeout, DefaultMaxMessage)
	if err != nil {
		return nil, err
	}
	if t != Connection {
		return nil, fmt.Errorf("%w: mooncake/p2p: %s answered Connection with a %v message", segment.ErrUnavailable, addr, t)
	}
	rep, err := mooncake.DecodeHandshake(reply)
	if err != nil {
		return nil, fmt.Errorf("mooncake/p2p: %s's reply to Connection: %w", addr, err)
	}
	return rep, nil
}

// Fetch asks the handshake socket at addr (ip:port) for its descriptor,
// sending self (this process's Mooncake descriptor; nil sends {}), within
// timeout and until ctx ends. Errors wrap segment.ErrUnavailable (no answer)
// or mooncake.ErrInvalid (an answer that is not a valid descriptor).
func Fetch(ctx context.Context, addr string, self []byte, timeout time.Duration) (*mooncake.Descriptor, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return fetch(ctx, addr, self, timeout, DefaultMaxMessage)
}

func fetch(ctx context.Context, addr string, self []byte, timeout time.Duration, max int) (*mooncake.Descriptor, error) {
	if len(self) == 0 {
		self = []byte("{}\n")
	}
	t, body, err := exchange(ctx, addr, Metadata, self, timeout, max)
	if err != nil {
		return nil, err
	}
	if t != Metadata {
		return nil, fmt.Errorf("%w: mooncake/p2p: %s answered Metadata with a %v message", segment.ErrUnavailable, addr, t)
	}
	md, err := mooncake.Decode(body)
	if err != nil {
		return nil, fmt.Errorf("mooncake/p2p: descriptor from %s: %w", addr, err)
	}
	return md, nil
}

// ProbePeer sends a Probe to addr and reports whether it answered
// {"status":"success"}.
func ProbePeer(ctx context.Context, addr string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	t, body, err := exchange(ctx, addr, Probe, []byte("{}\n"), timeout, DefaultMaxMessage)
	if err != nil {
		return err
	}
	var r ProbeReply
	if t != Probe || json.NewDecoder(bytes.NewReader(body)).Decode(&r) != nil || r.Status != "success" {
		return fmt.Errorf("%w: mooncake/p2p: %s answered a Probe with %v %.64q", segment.ErrUnavailable, addr, t, body)
	}
	return nil
}

// exchange sends one message to addr and reads the reply.
func exchange(ctx context.Context, addr string, t Type, body []byte, timeout time.Duration, max int) (Type, []byte, error) {
	host, port, err := net.SplitHostPort(addr)
	if p, perr := strconv.Atoi(port); err != nil || perr != nil || host == "" || p < 1 || p > 65535 {
		return 0, nil, fmt.Errorf("%w: mooncake/p2p: segment name %q is not ip:port", segment.ErrNotFound, addr)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: mooncake/p2p: %s: %w", segment.ErrUnavailable, addr, ctxErr(ctx, err))
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(AppendMessage(nil, t, body)); err != nil {
		return 0, nil, fmt.Errorf("%w: mooncake/p2p: %s: send %v: %w", segment.ErrUnavailable, addr, t, ctxErr(ctx, err))
	}
	rt, reply, err := ReadMessage(c, max)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: mooncake/p2p: %s: reply to %v: %w", segment.ErrUnavailable, addr, t, ctxErr(ctx, err))
	}
	return rt, reply, nil
}

// ctxErr adds ctx's error to err when ctx has ended or its deadline has
// passed (a socket deadline set from ctx can fire before ctx notices).
func ctxErr(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if d, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(d) {
		cerr = context.DeadlineExceeded
	}
	if cerr == nil {
		return err
	}
	return fmt.Errorf("%w (%w)", cerr, err)
}

// Open opens p2phandshake://[host[:port]][?ports=lo-hi&advertise=H&timeout=D]:
// a Store listening on host (default 127.0.0.1) and port; without a port,
// one drawn from 15000-17000 as Mooncake does (ports= changes the range).
// segment/stores opens p2phandshake:// URIs with it.
func Open(ctx context.Context, uri string) (*Store, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "p2phandshake" {
		return nil, fmt.Errorf("mooncake/p2p: metadata %q is not a p2phandshake:// URI", uri)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("mooncake/p2p: metadata %q: unexpected path %q", uri, u.Path)
	}
	o := Options{PortMin: 15000, PortMax: 17000}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "0"
	}
	o.Listen = net.JoinHostPort(host, port)
	for key, vals := range u.Query() {
		v := vals[len(vals)-1]
		switch key {
		case "ports":
			lo, hi, ok := strings.Cut(v, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if !ok || err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
				return nil, fmt.Errorf("mooncake/p2p: metadata %q: ports=%q is not a range lo-hi within 1-65535", uri, v)
			}
			o.PortMin, o.PortMax = a, b
		case "advertise":
			o.Advertise = v
		case "timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("mooncake/p2p: metadata %q: timeout=%q is not a positive duration", uri, v)
			}
			o.Timeout = d
		default:
			return nil, fmt.Errorf("mooncake/p2p: metadata %q: unknown parameter %q (known: ports, advertise, timeout)", uri, key)
		}
	}
	return New(ctx, o)
}
