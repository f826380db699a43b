package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/internal/sock"
)

const connBufSize = 64 << 10

// sconn is one accepted connection and its admission slot: its serve
// goroutine marks it waiting for its initiator (for the handshake, the
// next request, the rest of a frame or a reply write) or at work on a
// request; admission evicts the one that has waited longest.
type sconn struct {
	c    *net.TCPConn
	rw   *sock.RawIO // c's reads and writes after the handshake
	slot *acceptor.Slot[netip.Addr, *net.TCPConn]
	// peer is the initiator's name (after the handshake); ctr counts
	// what it did here, added to Transport.served when the connection
	// ends (only this connection's goroutine writes it: no contention).
	peer string
	ctr  laneCounters
	// quiet is the inbox that holds notes delivered quietly and not yet
	// announced: wake announces them after the reply's write, and before
	// the connection waits for its initiator.
	quiet driver.QuietInbox
}

// wake announces the notes delivered quietly.
func (sc *sconn) wake() {
	if q := sc.quiet; q != nil {
		sc.quiet = nil
		q.Wake()
	}
}

func (sc *sconn) wait() { sc.slot.Wait() }
func (sc *sconn) work() { sc.slot.Work() }

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	acceptor.Run(t.log, "tcp", t.ln.Addr(), t.ctx.Done(), t.ln.Accept, func(c net.Conn) { t.admit(c.(*net.TCPConn)) })
}

// admit serves c under the admission policy (internal/acceptor.Gate):
// at MaxConns (or MaxConnsPerSource for c's source address) the
// connection that has waited longest for its initiator (idle between
// requests, stalled mid-frame, or still in its handshake) is closed to
// make room, so connections that hold a slot without using it cannot
// lock new initiators out; when every connection is at work, c is
// closed.
func (t *Transport) admit(c *net.TCPConn) {
	src := addrPort(c.RemoteAddr()).Addr()
	slot, ok := t.gate.Admit(src, c, func() { c.Close() })
	if !ok {
		c.Close()
		t.log.Debug("tcp: connection refused: every slot busy", "remote", c.RemoteAddr(), "max", t.cfg.MaxConns, "per_source", t.cfg.MaxConnsPerSource)
		return
	}
	t.mu.Lock()
	t.peak = max(t.peak, t.gate.Len())
	t.mu.Unlock()
	t.wg.Add(1) // the accept loop holds the group: no race with Close's Wait
	go t.serve(&sconn{c: c, slot: slot})
}

// leave releases an accepted connection's slot, and its memory after a
// burst.
func (t *Transport) leave(sc *sconn) {
	t.gate.Leave(sc.slot)
	t.mu.Lock()
	t.untrackLocked(sc)
	t.maybeReleaseLocked()
	t.mu.Unlock()
}

// releaseMin is the smallest burst of connections whose memory is worth
// a release (about 90 KiB each: read buffer, reply gather, stack).
const releaseMin = 256

// maybeReleaseLocked schedules a release of memory once the connections
// served have fallen to a quarter of their peak (of at least releaseMin);
// t.mu is held.
func (t *Transport) maybeReleaseLocked() {
	n := t.gate.Len()
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
		sc.wake()
		c.Close()
		t.leave(sc)
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
func (t *Transport) handshake(c *net.TCPConn) (auth.Party, error) {
	c.SetDeadline(time.Now().Add(t.cfg.IOTimeout))
	from, err := acceptHandshake(c, t.cfg.Auth, auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()})
	c.SetDeadline(time.Time{})
	t.authLog.Failed(c.RemoteAddr(), err)
	return from, err
}

