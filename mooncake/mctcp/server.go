package mctcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/sock"
)

// connBufSize is the target's read buffer: pipelined small requests
// arrive many per system call; payloads at least this large bypass it.
const connBufSize = 64 << 10

// sconn is one accepted connection as admission sees it, with the
// buffers that serve it. Mooncake's initiator opens a connection per
// request unless pooled, so the buffers outlive their connection: they
// come from Transport.spare, and the read buffer only once a small
// payload needs it.
type sconn struct {
	c    sock.Conn
	src  netip.Addr
	peer netip.AddrPort // for logs
	// waiting is when the connection began to wait for its initiator
	// (unix nanoseconds), 0 while the target works on a request.
	waiting atomic.Int64
	// stalled is when the connection began to wait for the rest of a
	// request (its header or payload) or for its reply to be written, 0
	// otherwise: the watchdog closes it once that lasts IOTimeout. No
	// deadlines: a deadline set and cleared per request costs timer
	// updates that wake the runtime's network poller.
	stalled atomic.Int64

	clock *atomic.Int64 // Transport.clock

	rw *sock.RawIO   // c's socket I/O, outside the scheduler
	br *bufio.Reader // over rw; nil until a request smaller than directRead
	hb [headerLen]byte
	g  gather
}

// gather collects answers for one writev: status words in a fixed arena
// (adjacent ones become one iovec), READ payloads straight from registered
// memory with the regions to release once written. Answers to pipelined
// requests leave together; nothing waits for input while answers are held.
type gather struct {
	sts   []byte
	nst   int
	iov   [][]byte
	pins  []driver.Region
	bytes int
}

// flushBytes bounds the payload bytes gathered before a write.
const flushBytes = 1 << 20

func (g *gather) init() {
	g.sts = make([]byte, maxPerWrite*statusLen)
	g.iov = make([][]byte, 0, 2*maxPerWrite)
	g.pins = make([]driver.Region, 0, maxPerWrite)
}

func (g *gather) full() bool {
	return g.nst == maxPerWrite || len(g.iov) >= 2*maxPerWrite-1 || g.bytes >= flushBytes
}

// add appends an answer: a status word unless v1, then payload (may be
// nil); pin (may be nil) is released after the write.
func (g *gather) add(v2 bool, code uint32, payload []byte, pin driver.Region) {
	if v2 {
		st := g.sts[g.nst*statusLen : (g.nst+1)*statusLen : (g.nst+1)*statusLen]
		encodeStatus(st, code)
		if k := len(g.iov); k > 0 && g.nst > 0 && len(g.iov[k-1]) > 0 &&
			&g.iov[k-1][len(g.iov[k-1])-1] == &g.sts[g.nst*statusLen-1] {
			g.iov[k-1] = g.sts[g.nst*statusLen-len(g.iov[k-1]) : (g.nst+1)*statusLen]
		} else {
			g.iov = append(g.iov, st)
		}
		g.nst++
	}
	if len(payload) > 0 {
		g.iov = append(g.iov, payload)
		g.bytes += len(payload)
	}
	if pin != nil {
		g.pins = append(g.pins, pin)
	}
}

// flush writes what was gathered and releases the pins.
func (g *gather) flush(rw *sock.RawIO) error {
	var err error
	if len(g.iov) > 0 {
		_, err = rw.WriteBuffers(g.iov)
	}
	g.reset()
	return err
}

func (g *gather) reset() {
	for _, r := range g.pins {
		r.Release()
	}
	clear(g.pins)
	g.pins = g.pins[:0]
	clear(g.iov)
	g.iov = g.iov[:0]
	g.nst, g.bytes = 0, 0
}

// wait: the connection waits for its initiator's next request.
func (sc *sconn) wait() { sc.waiting.Store(sc.clock.Load()) }

// stall: it waits for the rest of a request or for its reply to leave;
// both bounded by IOTimeout.
func (sc *sconn) stall() {
	now := sc.clock.Load()
	sc.waiting.Store(now)
	sc.stalled.Store(now)
}

// work: it works on a request.
func (sc *sconn) work() {
	sc.waiting.Store(0)
	sc.stalled.Store(0)
}

// buffered is the number of bytes read ahead of the request at hand.
func (sc *sconn) buffered() int {
	if sc.br == nil {
		return 0
	}
	return sc.br.Buffered()
}

// reader is the read buffer, made on first use.
func (sc *sconn) reader() *bufio.Reader {
	if sc.br == nil {
		sc.br = bufio.NewReaderSize(sc.rw, connBufSize)
	}
	return sc.br
}

