// Package consul keeps segment descriptors in Consul's KV store, for
// clusters that run a Consul agent.
//
// # Key layout
//
// Under a configurable prefix (default "te"), one key per segment:
//
//	<prefix>/segments/<url.PathEscape(name)>   value: segment.Marshal(descriptor)
//	                                           flags: unix milliseconds when this
//	                                                  incarnation first published it
//	                                           session: the owner's session
//
// The value is the versioned descriptor encoding of package segment (schema
// checked on decode), so differently built peers never silently disagree.
// Names are path-escaped, so a name may contain '/' and still be one key.
//
// # Ownership and liveness
//
// Each Store holds one Consul session (TTL Config.SessionTTL, behavior
// "delete", lock delay ~0) and renews it every TTL/2. Every key it publishes
// is written with the KV "lock" operation under that session, in a
// transaction that first checks the key: absent for a new segment
// (check-not-exists), unchanged since this store last wrote it for an update
// (check-index on ModifyIndex). So two stores never silently overwrite
// each other: the second gets segment.ErrConflict. The owner watches each
// key it publishes (a blocking query): when a writer that is not a store
// holding the key changes or deletes it (a plain KV put or delete, which
// leaves the owner's lock or no lock), the owner logs it and writes its
// descriptor again; a key another store's session has locked is given up,
// logged as lost. List logs the keys it cannot read in one line: their
// count, the first few names and the first error. When the owning process
// dies, its session stops being renewed and Consul deletes its keys within
// TTL to 2×TTL; Close destroys the session, which deletes them at once.
// A process restarted after a crash need not wait that long: the session's
// name records the owner's machine boot, PID namespace, PID and start time,
// and a store that finds a key held by a process of its own boot and PID
// namespace that no longer runs ends that session and takes the key over
// (owner.go); any holder it cannot prove gone keeps segment.ErrConflict.
// Each Store draws a random Epoch, stamped on descriptors published with
// Epoch 0, so a restarted process publishes a new epoch.
//
// # When Consul is unreachable
//
// The store keeps a cache of every descriptor it has fetched (Get, List,
// Watch) or published. While Consul cannot be reached:
//
//   - Get of a cached segment returns the cached descriptor with a nil
//     error: the owner may be alive and its memory usable, and the data path
//     must not depend on the metadata server. Health reports the outage.
//     A cached entry is dropped as soon as Consul answers that the key is
//     gone.
//   - Get of a segment not in the cache fails with an error wrapping
//     segment.ErrUnavailable.
//   - Publish and Unpublish fail with segment.ErrUnavailable but keep the
//     change as this store's desired state, applied when Consul answers.
//   - Watch keeps its channel open and reports nothing until Consul
//     answers again; then it gives owners 2×SessionTTL+RequestTimeout to
//     re-register before it reports a segment gone.
//
// A background keeper renews the session; when Consul says the session is
// gone (TTL expired during the outage, or the agent lost its state) it
// creates a new session and re-publishes every descriptor the store owns,
// under the same epoch and version. Every request carries a deadline
// (Config.RequestTimeout, or the caller's earlier one).
//
// Open it with Open("consul://127.0.0.1:8500/prefix") (or stores.Open,
// package segment/stores, which knows every scheme te carries), or New.
package consul

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/rdmago/te/internal/regfile"
	"github.com/rdmago/te/segment"
)

// Defaults for Config.
const (
	DefaultAddress        = "127.0.0.1:8500"
	DefaultPrefix         = "te"
	DefaultSessionTTL     = 10 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	DefaultWatchWait      = time.Minute
)

// maxTokenFile bounds $CONSUL_HTTP_TOKEN_FILE (a token is a UUID).
const maxTokenFile = 64 << 10

// Config configures a Store. The zero value talks to a local agent.
type Config struct {
	// Address is the agent's HTTP API, host:port. Default 127.0.0.1:8500.
	Address string
	// Prefix is the KV prefix the store's keys live under. Default "te".
	Prefix string
	// Token is the ACL token: Consul's ACLs guard the metadata (the
	// cluster secret of package auth guards the data paths). Default
	// $CONSUL_HTTP_TOKEN, else the contents of $CONSUL_HTTP_TOKEN_FILE.
	// It is sent to Consul only, never logged.
	Token string
	// SessionTTL is the session's TTL: how long after the owner dies its
	// segments may remain (Consul allows up to twice this). It must be at
	// least the agent's session_ttl_min (10 s by default). Default 10 s.
	SessionTTL time.Duration
	// RequestTimeout bounds one request to Consul when the caller's context
	// has no earlier deadline. Default 5 s.
	RequestTimeout time.Duration
	// WatchWait is the longest one blocking query waits. Default 1 min.
	WatchWait time.Duration
	// Logf reports background events (outages, re-registration, segments
	// lost to another writer). Default log.Printf.
	Logf func(format string, args ...any)
}

