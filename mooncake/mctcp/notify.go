package mctcp

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/mooncake"
	"github.com/rdmago/te/mooncake/p2p"
	"github.com/rdmago/te/segment"
)

// Notifications travel as Mooncake sends them: once every request of the
// submission has completed (a v2 WRITE completes when the target's status
// word says the payload is in its memory), a Notify message goes to the
// target's handshake socket, one connection per notification; the
// target's getNotifies (or, for te, engine.Notifications) returns it.
// The data lanes carry none of it, so a notification costs a connection,
// not a request's worth of lane time.

var _ driver.Notifier = (*Transport)(nil)

// noteWait is one notification waiting for its submission's slices.
type noteWait struct {
	n    *driver.Note
	addr string // the target's handshake socket
	left atomic.Int64
	bad  atomic.Bool
}

// SubmitNotify implements driver.Notifier: it submits ss and, once every
// one of them has completed, sends n to the target's handshake socket.
func (t *Transport) SubmitNotify(ss []*driver.Slice, n *driver.Note) {
	addr := handshakeAddr(n.Remote)
	if len(ss) == 0 {
		t.sendNote(n, addr)
		return
	}
	w := &noteWait{n: n, addr: addr}
	w.left.Store(int64(len(ss)))
	t.notes.Add(1)
	for _, s := range ss {
		t.noteOf.Store(s, w)
	}
	t.Submit(ss)
}

// finish completes s, then counts it down in its notification, if any.
// A retry the engine submits from inside Done is no longer counted: the
// notification's first outcome is then transient, and the engine sends
// it alone (SubmitNotify with no slices) once the retries succeeded.
func (t *Transport) finish(s *driver.Slice, n uint64, err error) {
	var w *noteWait
	if t.notes.Load() > 0 {
		if v, ok := t.noteOf.LoadAndDelete(s); ok {
			w = v.(*noteWait)
		}
	}
	s.Done(n, err)
	if w == nil {
		return
	}
	if err != nil {
		w.bad.Store(true)
	}
	if w.left.Add(-1) != 0 {
		return
	}
	t.notes.Add(-1)
	if w.bad.Load() {
		w.n.Done(fmt.Errorf("mctcp: notification held back: a request of its submission failed (it is sent once the retries complete): %w", driver.ErrTransient))
		return
	}
	t.sendNote(w.n, w.addr)
}

// sendNote sends n on its own goroutine (finish runs on a lane's).
func (t *Transport) sendNote(n *driver.Note, addr string) {
	if addr == "" {
		n.Done(fmt.Errorf("%w: %s has no handshake socket to send a notification to", ErrNoEndpoint, n.Remote.Name))
		return
	}
	rec := p2p.NotifyRecord{Name: n.Name, NotifyMsg: string(n.Msg)}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		n.Done(fmt.Errorf("mctcp: notification to %s: %w", n.Remote.Name, driver.ErrClosed))
		return
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.IOTimeout)
		defer cancel()
		err := p2p.SendNotify(ctx, addr, rec, t.cfg.IOTimeout)
		if err != nil {
			// Mooncake's Notify carries no ID to drop a second copy by, so
			// a failed send is not retried: it may have arrived.
			err = fmt.Errorf("mctcp: notification to %s (%s): %w", n.Remote.Name, addr, err)
		}
		n.Done(err)
	}()
}

// handshakeAddr is where a segment's Notify messages go: its handshake
// socket, which names a P2PHANDSHAKE segment (ip:port) and is the
// endpoint of its RDMA entry when it has one. A TCP-only segment named
// through HTTP metadata has neither: its notifications fail with
// ErrNoEndpoint.
func handshakeAddr(d *segment.Descriptor) string {
	if d == nil {
		return ""
	}
	if pr, ok := d.Protocol(mooncake.TEProtoRDMA); ok && pr.Endpoint != "" {
		return pr.Endpoint
	}
	if _, _, err := net.SplitHostPort(d.Name); err == nil {
		return d.Name
	}
	return ""
}