// accepted is a connection as the listener hands it over.
type accepted struct {
	c    sock.Conn
	peer netip.AddrPort
}

// maxIdleServers bounds the goroutines that, their connection closed,
// wait for the next one: Mooncake's initiator opens a connection per
// request unless pooled, and a goroutine that has served one has its
// stack grown already.
const maxIdleServers = 256

// admit serves c unless the target is at a bound and no connection can
// make room: then the one that has waited longest for its initiator is
// closed instead, so held connections cannot lock initiators out.
func (t *Transport) admit(a accepted) {
	c, src := a.c, a.peer.Addr()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return
	}
	var victim sock.Conn
	full := len(t.conns) >= t.cfg.MaxConns
	srcFull := t.perSource[src] >= t.cfg.MaxConnsPerSource
	if full || srcFull {
		var vs *sconn
		oldest := int64(0)
		for _, sc := range t.conns {
			w := sc.waiting.Load()
			if w == 0 || (srcFull && sc.src != src) {
				continue
			}
			if vs == nil || w < oldest {
				vs, oldest = sc, w
			}
		}
		if vs == nil {
			t.mu.Unlock()
			c.Close()
			t.log.Debug("mctcp: connection refused: every slot busy", "remote", a.peer)
			return
		}
		victim = vs.c // read under mu: once dropped, vs may serve another connection
		t.dropLocked(victim)
	}
	sc := t.spare.Get().(*sconn)
	sc.c, sc.src, sc.peer = c, src, a.peer
	sc.wait()
	t.conns[c] = sc
	t.perSource[src]++
	t.wg.Add(1) // for a new server, unless an idle one takes sc
	t.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
	select {
	case t.handoff <- sc:
		t.wg.Done()
	default:
		go t.serve(sc)
	}
}

func (t *Transport) dropLocked(c sock.Conn) {
	sc, ok := t.conns[c]
	if !ok {
		return
	}
	delete(t.conns, c)
	if t.perSource[sc.src]--; t.perSource[sc.src] <= 0 {
		delete(t.perSource, sc.src)
	}
}

// serve serves sc, then the connections admit hands it while it is one
// of at most maxIdleServers idle ones, until the transport closes.
func (t *Transport) serve(sc *sconn) {
	defer t.wg.Done()
	for sc != nil {
		t.serveOne(sc)
		sc = t.next()
	}
}

// next waits for admit's next connection; nil if enough servers wait
// already or the transport closed.
func (t *Transport) next() *sconn {
	defer t.idle.Add(-1)
	if t.idle.Add(1) > maxIdleServers {
		return nil
	}
	select {
	case sc := <-t.handoff:
		return sc
	case <-t.ctx.Done():
		return nil
	}
}

func (t *Transport) serveOne(sc *sconn) {
	err := sc.rw.Reset(sc.c)
	if err == nil {
		if sc.br != nil {
			sc.br.Reset(sc.rw)
		}
		err = t.serveConn(sc)
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.log.Debug("mctcp: serve connection", "remote", sc.peer, "err", err)
	}
	sc.c.Close()
	t.mu.Lock()
	t.dropLocked(sc.c)
	t.mu.Unlock()
	sc.rw.Reset(nil)
	sc.c = nil
	sc.work()
	t.spare.Put(sc)
}

func newSconn(clock *atomic.Int64) *sconn {
	sc := &sconn{clock: clock, rw: sock.NewRawIO(2 * maxPerWrite)}
	sc.g.init()
	return sc
}

var errUnknownOp = errors.New("mctcp: unknown opcode")

// directRead is the payload size from which payload bytes bypass the read
// buffer: what is buffered is copied, the rest is read by the kernel
// straight into registered memory.
const directRead = 16 << 10

// readPayload fills dst from br's buffered bytes and then, for a large
// payload, straight from c; it reports whether it read directly.
func readPayload(br *bufio.Reader, c io.Reader, dst []byte) (bool, error) {
	if len(dst) < directRead {
		_, err := io.ReadFull(br, dst)
		return false, err
	}
	n := 0
	if br.Buffered() > 0 {
		n, _ = br.Read(dst) // buffered bytes only: no system call
	}
	if n < len(dst) {
		if _, err := readFull(c, dst[n:]); err != nil {
			return true, err
		}
	}
	return true, nil
}