func (t *Transport) serveConn(sc *sconn) error {
	c := sc.c
	// No request is read, and no byte of memory exposed, before the
	// handshake has succeeded.
	from, err := t.handshake(c)
	if err != nil {
		return fmt.Errorf("%w: %w", errHandshake, err)
	}
	t.track(sc, from.Name)
	sender := driver.Sender{Name: from.Name, Epoch: from.Epoch, Seq: driver.NextSeq()}
	// served counts the data frames served, lastBad is the number of the
	// last one that failed: a mark checks its run against them.
	var served, lastBad uint64
	var markBuf []byte
	var vec *vecState
	sc.rw = sock.NewRawIO(2 * maxFramesPerWrite)
	if err := sc.rw.Reset(c); err != nil {
		return err
	}
	fr := newFrameReader(c, sc.rw)
	fr.timeout = t.cfg.IOTimeout
	fr.exactAfterVec = true
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
			sc.wake()
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
		c0 := cost.Now() // per request: the server handles one at a time
		h, err := decodeHeader(hb[:])
		if err != nil {
			return err // framing cannot be trusted: drop the connection
		}
		more = h.flags&flagMore != 0
		var reply header
		switch h.op {
		case opWrite:
			served++
			reply = header{legacy: h.legacy, op: opWrite | opReply, id: h.id, addr: h.addr}
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				lastBad = served
				sc.ctr.failures.Add(1)
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
				sc.ctr.bytes[driver.Write].Add(h.length)
				sc.ctr.slices[driver.Write].Add(1)
			}
			g.add(&reply, nil, nil)
		case opRead:
			served++
			reply = header{legacy: h.legacy, op: opRead | opReply, id: h.id, addr: h.addr}
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				lastBad = served
				sc.ctr.failures.Add(1)
				reply.status = acquireStatus(aerr)
				g.add(&reply, nil, nil)
			} else {
				reply.length = h.length
				g.add(&reply, mem, r) // r is released once written
				sc.ctr.bytes[driver.Read].Add(h.length)
				sc.ctr.slices[driver.Read].Add(1)
			}
		case opMark:
			if h.length < markHdrLen || h.length > markMaxLen {
				return errMarkBadLength // framing cannot be trusted
			}
			if markBuf == nil {
				markBuf = make([]byte, markMaxLen)
			}
			sc.wait()
			err := fr.payload(markBuf[:h.length])
			sc.work()
			if err != nil {
				return err
			}
			reply = header{legacy: h.legacy, op: opMark | opReply, id: h.id, addr: h.addr}
			mi, merr := decodeMark(markBuf[:h.length])
			if merr != nil {
				reply.status = statusBadRequest
			} else {
				reply.status = t.serveMark(sc, g, sender, h.addr, &mi, served, lastBad)
			}
			g.add(&reply, nil, nil)
		case opWriteV, opReadV:
			if vec == nil {
				vec = newVecState()
			}
			n, bad, err := t.serveVector(sc, fr, g, vec, &h)
			if err != nil {
				return err
			}
			if bad > 0 {
				lastBad = served + uint64(bad)
			}
			served += uint64(n)
		default:
			return errProtocolOp
		}
		cost.Serve.Since(c0)
	}
}

// vecState is a connection's scratch for vectors, made at its first.
type vecState struct {
	ents []byte          // entries
	st   []byte          // their statuses
	mem  [][]byte        // their memory (nil: refused)
	pins []driver.Region // their pins
	dst  [][]byte        // a run of payloads to read
}

func newVecState() *vecState {
	return &vecState{
		ents: make([]byte, maxVec*entryLen),
		st:   make([]byte, maxVec),
		mem:  make([][]byte, maxVec),
		pins: make([]driver.Region, maxVec),
		dst:  make([][]byte, 0, maxVec),
	}
}

