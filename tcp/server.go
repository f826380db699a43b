package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
)

const connBufSize = 64 << 10

// sconn is one accepted connection as admission control sees it.
type sconn struct {
	c   *net.TCPConn
	src netip.Addr
	// waiting is when the connection began to wait for its initiator
	// (unix nanoseconds): for the handshake, the next request, the rest
	// of a frame or a reply write; 0 while the target works on a request.
	// Its serve goroutine sets it; admission reads it to choose whom to
	// evict.
	waiting atomic.Int64
}

func (sc *sconn) wait() { sc.waiting.Store(time.Now().UnixNano()) }
func (sc *sconn) work() { sc.waiting.Store(0) }

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	acceptor.Run(t.log, "tcp", t.ln.Addr(), t.ctx.Done(), t.ln.Accept, func(c net.Conn) { t.admit(c.(*net.TCPConn)) })
}

// admit serves c unless the target is at its limits and no connection
// can make room: at MaxConns (or MaxConnsPerSource for c's source
// address), the connection that has waited longest for its initiator
// (idle between requests, stalled mid-frame, or still in its handshake)
// is closed instead, so connections that hold a slot without using it
// cannot lock new initiators out.
func (t *Transport) admit(c *net.TCPConn) {
	src := addrPort(c.RemoteAddr()).Addr()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return
	}
	var victim *sconn
	full := len(t.conns) >= t.cfg.MaxConns
	srcFull := t.perSource[src] >= t.cfg.MaxConnsPerSource
	if full || srcFull {
		oldest := int64(0)
		for _, sc := range t.conns {
			w := sc.waiting.Load()
			if w == 0 || (srcFull && sc.src != src) {
				continue
			}
			if victim == nil || w < oldest {
				victim, oldest = sc, w
			}
		}
		if victim == nil {
			t.mu.Unlock()
			c.Close()
			t.log.Debug("tcp: connection refused: every slot busy", "remote", c.RemoteAddr(), "max", t.cfg.MaxConns, "per_source", t.cfg.MaxConnsPerSource)
			return
		}
		t.dropLocked(victim.c)
	}
	sc := &sconn{c: c, src: src}
	sc.wait()
	t.conns[c] = sc
	t.peak = max(t.peak, len(t.conns))
	t.perSource[src]++
	t.wg.Add(1)
	t.mu.Unlock()
	if victim != nil {
		victim.c.Close() // its serve goroutine ends, releasing what it pinned
		t.log.Debug("tcp: evicted a waiting connection to admit a new one", "evicted", victim.c.RemoteAddr(), "remote", c.RemoteAddr())
	}
	go t.serve(sc)
}

// dropLocked forgets an accepted connection (once); t.mu is held.
func (t *Transport) dropLocked(c net.Conn) {
	sc, ok := t.conns[c]
	if !ok {
		return
	}
	delete(t.conns, c)
	if t.perSource[sc.src]--; t.perSource[sc.src] <= 0 {
		delete(t.perSource, sc.src)
	}
	t.maybeReleaseLocked()
}

// releaseMin is the smallest burst of connections whose memory is worth
// a release (about 90 KiB each: read buffer, reply gather, stack).
const releaseMin = 256

// maybeReleaseLocked schedules a release of memory once the connections
// served have fallen to a quarter of their peak (of at least releaseMin);
// t.mu is held.
func (t *Transport) maybeReleaseLocked() {
	n := len(t.conns)
	if t.peak < releaseMin || n > t.peak/4 || t.releasing || t.closed {
		return
	}
	t.peak, t.releasing = n, true
	t.wg.Add(1) // the caller holds a count (serve, accept loop): Close waits for this too
	go t.release()
}

// release gives the memory of a burst of closed connections back to the
// system, once the burst has settled: their buffers are garbage, but an
// idle server runs no collection for minutes, and until one runs (and
// the scavenger then works through the pages) they stay resident, which a
// host full of held-then-dropped connections cannot afford.
// debug.FreeOSMemory collects and returns the free pages at once; it runs
// only after a burst of releaseMin or more, so never on the data path.
func (t *Transport) release() {
	defer t.wg.Done()
	select {
	case <-time.After(100 * time.Millisecond):
	case <-t.ctx.Done():
		return
	}
	debug.FreeOSMemory()
	t.mu.Lock()
	t.releasing = false
	t.mu.Unlock()
}

// serve answers one initiator connection's requests, in order.
func (t *Transport) serve(sc *sconn) {
	c := sc.c
	defer t.wg.Done()
	defer func() {
		c.Close()
		t.mu.Lock()
		t.dropLocked(c)
		t.mu.Unlock()
	}()
	err := t.serveConn(sc)
	switch {
	case err == nil, errors.Is(err, errHandshake):
		// Handshake failures are logged by authLog.
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		// The initiator closed between requests, or this side closed
		// the connection (Close, eviction).
		t.log.Debug("tcp: initiator connection closed", "remote", c.RemoteAddr())
	default:
		// Mid-request: the initiator died (a killed process), reset the
		// connection, stalled past IOTimeout or broke the framing.
		t.lost(c.RemoteAddr(), err)
	}
}

