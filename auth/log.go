package auth

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// FailureLog logs failed handshakes with the peer's address, at most one
// line per interval: a flood of bad peers cannot flood the log. The lines
// it drops are counted in the next one. Safe for concurrent use.
type FailureLog struct {
	log   *slog.Logger
	proto string
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// DefaultLogInterval is FailureLog's interval when none is given.
const DefaultLogInterval = time.Second

// NewFailureLog returns a FailureLog writing to log (nil: discarded) for
// handshakes of proto; every <= 0 selects DefaultLogInterval.
func NewFailureLog(log *slog.Logger, proto string, every time.Duration) *FailureLog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = DefaultLogInterval
	}
	return &FailureLog{log: log, proto: proto, every: every}
}

// Failed records a failed handshake with peer; it reports whether a line
// was written.
func (f *FailureLog) Failed(peer net.Addr, err error) bool {
	now := time.Now()
	f.mu.Lock()
	if !f.last.IsZero() && now.Sub(f.last) < f.every {
		f.dropped++
		f.mu.Unlock()
		return false
	}
	dropped := f.dropped
	f.last, f.dropped = now, 0
	f.mu.Unlock()
	addr := "?"
	if peer != nil {
		addr = peer.String()
	}
	f.log.Warn("te: handshake failed: "+failure(err), "proto", f.proto, "peer", addr, "err", err, "not_logged_since_last", dropped)
	return true
}

// failure says what a failed handshake's error means: only ErrDenied is
// a failed authentication; a silent, closed or reset connection is not.
func failure(err error) string {
	switch {
	case errors.Is(err, ErrDenied):
		return "peer failed authentication"
	case errors.Is(err, ErrMessage):
		return "malformed handshake message"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "peer sent no handshake in time"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "peer closed the connection"
	}
	return "connection failed (reset, or a protocol error)"
}

// WarnUnauthenticated logs one warning when a listener of proto at addr
// takes connections from other hosts without a secret: anyone who reaches
// it may use it. Loopback listeners, and any listener with a secret, log
// nothing. It reports whether it warned.
func WarnUnauthenticated(log *slog.Logger, proto string, addr net.Addr, s *Secret) bool {
	if s != nil || log == nil {
		return false
	}
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsLoopback() {
		return false
	}
	log.Warn("te: listening on a non-loopback address without authentication: anyone who reaches it may connect; set --auth-file or $"+EnvFile,
		"proto", proto, "listen", addr.String())
	return true
}