func (c *Config) setDefaults() error {
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = strings.Trim(c.Prefix, "/")
	if c.Prefix == "" || slices.Contains(strings.Split(c.Prefix, "/"), "") {
		return fmt.Errorf("consul: bad key prefix %q", c.Prefix)
	}
	if c.Token == "" {
		c.Token = os.Getenv("CONSUL_HTTP_TOKEN")
	}
	if f := os.Getenv("CONSUL_HTTP_TOKEN_FILE"); c.Token == "" && f != "" {
		// A regular file of bounded size only: a FIFO or device named
		// here fails at once instead of blocking the caller.
		b, _, err := regfile.Read(f, maxTokenFile)
		if err != nil {
			return fmt.Errorf("consul: ACL token ($CONSUL_HTTP_TOKEN_FILE): %w", err)
		}
		c.Token = strings.TrimSpace(string(b))
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.SessionTTL < time.Second {
		return fmt.Errorf("consul: session TTL %v below Consul's 1 s floor", c.SessionTTL)
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.WatchWait <= 0 {
		c.WatchWait = DefaultWatchWait
	}
	if c.Logf == nil {
		c.Logf = log.Printf
	}
	return nil
}

// ParseURI turns consul://host:port[/prefix][?ttl=10s&timeout=5s&wait=1m]
// into a Config.
func ParseURI(u *url.URL) (Config, error) {
	var c Config
	if u.Scheme != "consul" {
		return c, fmt.Errorf("consul: URI scheme %q, want consul", u.Scheme)
	}
	if u.User != nil {
		return c, fmt.Errorf("consul: %s: credentials do not belong in the URI; set CONSUL_HTTP_TOKEN", u.Redacted())
	}
	c.Address = u.Host
	c.Prefix = strings.Trim(u.Path, "/")
	for k, vs := range u.Query() {
		if len(vs) != 1 {
			return c, fmt.Errorf("consul: URI parameter %q given %d times", k, len(vs))
		}
		var dst *time.Duration
		switch k {
		case "ttl":
			dst = &c.SessionTTL
		case "timeout":
			dst = &c.RequestTimeout
		case "wait":
			dst = &c.WatchWait
		default:
			return c, fmt.Errorf("consul: unknown URI parameter %q (known: ttl, timeout, wait)", k)
		}
		d, err := time.ParseDuration(vs[0])
		if err != nil || d <= 0 {
			return c, fmt.Errorf("consul: URI parameter %s=%q: want a positive duration", k, vs[0])
		}
		*dst = d
	}
	return c, nil
}

// Open connects to Consul as a consul:// metadata URI says (ParseURI).
func Open(ctx context.Context, uri string) (*Store, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("consul: metadata %q: %w", uri, err)
	}
	c, err := ParseURI(u)
	if err != nil {
		return nil, err
	}
	return New(ctx, c)
}

// Store is a segment.Store backed by Consul.
type Store struct {
	cfg       Config
	keyPrefix string // <prefix>/segments/
	client    *api.Client
	kv        *api.KV
	tr        *http.Transport
	epoch     uint64
	me        process // written into the session's name (see owner.go)

	life context.Context // ends at Close
	kill context.CancelFunc
	kick chan struct{} // wakes the keeper early
	wg   sync.WaitGroup

	// pubMu serializes writes: Publish, Unpublish and the keeper's
	// re-publishing. owned is this store's desired state.
	pubMu sync.Mutex
	owned map[string]*owned

	mu        sync.Mutex
	closed    bool
	session   string
	gen       context.Context // ends when the session is replaced
	genCancel context.CancelFunc
	health    error
	cache     map[string]cached

	closeOnce sync.Once
	closeErr  error
}

// owned is one segment this store publishes.
type owned struct {
	val     []byte // encoded descriptor; nil: an Unpublish not yet applied
	since   time.Time
	index   uint64             // ModifyIndex of our last write; 0: not in Consul
	dirty   bool               // val is not (known to be) in Consul
	inDoubt bool               // a write's outcome is unknown (transport error)
	sent    []byte             // value of the last write sent
	unguard context.CancelFunc // ends the guard (see guard)
}

type cached struct {
	d     *segment.Descriptor
	since time.Time
}

// New connects to Consul and creates the store's session. It fails with
// segment.ErrUnavailable when Consul cannot be reached before ctx ends.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: cfg.RequestTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	client, err := api.NewClient(&api.Config{Address: cfg.Address, Scheme: "http", Token: cfg.Token, Transport: tr})
	if err != nil {
		return nil, fmt.Errorf("consul: client for %s: %w", cfg.Address, err)
	}
	var e [8]byte
	if _, err := rand.Read(e[:]); err != nil {
		return nil, fmt.Errorf("consul: epoch: %w", err)
	}
	s := &Store{
		cfg:       cfg,
		keyPrefix: cfg.Prefix + "/segments/",
		client:    client,
		kv:        client.KV(),
		tr:        tr,
		epoch:     binary.LittleEndian.Uint64(e[:]) | 1,
		me:        self(),
		kick:      make(chan struct{}, 1),
		owned:     map[string]*owned{},
		cache:     map[string]cached{},
	}
	s.life, s.kill = context.WithCancel(context.Background())
	s.gen, s.genCancel = context.WithCancel(s.life)

	cctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	sid, err := s.createSession(cctx)
	if err != nil {
		err = s.failure(ctx, "connect", err)
		s.kill()
		tr.CloseIdleConnections()
		return nil, err
	}
	s.session = sid
	s.wg.Add(1)
	go s.keep()
	return s, nil
}