// serveVector serves a vector request h: it checks and pins every entry,
// reads a WRITEV's payloads straight into memory (a refused entry's are
// discarded) and gathers the reply. It returns the entries served and the
// number (from 1) of the last refused one, 0 if none; an error ends the
// connection.
func (t *Transport) serveVector(sc *sconn, fr *frameReader, g *gather, v *vecState, h *header) (n, bad int, err error) {
	n = int(h.addr)
	ents := v.ents[:n*entryLen]
	if fr.br.Buffered() < len(ents) {
		sc.wait()
	}
	err = fr.head(ents)
	sc.work()
	if err != nil {
		return 0, 0, err
	}
	if err := checkEntries(ents, n, h.length); err != nil {
		return 0, 0, err // framing cannot be trusted
	}
	var okBytes uint64
	for k := range n {
		addr, length := entry(ents, k)
		mem, r, aerr := t.host.AcquireLocal(addr, length)
		if aerr != nil {
			v.st[k], v.mem[k], v.pins[k] = byte(acquireStatus(aerr)), nil, nil
			bad = k + 1
			continue
		}
		v.st[k], v.mem[k], v.pins[k] = byte(statusOK), mem, r
		okBytes += length
	}
	op := driver.Read
	if h.op == opReadV {
		// No payload follows: the next requests may come several to a
		// read, through the buffer.
		fr.direct = false
	}
	if h.op == opWriteV {
		op = driver.Write
		sc.wait()
		err = t.readVector(fr, v, n)
		sc.work()
		for k := range n {
			if v.pins[k] != nil {
				v.pins[k].Release()
			}
		}
		if err != nil {
			clear(v.mem[:n])
			clear(v.pins[:n])
			return 0, 0, err
		}
	}
	reply := header{op: h.op | opReply, id: h.id, addr: h.addr}
	arena := headerLen
	if bad > 0 {
		reply.status = statusVec
		arena += n
	}
	iovs := 1
	if op == driver.Read {
		reply.length = okBytes
		iovs += n
	}
	if !g.room(arena, iovs, n) {
		if err := t.flush(sc, g); err != nil {
			if op == driver.Read {
				for k := range n {
					if v.pins[k] != nil {
						v.pins[k].Release()
					}
				}
			}
			clear(v.mem[:n])
			clear(v.pins[:n])
			return 0, 0, err
		}
	}
	b := g.frame(arena)
	reply.encode(b)
	if bad > 0 {
		copy(b[headerLen:], v.st[:n])
	}
	if op == driver.Read {
		for k := range n {
			if v.mem[k] != nil {
				g.data(v.mem[k])
				g.pin(v.pins[k]) // released once written
			}
		}
	}
	served := n
	if bad > 0 {
		failed := 0
		for k := range n {
			if v.mem[k] == nil {
				failed++
			}
		}
		sc.ctr.failures.Add(uint64(failed))
		served -= failed
	}
	sc.ctr.bytes[op].Add(okBytes)
	sc.ctr.slices[op].Add(uint64(served))
	clear(v.mem[:n])
	clear(v.pins[:n])
	return n, bad, nil
}

// readVector reads a WRITEV's n payloads in order: runs of accepted
// entries with readv straight into their memory, refused ones discarded.
func (t *Transport) readVector(fr *frameReader, v *vecState, n int) error {
	dst := v.dst[:0]
	defer clear(v.dst[:cap(v.dst)])
	for k := range n {
		if v.mem[k] != nil {
			dst = append(dst, v.mem[k])
			continue
		}
		if err := fr.readv(dst); err != nil {
			return err
		}
		dst = dst[:0]
		_, length := entry(v.ents, k)
		if err := fr.discard(int(length)); err != nil {
			return err
		}
	}
	return fr.readv(dst)
}

// flush writes the gathered replies within IOTimeout: an initiator that
// stops reading must not keep regions pinned (READ payloads wait in g).
func (t *Transport) flush(sc *sconn, g *gather) error {
	if g.empty() {
		return nil
	}
	defer cost.Serve.Since(cost.Now())
	sc.wait()
	sc.c.SetWriteDeadline(time.Now().Add(t.cfg.IOTimeout))
	err := g.flush(sc.rw)
	sc.work()
	sc.wake()
	return err
}

var errProtocolOp = errors.New("tcp: unexpected op from initiator")

func acquireStatus(err error) status {
	if errors.Is(err, driver.ErrMemoryBusy) {
		return statusBusy
	}
	return statusOutOfRange
}
