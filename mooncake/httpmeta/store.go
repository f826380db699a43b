package httpmeta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// Options configure a Store.
type Options struct {
	// URL is the metadata server, http(s)://host:port/path. Required.
	URL string
	// ClusterID is Mooncake's MC_METADATA_CLUSTER_ID: keys live under
	// mooncake/<ClusterID>/. Default none.
	ClusterID string
	// RPCHost and RPCPort are published as the local segment's rpc_meta:
	// Mooncake initiators send TCP data to RPCHost (at the descriptor's
	// tcp_data_port) and RDMA handshakes to RPCHost:RPCPort. Default host:
	// that of the Mooncake TCP endpoint; default port: that of the
	// Mooncake RDMA transport's handshake socket (the endpoint of its
	// mooncake-rdma entry, with its host), else 0 (no handshake socket).
	RPCHost string
	RPCPort uint16
	// PollInterval, Grace and CacheTTL work as in the p2p stores: Watch
	// polls every PollInterval (default 1 s) and reports a segment gone
	// after Grace (default 3 × PollInterval) without an answer; List
	// holds descriptors fetched within CacheTTL (default 1 min).
	PollInterval, Grace, CacheTTL time.Duration
	// HTTP overrides the HTTP client (Mooncake's timeouts by default).
	HTTP *http.Client
}

// Store is a segment.Store on a Mooncake HTTP metadata server. Publish
// writes te's descriptor translated to Mooncake's format (it must offer the
// Mooncake TCP transport) and its rpc_meta; Get reads a segment's
// descriptor and rpc_meta and translates them to te's. The server has no
// listing: List returns what this Store published or fetched. Close
// removes what it published.
type Store struct {
	opts     Options
	c        *Client
	versions mooncake.Versions

	life context.Context
	kill context.CancelFunc
	once sync.Once
	wg   sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	published map[string]*segment.Descriptor
	cache     map[string]cachedDesc
}

type cachedDesc struct {
	d  *segment.Descriptor
	at time.Time
}

var _ segment.Store = (*Store)(nil)

// Open opens http(s)://host:port/path[?cluster_id=ID]: Mooncake's
// metadata URL, with the cluster id (default $MC_METADATA_CLUSTER_ID) as a
// query parameter that is not sent to the server. segment/stores opens
// http:// and https:// URIs with it.
func Open(ctx context.Context, uri string) (*Store, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: metadata %q: %w", uri, err)
	}
	o := Options{ClusterID: os.Getenv(EnvClusterID)}
	for k, v := range u.Query() {
		switch k {
		case "cluster_id":
			o.ClusterID = v[len(v)-1]
		default:
			return nil, fmt.Errorf("httpmeta: metadata %q: unknown parameter %q (known: cluster_id)", u.Redacted(), k)
		}
	}
	c := *u
	c.RawQuery = ""
	o.URL = c.String()
	return New(ctx, o)
}