// Epoch is the epoch this store stamps on descriptors published with
// Epoch 0.
func (s *Store) Epoch() uint64 { return s.epoch }

// Health returns nil while the store's background keeper reaches Consul,
// else the keeper's last error, which wraps segment.ErrUnavailable.
func (s *Store) Health() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

// Session returns the ID of the store's current Consul session, or "" while
// it has none (Consul unreachable).
func (s *Store) Session() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session
}

// Key returns the KV key that holds the named segment.
func (s *Store) Key(name string) string { return s.keyPrefix + url.PathEscape(name) }

// PublishedAt returns when the current incarnation of a cached segment was
// first published (as recorded by its owner), for display.
func (s *Store) PublishedAt(name string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cache[name]
	return c.since, ok && !c.since.IsZero()
}

func (s *Store) createSession(ctx context.Context) (string, error) {
	id, _, err := s.client.Session().Create(&api.SessionEntry{
		Name:      s.me.sessionName(),
		TTL:       s.cfg.SessionTTL.String(),
		Behavior:  api.SessionBehaviorDelete,
		LockDelay: time.Nanosecond, // ~0: a restarted owner re-acquires at once
	}, (&api.WriteOptions{}).WithContext(ctx))
	return id, err
}

// begin starts an operation: it fails once the store is closed, and returns
// a context bounded by RequestTimeout and by Close.
func (s *Store) begin(ctx context.Context) (context.Context, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, segment.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	stop := context.AfterFunc(s.life, cancel)
	return octx, func() { stop(); cancel(); s.wg.Done() }, nil
}

// failure classifies an error from a Consul request: the caller's context
// ending, the store closing, a refusal by Consul (4xx), or Consul being
// unreachable or unable to serve (segment.ErrUnavailable).
func (s *Store) failure(parent context.Context, what string, err error) error {
	if perr := parent.Err(); perr != nil {
		return fmt.Errorf("consul: %s: %w", what, perr)
	}
	if s.life.Err() != nil {
		return fmt.Errorf("consul: %s: %w", what, segment.ErrClosed)
	}
	var se api.StatusError
	if errors.As(err, &se) && se.Code >= 400 && se.Code < 500 {
		return fmt.Errorf("consul: %s: %s refused: %w", what, s.cfg.Address, err)
	}
	return fmt.Errorf("consul: %s: %w: %s: %v", what, segment.ErrUnavailable, s.cfg.Address, err)
}

