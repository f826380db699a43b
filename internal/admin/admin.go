// Package admin is the operator's HTTP endpoint of te serve and te bench
// (--admin ADDR): /metrics for Prometheus, /debug/te with the engine's
// Snapshot as JSON, and the Go profiler under /debug/pprof/.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/metrics"
)

// Server serves one engine's admin endpoints until Close.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// Start listens on addr (host:port; port 0 picks one) and serves e. A
// listener on other than a loopback address is logged as a warning: the
// profiler and the snapshot tell anyone who can reach it about the
// process and its peers.
func Start(addr string, e *engine.Engine, log *slog.Logger) (*Server, error) {
	mh, err := metrics.Handler(e)
	if err != nil {
		return nil, fmt.Errorf("admin: metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", mh)
	mux.HandleFunc("GET /debug/te", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(e.Snapshot())
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "te admin: %s\n/metrics      Prometheus metrics\n/debug/te     the engine's snapshot (JSON)\n/debug/pprof/ Go profiles\n", e.Name())
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s: %w (--admin wants host:port, e.g. 127.0.0.1:9100)", addr, err)
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && log != nil && !ta.IP.IsLoopback() {
		log.Warn("admin: listening beyond loopback: metrics, snapshot and profiler are open to whoever reaches it", "addr", ln.Addr().String())
	}
	s := &Server{ln: ln, done: make(chan error, 1),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, waiting up to a second for requests in
// progress (a CPU profile is cut short). It is idempotent and safe on a
// nil Server.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		s.done <- serr
		return serr
	}
	s.done <- nil
	return err
}
