// Package acceptor is how every server in te (the TCP and RDMA
// transports' targets, the shm transport, the p2p store) takes
// connections: Run is the accept loop (a failure that leaves the listener
// usable backs off instead of spinning or giving up, and is logged at most
// once a second) and Gate the admission policy (total and per-source
// bounds; at a bound, the connection that has waited longest makes room).
package acceptor

import (
	"errors"
	"log/slog"
	"net"
	"time"
)

// Backoff bounds after a failed accept: it starts at BackoffMin and
// doubles up to BackoffMax while accepts keep failing.
const (
	BackoffMin = 5 * time.Millisecond
	BackoffMax = time.Second
)

// Run calls accept until the listener is closed (accept's error matches
// net.ErrClosed) or stop is closed, and hands every connection to handle
// on the calling goroutine. Other errors (EMFILE, ENFILE, ENOMEM,
// ECONNABORTED: the listener is fine, the process or the peer is not)
// back off: giving up would leave the port open with nobody accepting,
// so every client would wait out its own timeout. name and addr label the
// warning; stop may be nil.
func Run[C any](log *slog.Logger, name string, addr net.Addr, stop <-chan struct{}, accept func() (C, error), handle func(C)) {
	var (
		backoff  time.Duration
		lastWarn time.Time
		quiet    int // failures not logged since lastWarn
	)
	for {
		c, err := accept()
		if err == nil {
			backoff = 0
			handle(c)
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		select {
		case <-stop:
			return
		default:
		}
		backoff = min(max(2*backoff, BackoffMin), BackoffMax)
		if now := time.Now(); now.Sub(lastWarn) >= time.Second {
			log.Warn(name+": accept failed; backing off", "listen", addr, "err", err, "retry_in", backoff, "not_logged_since_last", quiet)
			lastWarn, quiet = now, 0
		} else {
			quiet++
		}
		t := time.NewTimer(backoff)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}