func (s *Store) setHealth(err error) {
	s.mu.Lock()
	was := s.health
	s.health = err
	s.mu.Unlock()
	switch {
	case err != nil && was == nil:
		s.cfg.Logf("consul: lost contact with %s: %v", s.cfg.Address, err)
	case err == nil && was != nil:
		s.cfg.Logf("consul: %s reachable again", s.cfg.Address)
	}
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Store) q(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{}).WithContext(ctx)
}

func (s *Store) setCache(name string, d *segment.Descriptor, flags uint64) {
	var since time.Time
	if flags != 0 {
		since = time.UnixMilli(int64(flags))
	}
	s.mu.Lock()
	s.cache[name] = cached{d: d.Clone(), since: since}
	s.mu.Unlock()
}

func (s *Store) uncache(name string) {
	s.mu.Lock()
	delete(s.cache, name)
	s.mu.Unlock()
}

func (s *Store) decode(name string, p *api.KVPair) (*segment.Descriptor, error) {
	d, err := segment.Unmarshal(p.Value)
	if err != nil {
		return nil, fmt.Errorf("consul: key %s: %w", p.Key, err)
	}
	if d.Name != name {
		return nil, fmt.Errorf("%w: consul: key %s holds segment %q", segment.ErrInvalid, p.Key, d.Name)
	}
	return d, nil
}

// Publish makes d the current descriptor of d.Name, owned by this store. A
// descriptor with Epoch 0 gets the store's epoch. It fails with
// segment.ErrConflict when another store holds the name (this store then
// stops owning it). While it owns the name the store watches the key:
// when another writer that is not a store (a plain KV put or delete)
// changes or deletes it, the store logs that and writes its descriptor
// again.
// On segment.ErrUnavailable or a context error, d stays the desired state
// and is published when Consul answers; Unpublish withdraws it.
func (s *Store) Publish(ctx context.Context, d *segment.Descriptor) error {
	octx, done, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d = d.Clone()
	if d != nil && d.Epoch == 0 {
		d.Epoch = s.epoch
	}
	val, err := segment.Marshal(d)
	if err != nil {
		return fmt.Errorf("consul: publish: %w", err)
	}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	o := s.owned[d.Name]
	if o == nil {
		o = &owned{since: time.Now()}
		s.owned[d.Name] = o
		s.guardLocked(d.Name, o)
	}
	o.val, o.dirty = val, true
	sid := s.Session()
	if sid == "" {
		s.wake()
		return fmt.Errorf("consul: publish %s: %w: no session with %s yet; it will be published when Consul answers", d.Name, segment.ErrUnavailable, s.cfg.Address)
	}
	err = s.sync(octx, ctx, d.Name, o, sid)
	switch {
	case err == nil:
		s.setCache(d.Name, d, uint64(o.since.UnixMilli()))
	case errors.Is(err, segment.ErrConflict):
		s.disownLocked(d.Name)
	default:
		s.wake()
	}
	return err
}

// Unpublish removes a descriptor this store published; segment.ErrNotFound
// if it did not.
func (s *Store) Unpublish(ctx context.Context, name string) error {
	octx, done, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	o := s.owned[name]
	if o == nil || o.val == nil {
		return fmt.Errorf("consul: unpublish %s: %w (not published by this store)", name, segment.ErrNotFound)
	}
	s.uncache(name)
	sid := s.Session()
	if sid == "" || (o.index == 0 && !o.inDoubt) {
		// Never reached Consul, or its session (and with it the key) is gone.
		s.disownLocked(name)
		return nil
	}
	o.val, o.dirty = nil, true
	if err := s.sync(octx, ctx, name, o, sid); err != nil {
		s.wake()
		return fmt.Errorf("%w (it will be removed when Consul answers)", err)
	}
	return nil
}

// errSessionLost means Consul no longer knows the store's session.
var errSessionLost = errors.New("session expired")