// Wake-up marks for payloads read straight into memory: while more than
// lowatFrom bytes are missing, a wait asks the kernel to report the
// socket readable only once the rest (up to lowatMax) is queued, so a
// 1 MiB WRITE wakes the target about twice instead of once per burst
// that arrives while it sleeps (six on loopback). Smaller payloads arrive
// in one or two bursts: the marks' system calls would cost more than
// they save.
const (
	lowatFrom = 64 << 10
	lowatMax  = 1 << 20
)

// readFull is io.ReadFull, with wake-up marks when c is a *sock.RawIO.
func readFull(c io.Reader, dst []byte) (int, error) {
	rw, ok := c.(*sock.RawIO)
	if !ok {
		return io.ReadFull(c, dst)
	}
	n := 0
	for n < len(dst) {
		want := 1
		if rest := len(dst) - n; rest > lowatFrom {
			want = min(rest, lowatMax)
		}
		k, err := rw.ReadWait(dst[n:], want)
		n += k
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
	}
	return n, nil
}

// readPayload is readPayload on sc, whose read buffer is made only when
// a small payload needs it.
func (sc *sconn) readPayload(dst []byte) (bool, error) {
	if sc.br == nil && len(dst) >= directRead {
		_, err := readFull(sc.rw, dst)
		return true, err
	}
	return readPayload(sc.reader(), sc.rw, dst)
}

// serveConn answers one connection's requests in order until it closes,
// breaks the protocol or asks for memory it may not have. Answers are
// gathered while further requests are already buffered and written
// together before the target waits for input. It allocates nothing per
// request.
func (t *Transport) serveConn(sc *sconn) error {
	g := &sc.g
	defer g.reset()
	flush := func() error {
		sc.stall()
		err := g.flush(sc.rw)
		sc.work()
		return err
	}
	// direct: read the next header exactly, so a large payload behind it
	// lands in memory without passing through the read buffer. So it
	// starts: a connection per request has one header to read.
	direct := true
	for {
		if sc.buffered() < headerLen {
			if err := flush(); err != nil {
				return err
			}
			sc.wait()
			if direct && sc.buffered() == 0 {
				n, err := sc.rw.Read(sc.hb[:])
				if err != nil {
					return err
				}
				if n < headerLen {
					sc.stall()
					if _, err := io.ReadFull(sc.rw, sc.hb[n:]); err != nil {
						return err
					}
				}
			} else {
				br := sc.reader()
				if br.Buffered() == 0 {
					if _, err := br.Peek(1); err != nil {
						return err
					}
				}
				if br.Buffered() < headerLen {
					sc.stall()
				}
				if _, err := io.ReadFull(br, sc.hb[:]); err != nil {
					return err
				}
			}
		} else if _, err := io.ReadFull(sc.br, sc.hb[:]); err != nil {
			return err
		}
		sc.work()
		h := decodeHeader(sc.hb[:])
		v2 := h.op&opV2 != 0
		op := h.op &^ opV2
		if op != opRead && op != opWrite {
			// Mooncake serves unknown opcodes as READs; te refuses them.
			return t.reject(sc, v2, fmt.Errorf("%w %#x", errUnknownOp, h.op))
		}
		if h.size == 0 {
			return t.reject(sc, v2, errors.New("mctcp: request of 0 bytes"))
		}
		mem, r, err := t.host.AcquireLocal(h.addr, h.size)
		if err != nil {
			return t.reject(sc, v2, err)
		}
		if op == opWrite {
			if uint64(sc.buffered()) < h.size {
				// The payload is not all here: answer what is gathered
				// before waiting for it.
				if err := flush(); err != nil {
					r.Release()
					return err
				}
			}
			sc.stall()
			direct, err = sc.readPayload(mem)
			sc.work()
			r.Release()
			if err != nil {
				return err
			}
			g.add(v2, statusOK, nil, nil)
		} else {
			g.add(v2, statusOK, mem, r) // r is released once written
		}
		if g.full() {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// reject answers a refused request as Mooncake does (status 1 under v2,
// nothing under v1), after what was gathered, and ends the connection: a
// rejected WRITE's payload is not read, so the stream cannot continue.
func (t *Transport) reject(sc *sconn, v2 bool, why error) error {
	sc.g.add(v2, statusBad, nil, nil)
	sc.stall()
	sc.g.flush(sc.rw)
	if errors.Is(why, driver.ErrOutOfRange) || errors.Is(why, driver.ErrMemoryBusy) {
		t.log.Debug("mctcp: request rejected", "remote", sc.peer, "err", why)
		return nil
	}
	return why
}
