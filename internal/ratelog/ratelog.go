// Package ratelog writes warnings that a peer can provoke at most once per
// interval, counting the lines it drops in the next one: a flood of bad
// or dying peers costs a line a second, not one per connection.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Log is a rate-limited warning log. The zero value is not usable: use New.
// Safe for concurrent use.
type Log struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time // time.Now; tests step a clock instead

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// New returns a Log writing to log (nil: discarded) at most once per
// every (<= 0: one second).
func New(log *slog.Logger, every time.Duration) *Log {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if every <= 0 {
		every = time.Second
	}
	return &Log{log: log, every: every, now: time.Now}
}

// SetClock replaces time.Now for l, so a test can step time instead of
// sleeping past the interval. Only before l is shared.
func (l *Log) SetClock(now func() time.Time) { l.now = now }

// Warn writes msg with args at Warn level, plus the count of lines
// dropped since the last one, unless a line was written less than the
// interval ago. It reports whether it wrote.
func (l *Log) Warn(msg string, args ...any) bool {
	return l.Log(slog.LevelWarn, msg, args...)
}

// Log writes msg with args at level, as Warn does at Warn level; every
// level shares the one interval.
func (l *Log) Log(level slog.Level, msg string, args ...any) bool {
	now := l.now()
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.dropped++
		l.mu.Unlock()
		return false
	}
	dropped := l.dropped
	l.last, l.dropped = now, 0
	l.mu.Unlock()
	l.log.Log(context.Background(), level, msg, append(args, "not_logged_since_last", dropped)...)
	return true
}