// sync writes o's desired state to Consul under session sid. pubMu is held.
// On success o is clean (or, for an unpublish, removed from owned).
//
// A write rolled back because the key is in flux (a crashed owner's
// session being ended, a key vanishing under a create) is tried again
// after Consul's state has moved: a blocking query on the key's index
// waits for the change, so the loop neither spins nor gives up after a
// fixed number of tries on a busy machine. It is bounded by octx.
func (s *Store) sync(octx, parent context.Context, name string, o *owned, sid string) error {
	key := s.Key(name)
	tookOver := false
	var seen uint64 // the key's index when last read; 0: not read yet
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := s.awaitChange(octx, key, seen); err != nil {
				return s.failure(parent, "publish "+name, fmt.Errorf("key %s kept changing: %w", key, err))
			}
		}
		var ops api.KVTxnOps
		switch {
		case o.val == nil:
			ops = api.KVTxnOps{
				{Verb: api.KVCheckSession, Key: key, Session: sid},
				{Verb: api.KVDelete, Key: key},
			}
		case o.index == 0:
			ops = api.KVTxnOps{
				{Verb: api.KVCheckNotExists, Key: key},
				{Verb: api.KVLock, Key: key, Value: o.val, Flags: uint64(o.since.UnixMilli()), Session: sid},
			}
		default:
			ops = api.KVTxnOps{
				{Verb: api.KVCheckIndex, Key: key, Index: o.index},
				{Verb: api.KVLock, Key: key, Value: o.val, Flags: uint64(o.since.UnixMilli()), Session: sid},
			}
		}
		o.sent = o.val
		ok, resp, _, err := s.kv.Txn(ops, s.q(octx))
		if err != nil {
			o.inDoubt = true
			return s.failure(parent, "publish "+name, err)
		}
		if ok {
			if o.val == nil {
				s.disownLocked(name)
				return nil
			}
			for _, r := range resp.Results {
				if r != nil && r.Key == key && r.ModifyIndex > o.index {
					o.index = r.ModifyIndex
				}
			}
			o.dirty, o.inDoubt = false, false
			return nil
		}
		// Rolled back: look at the key to tell why.
		p, meta, err := s.kv.Get(key, s.q(octx))
		if err != nil {
			return s.failure(parent, "publish "+name, err)
		}
		seen = meta.LastIndex
		switch {
		case o.val == nil:
			if p == nil || p.Session != sid {
				s.disownLocked(name) // gone, or no longer ours to delete
				return nil
			}
		case p == nil:
			if o.index == 0 {
				// The key is absent now, yet the create was rolled back:
				// either our session is gone, or the key existed at the
				// time of the transaction and vanished since (a previous
				// owner's session ending). Ask Consul which.
				e, _, err := s.client.Session().Info(sid, s.q(octx))
				if err != nil {
					return s.failure(parent, "publish "+name, err)
				}
				if e != nil {
					// Session alive: the key existed when the
					// transaction ran and is gone now (or its lock
					// delay runs): try again once Consul's state moved.
					continue
				}
				s.dropSessionLocked(sid)
				return fmt.Errorf("consul: publish %s: %w: %w; re-registering", name, segment.ErrUnavailable, errSessionLost)
			}
			// Deleted under us (by another writer, or with our
			// session): create it afresh.
			s.cfg.Logf("consul: key %s of segment %s disappeared (this store wrote modify index %d); publishing it again", key, name, o.index)
			o.index = 0
			seen = 0
		case p.Session == sid && bytes.Equal(p.Value, o.sent):
			o.index = p.ModifyIndex // an earlier write of ours landed unseen
			seen = 0
		case p.Session != "" && p.Session != sid:
			holder := "session " + p.Session
			if e, _, err := s.client.Session().Info(p.Session, s.q(octx)); err == nil && e != nil {
				holder = fmt.Sprintf("%q, session %s, TTL %s", e.Name, e.ID, e.TTL)
				if prev, ok := parseSessionName(e.Name); ok && !tookOver && s.me.provesGone(prev) {
					// A crashed process of this machine (see owner.go):
					// end its session, which deletes the key, and retry.
					if _, err := s.client.Session().Destroy(e.ID, (&api.WriteOptions{}).WithContext(octx)); err != nil {
						return s.failure(parent, "publish "+name, err)
					}
					s.cfg.Logf("consul: %s was held by pid %d of this machine, which is gone; ended its session %s and took the key over", key, prev.pid, e.ID)
					tookOver = true
					o.index = 0
					continue // once the key has moved past the dead owner's index
				}
			}
			return fmt.Errorf("consul: publish %s: %w: key %s is held by another store (%s); if that process is gone, the key expires within twice its TTL (at once when it ran on this machine)", name, segment.ErrConflict, key, holder)
		default:
			// Changed by a writer that holds no session of its own on the
			// key (a plain KV put keeps our lock; a put after a delete
			// has none): no other store claims the name, so this store's
			// descriptor is written over it.
			s.cfg.Logf("consul: key %s of segment %s was changed by another writer (modify index %d, this store wrote %d); publishing this store's descriptor again", key, name, p.ModifyIndex, o.index)
			o.index = p.ModifyIndex
			seen = 0
		}
	}
}

