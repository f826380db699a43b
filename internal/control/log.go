package control

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/ratelog"
)

// Log records a target's failed handshakes with the peer's address and
// what happened (failed authentication, not te, closed, timed out, ...),
// at most one line per interval: a flood of bad peers cannot flood the
// log. The failures it does not write are counted in the next line.
// Handshakes that failed because this side closed the connection, or
// because the initiator addressed a previous incarnation (it restarted),
// are not failures. Safe for concurrent use.
type Log struct {
	rl    *ratelog.Log
	label string
}

// DefaultLogInterval is a Log's interval when none is given.
const DefaultLogInterval = time.Second

// NewLog returns a Log writing to log (nil: discarded) for the handshakes
// of the protocol label; every <= 0 selects DefaultLogInterval.
func NewLog(log *slog.Logger, label string, every time.Duration) *Log {
	if every <= 0 {
		every = DefaultLogInterval
	}
	return &Log{rl: ratelog.New(log, every), label: label}
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
	addr := "?"
	if peer != nil {
		addr = peer.String()
	}
	return l.rl.Log(level, "te: "+l.label+": "+what, "peer", addr, "reason", err.Error())
}