// New returns a Store for opts.URL. It does not contact the server.
func New(_ context.Context, opts Options) (*Store, error) {
	c, err := NewClient(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.HTTP != nil {
		c.HTTP = opts.HTTP
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	if opts.Grace <= 0 {
		opts.Grace = 3 * opts.PollInterval
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = time.Minute
	}
	s := &Store{opts: opts, c: c, published: map[string]*segment.Descriptor{}, cache: map[string]cachedDesc{}}
	s.life, s.kill = context.WithCancel(context.Background())
	return s, nil
}

// Client is the Store's HTTP client.
func (s *Store) Client() *Client { return s.c }

// Publish writes d as a Mooncake descriptor under its segment key, and the
// rpc_meta of d.Name. A descriptor that offers no Mooncake protocol is
// kept in List but not written.
func (s *Store) Publish(ctx context.Context, d *segment.Descriptor) error {
	if err := s.open(); err != nil {
		return err
	}
	md, err := mooncake.FromTE(d, mooncake.FromOptions{})
	if errors.Is(err, mooncake.ErrNoProtocol) {
		// Nothing a Mooncake peer could use (an engine's first descriptor,
		// before its transports are installed): keep it, publish nothing,
		// and remove what an earlier descriptor published.
		s.mu.Lock()
		_, was := s.published[d.Name]
		s.published[d.Name] = d.Clone()
		s.mu.Unlock()
		if was {
			if err := s.remove(ctx, d.Name); err != nil && !errors.Is(err, segment.ErrNotFound) {
				return err
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("httpmeta: publish: %w", err)
	}
	body, err := mooncake.Encode(md)
	if err != nil {
		return fmt.Errorf("httpmeta: publish: %w", err)
	}
	host, port := s.opts.RPCHost, s.opts.RPCPort
	if host == "" {
		p, _ := d.Protocol(mooncake.TEProtoTCP)
		host, _, _ = net.SplitHostPort(p.Endpoint)
	}
	// The Mooncake RDMA transport's handshake socket, where it has one of
	// its own, is the rpc_meta Mooncake initiators set up endpoints on.
	if p, ok := d.Protocol(mooncake.TEProtoRDMA); ok && port == 0 {
		if h, ps, err := net.SplitHostPort(p.Endpoint); err == nil {
			if n, err := strconv.ParseUint(ps, 10, 16); err == nil && n != 0 {
				port = uint16(n)
				if s.opts.RPCHost == "" {
					host = h
				}
			}
		}
	}
	meta, _ := json.Marshal(RPCMeta{IPOrHostName: host, RPCPort: port})
	if err := s.c.Put(ctx, SegmentKey(s.opts.ClusterID, d.Name), body); err != nil {
		return err
	}
	if err := s.c.Put(ctx, RPCMetaKey(s.opts.ClusterID, d.Name), meta); err != nil {
		return err
	}
	s.mu.Lock()
	s.published[d.Name] = d.Clone()
	s.mu.Unlock()
	return nil
}

// Unpublish deletes a segment's descriptor and rpc_meta.
func (s *Store) Unpublish(ctx context.Context, name string) error {
	if err := s.open(); err != nil {
		return err
	}
	s.mu.Lock()
	_, ok := s.published[name]
	delete(s.published, name)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: httpmeta: unpublish %q: not published here", segment.ErrNotFound, name)
	}
	return s.remove(ctx, name)
}

func (s *Store) remove(ctx context.Context, name string) error {
	return errors.Join(s.c.Delete(ctx, SegmentKey(s.opts.ClusterID, name)), s.c.Delete(ctx, RPCMetaKey(s.opts.ClusterID, name)))
}

func (s *Store) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return segment.ErrClosed
	}
	return nil
}

// Get reads a segment's descriptor and, for where its data goes, its
// rpc_meta (without one, the host part of the name).
func (s *Store) Get(ctx context.Context, name string) (*segment.Descriptor, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	body, err := s.c.Get(ctx, SegmentKey(s.opts.ClusterID, name))
	if err != nil {
		if s.life.Err() != nil {
			return nil, segment.ErrClosed
		}
		return nil, err
	}
	md, err := mooncake.Decode(body)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: get %s: %w", name, err)
	}
	to := mooncake.ToOptions{Name: name}
	server := name
	if md.RDMAServerName != "" {
		server = md.RDMAServerName
	}
	switch b, err := s.c.Get(ctx, RPCMetaKey(s.opts.ClusterID, server)); {
	case err == nil:
		var m RPCMeta
		if err := json.Unmarshal(b, &m); err != nil || m.IPOrHostName == "" {
			return nil, fmt.Errorf("%w: httpmeta: rpc_meta of %s: want {\"ip_or_host_name\":..., \"rpc_port\":...}, got %.100q", mooncake.ErrInvalid, server, b)
		}
		to.DataHost = m.IPOrHostName
		to.RPCAddr = net.JoinHostPort(m.IPOrHostName, strconv.Itoa(int(m.RPCPort)))
	case errors.Is(err, segment.ErrNotFound):
	default:
		return nil, err
	}
	d, err := mooncake.ToTE(md, to)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: get %s: %w", name, err)
	}
	s.versions.Stamp(d)
	s.mu.Lock()
	s.cache[name] = cachedDesc{d: d.Clone(), at: time.Now()}
	s.mu.Unlock()
	return d, nil
}

// List returns the descriptors this Store published and those it fetched
// within CacheTTL (the HTTP protocol cannot enumerate keys).
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
	for _, d := range s.published {
		out = append(out, d.Clone())
	}
	now := time.Now()
	for name, c := range s.cache {
		if now.Sub(c.at) > s.opts.CacheTTL {
			delete(s.cache, name)
		} else if _, mine := s.published[name]; !mine {
			out = append(out, c.d.Clone())
		}
	}
	slices.SortFunc(out, func(a, b *segment.Descriptor) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Watch polls the segment every PollInterval and reports changes of epoch
// or version, nil at once when the server answers 404 and after Grace when
// it cannot be reached.
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
			case err == nil || errors.Is(err, segment.ErrNotFound):
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

// Close removes what this Store published (within DefaultTimeout each)
// and ends every Watch. It is idempotent and safe on a nil Store.
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	var err error
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		names := make([]string, 0, len(s.published))
		for n := range s.published {
			names = append(names, n)
		}
		clear(s.published)
		s.mu.Unlock()
		s.kill()
		for _, n := range names {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
			err = errors.Join(err, s.remove(ctx, n))
			cancel()
		}
	})
	s.wg.Wait()
	return err
}