// disownLocked forgets a segment this store no longer publishes and ends
// its guard. pubMu is held.
func (s *Store) disownLocked(name string) {
	if o := s.owned[name]; o != nil && o.unguard != nil {
		o.unguard()
	}
	delete(s.owned, name)
}

// guardLocked starts the guard of a segment this store has begun to own.
// pubMu is held, and so is an operation (begin), so Close has not begun
// waiting for the store's goroutines.
func (s *Store) guardLocked(name string, o *owned) {
	ctx, cancel := context.WithCancel(s.life)
	o.unguard = cancel
	s.wg.Add(1)
	go s.guard(ctx, name, o)
}

// guard watches the key of a segment this store owns with blocking
// queries: when another writer changes or deletes it, the segment is
// marked dirty and the keeper writes it again (sync logs what it found;
// a key now held by another store's session is given up instead).
func (s *Store) guard(ctx context.Context, name string, o *owned) {
	defer s.wg.Done()
	key := s.Key(name)
	const minRetry = 50 * time.Millisecond
	retry := minRetry
	var index uint64
	for {
		p, meta, err := s.kv.Get(key, (&api.QueryOptions{WaitIndex: index, WaitTime: s.cfg.WatchWait}).WithContext(ctx))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			index = 0 // the keeper reports the outage
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, 2*time.Second)
			continue
		}
		retry = minRetry
		if meta.LastIndex < index {
			index = 0 // the agent restarted
		} else {
			index = meta.LastIndex
		}
		s.pubMu.Lock()
		if s.owned[name] != o {
			s.pubMu.Unlock()
			return
		}
		if o.val != nil && !o.dirty && !o.inDoubt && o.index != 0 &&
			(p == nil && meta.LastIndex >= o.index || p != nil && p.ModifyIndex > o.index) {
			// Not a read from before our last write: someone else's.
			o.dirty = true
			s.wake()
		}
		s.pubMu.Unlock()
	}
}

// awaitChange waits for Consul's state to move on from what was last
// read of key (index seen): one blocking query, which returns as soon as
// the key's index passes seen, or after a short bound (a lock-delay or a
// rolled-back create changes no index). seen 0: no wait. ctx bounds it.
func (s *Store) awaitChange(ctx context.Context, key string, seen uint64) error {
	if seen == 0 {
		return ctx.Err()
	}
	q := &api.QueryOptions{WaitIndex: seen, WaitTime: settleWait}
	if d, ok := ctx.Deadline(); ok {
		q.WaitTime = min(q.WaitTime, max(time.Until(d), time.Millisecond))
	}
	_, _, err := s.kv.Get(key, q.WithContext(ctx))
	if err == nil {
		err = ctx.Err()
	}
	return err
}

// settleWait bounds one wait for a key in flux to settle.
const settleWait = 250 * time.Millisecond

// dropSessionLocked forgets a session Consul no longer knows: its keys are
// gone, so every owned segment must be written afresh. pubMu is held.
func (s *Store) dropSessionLocked(sid string) {
	s.mu.Lock()
	if s.session == sid {
		s.session = ""
	}
	s.mu.Unlock()
	for name, o := range s.owned {
		if o.val == nil {
			s.disownLocked(name)
			continue
		}
		o.index, o.dirty, o.inDoubt = 0, true, false
	}
	s.wake()
}

