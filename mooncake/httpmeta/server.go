package httpmeta

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/segment"
)

// Backend keeps a metadata server's keys. Get returns an error wrapping
// segment.ErrNotFound for a missing key; other errors make the server
// answer 503.
type Backend interface {
	Get(ctx context.Context, key string) ([]byte, error)
	Put(ctx context.Context, key string, value []byte) error
	Delete(ctx context.Context, key string) error
}

// Memory is the embedded Backend: keys in this process's memory.
type Memory struct {
	mu sync.RWMutex
	m  map[string][]byte
}

// Get returns a copy of key's value.
func (m *Memory) Get(_ context.Context, key string) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	v, ok := m.m[key]
	if !ok {
		return nil, fmt.Errorf("%w: %q", segment.ErrNotFound, key)
	}
	return append([]byte(nil), v...), nil
}

// Put sets key to a copy of value.
func (m *Memory) Put(_ context.Context, key string, value []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[string][]byte{}
	}
	m.m[key] = append([]byte(nil), value...)
	return nil
}

// Delete removes key.
func (m *Memory) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
	return nil
}

// Consul is a Backend on Consul's KV store, for metadata that outlives
// and is shared by several `te metadata serve` processes: every key lives
// under Prefix/.
type Consul struct {
	kv     *api.KV
	prefix string
}

// NewConsul returns a Backend on the agent at addr (host:port), keys under
// prefix. The ACL token comes from $CONSUL_HTTP_TOKEN (or
// $CONSUL_HTTP_TOKEN_FILE), as for te's Consul segment store.
func NewConsul(addr, prefix string) (*Consul, error) {
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		return nil, errors.New("httpmeta: consul backend needs a key prefix")
	}
	cfg := api.DefaultConfig() // reads CONSUL_HTTP_TOKEN(_FILE)
	cfg.Address = addr
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: consul %s: %w", addr, err)
	}
	return &Consul{kv: c.KV(), prefix: prefix + "/"}, nil
}

// Get reads key.
func (c *Consul) Get(ctx context.Context, key string) ([]byte, error) {
	p, _, err := c.kv.Get(c.prefix+key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("%w: httpmeta: consul get %q: %w", segment.ErrUnavailable, key, err)
	}
	if p == nil {
		return nil, fmt.Errorf("%w: %q", segment.ErrNotFound, key)
	}
	return p.Value, nil
}

// Put writes key.
func (c *Consul) Put(ctx context.Context, key string, value []byte) error {
	if _, err := c.kv.Put(&api.KVPair{Key: c.prefix + key, Value: value}, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("%w: httpmeta: consul put %q: %w", segment.ErrUnavailable, key, err)
	}
	return nil
}

// Delete removes key.
func (c *Consul) Delete(ctx context.Context, key string) error {
	if _, err := c.kv.Delete(c.prefix+key, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("%w: httpmeta: consul delete %q: %w", segment.ErrUnavailable, key, err)
	}
	return nil
}

// MaxKey bounds a key's length.
const MaxKey = 4096

// DefaultPath is where Mooncake's example server answers.
const DefaultPath = "/metadata"

// Handler serves Mooncake's HTTP metadata protocol at path over b: GET
// answers 200 with the value or 404 "metadata not found", PUT stores the
// body (at most MaxValue bytes, else 413) and answers 200 "metadata
// updated", DELETE answers 200 "metadata deleted"; a request without a key
// gets 400, another method 405, a backend failure 503.
func Handler(b Backend, path string, log *slog.Logger) http.Handler {
	if path == "" {
		path = DefaultPath
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.Error(w, "not found: the metadata endpoint is "+path, http.StatusNotFound)
			return
		}
		key := r.URL.Query().Get("key")
		if key == "" || len(key) > MaxKey {
			http.Error(w, fmt.Sprintf("invalid request: want ?key=<key of 1 to %d bytes>", MaxKey), http.StatusBadRequest)
			return
		}
		reply := func(code int, body []byte) {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(code)
			w.Write(body)
		}
		fail := func(err error) {
			log.Warn("te metadata: backend failed", "method", r.Method, "key", key, "err", err)
			http.Error(w, "metadata backend unavailable", http.StatusServiceUnavailable)
		}
		switch r.Method {
		case http.MethodGet:
			v, err := b.Get(r.Context(), key)
			switch {
			case errors.Is(err, segment.ErrNotFound):
				reply(http.StatusNotFound, []byte("metadata not found"))
			case err != nil:
				fail(err)
			default:
				reply(http.StatusOK, v)
			}
		case http.MethodPut:
			v, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxValue))
			if err != nil {
				var mb *http.MaxBytesError
				if errors.As(err, &mb) {
					http.Error(w, fmt.Sprintf("value larger than %d bytes", MaxValue), http.StatusRequestEntityTooLarge)
				} else {
					http.Error(w, "invalid request: "+err.Error(), http.StatusBadRequest)
				}
				return
			}
			if err := b.Put(r.Context(), key, v); err != nil {
				fail(err)
				return
			}
			reply(http.StatusOK, []byte("metadata updated"))
		case http.MethodDelete:
			if err := b.Delete(r.Context(), key); err != nil {
				fail(err)
				return
			}
			reply(http.StatusOK, []byte("metadata deleted"))
		default:
			w.Header().Set("Allow", "GET, PUT, DELETE")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		}
	})
}

// ServerOptions configure Serve.
type ServerOptions struct {
	// Listen is the address, host:port. Default 127.0.0.1:8080.
	Listen string
	// Path is the endpoint's path. Default DefaultPath.
	Path string
	// Backend keeps the keys. Default a new Memory.
	Backend Backend
	// MaxConns bounds the connections served at once; further ones are
	// closed on accept. Default 1024.
	MaxConns int
	// Logger receives warnings. Nil discards them.
	Logger *slog.Logger
}

// Server is a running metadata server.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error
}

// Serve starts a Mooncake-compatible metadata server. Every read, write
// and idle period of a connection is bounded; a listener on a non-loopback
// address logs one warning (the protocol has no authentication).
func Serve(ctx context.Context, o ServerOptions) (*Server, error) {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:8080"
	}
	if o.Backend == nil {
		o.Backend = &Memory{}
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("te metadata: listen: %w", err)
	}
	mooncake.WarnExposed(o.Logger, "the HTTP metadata server", ln.Addr())
	s := &Server{
		ln: &limitListener{Listener: ln, sem: make(chan struct{}, o.MaxConns)},
		srv: &http.Server{
			Handler:           Handler(o.Backend, o.Path, o.Logger),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
		},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(s.ln) }()
	return s, nil
}

// Addr is the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is the metadata URL clients use, for path.
func (s *Server) URL(path string) string {
	if path == "" {
		path = DefaultPath
	}
	return "http://" + s.ln.Addr().String() + path
}

// Close stops the server at once. It is idempotent and safe on a nil
// Server.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	s.srv.Close()
	err := <-s.done
	s.done <- err
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting and waits (until ctx ends) for requests in
// progress.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	e := <-s.done
	s.done <- e
	return err
}

// limitListener closes connections beyond its capacity on accept, so a
// flood of idle connections costs the server nothing but the accept.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			c.Close()
		}
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