// errHandshake marks a connection that ended in its handshake.
var errHandshake = errors.New("tcp: handshake")

// lost warns of an initiator connection lost mid-request, with the
// peer's address and what happened (rate-limited: a killed initiator's
// lanes, or a flood of bad ones, cost one line a second).
func (t *Transport) lost(peer net.Addr, err error) {
	what := "connection lost mid-request (reset, or the initiator died)"
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		what = "initiator stalled mid-request past the I/O timeout; disconnected"
	case errors.Is(err, io.ErrUnexpectedEOF):
		what = "initiator closed its connection mid-request (it died, or gave up)"
	case errors.Is(err, errProtocolOp), errors.Is(err, errMagic), errors.Is(err, errVersion), errors.Is(err, errOp),
		errors.Is(err, errFlags), errors.Is(err, errLength), errors.Is(err, errStatus):
		what = "initiator broke the framing; disconnected"
	}
	t.lostLog.Warn("tcp: "+what, "peer", peer.String(), "err", err)
}

// flushBytes bounds the reply bytes gathered before a write.
const flushBytes = 1 << 20

// handshake runs the target's side of the handshake within IOTimeout;
// failures are logged (rate-limited) with the peer's address.
func (t *Transport) handshake(c *net.TCPConn) error {
	c.SetDeadline(time.Now().Add(t.cfg.IOTimeout))
	_, err := acceptHandshake(c, t.cfg.Auth, auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()})
	c.SetDeadline(time.Time{})
	if err != nil && !errors.Is(err, errRemoteStale) && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.authLog.Failed(c.RemoteAddr(), err)
	}
	return err
}

func (t *Transport) serveConn(sc *sconn) error {
	c := sc.c
	// No request is read, and no byte of memory exposed, before the
	// handshake has succeeded.
	if err := t.handshake(c); err != nil {
		return fmt.Errorf("%w: %w", errHandshake, err)
	}
	fr := newFrameReader(c)
	fr.timeout = t.cfg.IOTimeout
	g := newGather(maxFramesPerWrite)
	defer g.reset()
	var hb [headerLen]byte
	more := false
	for {
		// Write the gathered replies once a burst of requests ends (or
		// the gather is full), so they leave in one writev.
		if !g.empty() && (!more || g.full() || g.bytes >= flushBytes) {
			if err := t.flush(sc, g); err != nil {
				return err
			}
		}
		// Gathered replies wait for the burst's next request at most
		// IOTimeout: a More flag followed by silence must not keep the
		// regions of READ replies pinned.
		var idle time.Duration
		if !g.empty() {
			idle = t.cfg.IOTimeout
		}
		if !fr.ready() {
			sc.wait()
		}
		err := fr.header(&hb, idle)
		if err == errIdle {
			if err := t.flush(sc, g); err != nil {
				return err
			}
			sc.wait()
			err = fr.header(&hb, 0)
		}
		sc.work()
		if err != nil {
			return err
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			return err // framing cannot be trusted: drop the connection
		}
		more = h.flags&flagMore != 0
		var reply header
		switch h.op {
		case opWrite:
			reply = header{op: opWrite | opReply, id: h.id, addr: h.addr}
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				reply.status = acquireStatus(aerr)
				// Nothing is written: the payload is consumed and
				// dropped, within the I/O timeout.
				sc.wait()
				err := fr.discard(int(h.length))
				sc.work()
				if err != nil {
					return err
				}
			} else {
				sc.wait()
				err := fr.payload(mem)
				sc.work()
				r.Release()
				if err != nil {
					return err
				}
			}
			g.add(&reply, nil, nil)
		case opRead:
			reply = header{op: opRead | opReply, id: h.id, addr: h.addr}
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				reply.status = acquireStatus(aerr)
				g.add(&reply, nil, nil)
			} else {
				reply.length = h.length
				g.add(&reply, mem, r) // r is released once written
			}
		default:
			return errProtocolOp
		}
	}
}

// flush writes the gathered replies within IOTimeout: an initiator that
// stops reading must not keep regions pinned (READ payloads wait in g).
func (t *Transport) flush(sc *sconn, g *gather) error {
	if g.empty() {
		return nil
	}
	sc.wait()
	sc.c.SetWriteDeadline(time.Now().Add(t.cfg.IOTimeout))
	err := g.flush(sc.c)
	sc.work()
	return err
}

var errProtocolOp = errors.New("tcp: unexpected op from initiator")

func acquireStatus(err error) status {
	if errors.Is(err, driver.ErrMemoryBusy) {
		return statusBusy
	}
	return statusOutOfRange
}