// keep is the keeper goroutine: it renews the session, replaces it when
// Consul has dropped it, and pushes owned segments not yet in Consul.
func (s *Store) keep() {
	defer s.wg.Done()
	renew := s.cfg.SessionTTL / 2
	const minRetry = 50 * time.Millisecond
	maxRetry := min(renew, 2*time.Second)
	retry := minRetry
	timer := time.NewTimer(renew)
	defer timer.Stop()
	for {
		select {
		case <-s.life.Done():
			return
		case <-timer.C:
		case <-s.kick:
		}
		ok, again := s.tend()
		next := renew
		switch {
		case again:
			next = 0
		case !ok:
			next, retry = retry, min(2*retry, maxRetry)
		default:
			retry = minRetry
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// tend does one round of the keeper's work. ok: Consul answered; again:
// run another round at once.
func (s *Store) tend() (ok, again bool) {
	ctx, cancel := context.WithTimeout(s.life, min(s.cfg.RequestTimeout, s.cfg.SessionTTL/2))
	defer cancel()
	sid := s.Session()
	if sid == "" {
		id, err := s.createSession(ctx)
		if err != nil {
			s.setHealth(s.failure(s.life, "create session", err))
			return false, false
		}
		s.mu.Lock()
		s.session = id
		// Blocking queries started under the old session restart from
		// index 0: the agent may have lost its state, and its indexes.
		s.genCancel()
		s.gen, s.genCancel = context.WithCancel(s.life)
		s.mu.Unlock()
		sid = id
		s.pubMu.Lock()
		n := len(s.owned)
		s.pubMu.Unlock()
		s.cfg.Logf("consul: new session %s with %s; re-publishing %d segments", id, s.cfg.Address, n)
	} else {
		entry, _, err := s.client.Session().Renew(sid, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil {
			s.setHealth(s.failure(s.life, "renew session", err))
			return false, false
		}
		if entry == nil {
			s.cfg.Logf("consul: session %s expired or was lost by %s; re-registering", sid, s.cfg.Address)
			s.pubMu.Lock()
			s.dropSessionLocked(sid)
			s.pubMu.Unlock()
			return true, true
		}
	}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	for name, o := range s.owned {
		if !o.dirty {
			continue
		}
		err := s.sync(ctx, s.life, name, o, sid)
		switch {
		case err == nil:
		case errors.Is(err, segment.ErrConflict):
			s.disownLocked(name)
			s.cfg.Logf("consul: segment %s lost: %v", name, err)
		case errors.Is(err, errSessionLost):
			return true, true
		default:
			s.setHealth(err)
			return false, false
		}
	}
	s.setHealth(nil)
	return true, false
}

// Get returns the current descriptor of a segment. While Consul is
// unreachable, a segment in the store's cache is answered from it (see the
// package doc); others fail with segment.ErrUnavailable.
func (s *Store) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	octx, done, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	s.mu.Lock()
	c, isCached := s.cache[name]
	down := s.health != nil
	s.mu.Unlock()
	if down && isCached {
		// Known outage: do not make the caller wait for a timeout.
		return c.d.Clone(), nil
	}
	p, _, err := s.kv.Get(s.Key(name), s.q(octx))
	if err != nil {
		err = s.failure(ctx, "get "+name, err)
		if isCached && errors.Is(err, segment.ErrUnavailable) {
			return c.d.Clone(), nil
		}
		return nil, err
	}
	if p == nil {
		s.uncache(name)
		return nil, fmt.Errorf("consul: get %s: %w", name, segment.ErrNotFound)
	}
	d, err := s.decode(name, p)
	if err != nil {
		return nil, err
	}
	s.setCache(name, d, p.Flags)
	return d, nil
}

// List returns every segment under the store's prefix, sorted by name.
// Keys that do not decode are skipped and logged.
func (s *Store) List(ctx context.Context) ([]*segment.Descriptor, error) {
	octx, done, err := s.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	pairs, _, err := s.kv.List(s.keyPrefix, s.q(octx))
	if err != nil {
		return nil, s.failure(ctx, "list", err)
	}
	out := make([]*segment.Descriptor, 0, len(pairs))
	seen := make(map[string]bool, len(pairs))
	var bad skipped
	for _, p := range pairs {
		name, err := url.PathUnescape(strings.TrimPrefix(p.Key, s.keyPrefix))
		if err != nil {
			bad.add(p.Key, err)
			continue
		}
		d, err := s.decode(name, p)
		if err != nil {
			bad.add(p.Key, err)
			continue
		}
		s.setCache(name, d, p.Flags)
		seen[name] = true
		out = append(out, d)
	}
	s.mu.Lock()
	for name := range s.cache {
		if !seen[name] {
			delete(s.cache, name)
		}
	}
	s.mu.Unlock()
	if bad.n > 0 {
		s.cfg.Logf("consul: list: skipped %s", &bad)
	}
	slices.SortFunc(out, func(a, b *segment.Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// skipped summarizes the keys a List could not read in one log line: how
// many, the first few (quoted, so a key cannot carry control characters
// to a terminal) and the first error.
type skipped struct {
	n     int
	keys  []string
	first error
}

// skippedShown is how many keys a summary names.
const skippedShown = 3

func (k *skipped) add(key string, err error) {
	if k.n == 0 {
		k.first = err
	}
	k.n++
	if len(k.keys) < skippedShown {
		k.keys = append(k.keys, key)
	}
}

func (k *skipped) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d unreadable keys:", k.n)
	for _, key := range k.keys {
		b.WriteByte(' ')
		b.WriteString(quoteCapped(key))
	}
	if k.n > len(k.keys) {
		fmt.Fprintf(&b, " and %d more", k.n-len(k.keys))
	}
	fmt.Fprintf(&b, " (first: %s)", quoteCapped(k.first.Error()))
	return b.String()
}

// quoteCapped quotes s (escaping control characters) after cutting it to
// at most 200 bytes, saying how many were cut.
func quoteCapped(s string) string {
	const max = 200
	if len(s) <= max {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s…(%d bytes cut)", strconv.Quote(strings.ToValidUTF8(s[:max], "")), len(s)-max)
}

// Watch reports a segment's state with blocking queries: first its state
// when Watch starts (the descriptor, or nil when absent), then each
// descriptor whose Epoch or Version differs from the last report, or nil
// once it is gone. While Consul is unreachable it reports nothing; after
// Consul comes back (possibly empty, after a restart) it waits up to
// 2×SessionTTL+RequestTimeout for the owner to re-register before reporting
// the segment gone, so live segments do not flap. The channel is closed when
// ctx ends or the store is closed.
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
		s.watch(ctx, name, rep)
	}), nil
}

func (s *Store) watch(ctx context.Context, name string, rep *segment.WatchReport) {
	key := s.Key(name)
	var (
		index uint64
		// After Consul failed or restarted, an absent key is not reported
		// gone before graceUntil: a live owner re-registers by then.
		disrupted  bool
		graceUntil time.Time
	)
	grace := 2*s.cfg.SessionTTL + s.cfg.RequestTimeout
	const minRetry = 50 * time.Millisecond
	retry := minRetry
	for {
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		qctx, qcancel := context.WithCancel(ctx)
		gstop := context.AfterFunc(gen, qcancel)
		wait := s.cfg.WatchWait
		if r := time.Until(graceUntil); r > 0 && r < wait {
			wait = r + 10*time.Millisecond // wake when the grace ends
		}
		p, meta, err := s.kv.Get(key, (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(qctx))
		gstop()
		qcancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			index, disrupted = 0, true
			if gen.Err() == nil { // a failure, not a new session
				select {
				case <-ctx.Done():
					return
				case <-time.After(retry):
				}
				retry = min(2*retry, 2*time.Second)
			}
			continue
		}
		retry = minRetry
		if meta.LastIndex < index {
			index, disrupted = 0, true // the agent's index went backwards: it restarted
		} else {
			index = meta.LastIndex
		}
		if disrupted {
			disrupted, graceUntil = false, time.Now().Add(grace)
		}
		var cur *segment.Descriptor
		if p != nil {
			d, err := s.decode(name, p)
			if err != nil {
				s.cfg.Logf("consul: watch %s: %v", name, err)
				continue
			}
			cur = d
			s.setCache(name, d, p.Flags)
		} else {
			s.uncache(name)
		}
		if !rep.Changed(cur) || cur == nil && rep.Reported() && time.Now().Before(graceUntil) {
			continue
		}
		if !rep.Send(ctx, cur.Clone()) {
			return
		}
	}
}

// Close destroys the store's session, which deletes every key it holds,
// ends all watches and waits for its goroutines. It is idempotent. When
// Consul cannot be reached it still releases everything and reports
// segment.ErrUnavailable: the keys then vanish when the session's TTL runs
// out. It is safe on a nil Store.
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.kill()
		s.wg.Wait()
		if sid := s.Session(); sid != "" {
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
			if _, err := s.client.Session().Destroy(sid, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
				s.closeErr = fmt.Errorf("consul: close: destroy session %s: %w: %v (its keys expire with its TTL)", sid, segment.ErrUnavailable, err)
			}
			cancel()
		}
		s.tr.CloseIdleConnections()
	})
	return s.closeErr
}
