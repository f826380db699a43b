package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdmago/te/auth"
)

// Log records a target's failed handshakes with the peer's address and
// what happened (failed authentication, not te, closed, timed out, ...),
// at most one line per interval: a flood of bad peers cannot flood the
// log. The failures it does not write are counted in the next line.
// Handshakes that failed because this side closed the connection, or
// because the initiator addressed a previous incarnation (it restarted),
// are not failures. Safe for concurrent use.
type Log struct {
	log   *slog.Logger
	label string
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// DefaultLogInterval is a Log's interval when none is given.
const DefaultLogInterval = time.Second

// NewLog returns a Log writing to log (nil: discarded) for the handshakes
// of the protocol label; every <= 0 selects DefaultLogInterval.
func NewLog(log *slog.Logger, label string, every time.Duration) *Log {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = DefaultLogInterval
	}
	return &Log{log: log, label: label, every: every}
}

// What says what a handshake error means, for a log line, and the level
// it deserves; ok is false for errors that are no peer's failure.
func What(err error) (what string, level slog.Level, ok bool) {
	switch {
	case err == nil, errors.Is(err, net.ErrClosed), errors.Is(err, ErrStale):
		return "", 0, false
	case errors.Is(err, auth.ErrWrongTarget):
		return "refused a peer that addressed another segment", slog.LevelWarn, true
	case errors.Is(err, auth.ErrDenied):
		return "peer failed authentication", slog.LevelWarn, true
	case errors.Is(err, auth.ErrNotTE):
		return "peer does not speak te", slog.LevelWarn, true
	case errors.Is(err, ErrMalformed):
		return "peer broke the handshake protocol", slog.LevelWarn, true
	case errors.Is(err, ErrRefused):
		return "refused a peer", slog.LevelInfo, true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "peer timed out in the handshake", slog.LevelInfo, true
	case errors.Is(err, ErrClosed):
		return "peer closed the connection during the handshake", slog.LevelInfo, true
	}
	return "handshake failed", slog.LevelWarn, true
}

// Failed records a failed handshake with peer; it reports whether a line
// was written.
func (l *Log) Failed(peer net.Addr, err error) bool {
	what, level, ok := What(err)
	if !ok {
		return false
	}
	now := time.Now()
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.dropped++
		l.mu.Unlock()
		return false
	}
	dropped := l.dropped
	l.last, l.dropped = now, 0
	l.mu.Unlock()
	addr := "?"
	if peer != nil {
		addr = peer.String()
	}
	l.log.Log(context.Background(), level, "te: "+l.label+": "+what, "peer", addr, "reason", err.Error(), "not_logged_since_last", dropped)
	return true
}
