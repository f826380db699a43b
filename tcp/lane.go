package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/cost"
	"github.com/rdmago/te/internal/sock"
)

// maxFramesPerWrite bounds the frames gathered into one writev (two
// iovecs each, below the kernel's 1024).
const maxFramesPerWrite = 256

// peer is the initiator's state for one incarnation of a remote segment:
// its lanes.
type peer struct {
	t     *Transport
	name  string
	addr  string
	epoch uint64
	// legacy: the target speaks wire version 2 (no vectors).
	legacy bool
	lanes  []*lane
	rr     atomic.Uint32
	gens   atomic.Uint64 // connections made

	nmu   sync.Mutex // guards nfree
	nfree []*tnote   // notes' states, reused

	closeOnce sync.Once
	wg        sync.WaitGroup // lane goroutines
}

func newPeer(t *Transport, name, addr string, epoch uint64, legacy bool) *peer {
	p := &peer{t: t, name: name, addr: addr, epoch: epoch, legacy: legacy}
	p.lanes = make([]*lane, t.cfg.Lanes)
	for i := range p.lanes {
		p.lanes[i] = &lane{
			p:    p,
			kick: make(chan struct{}, 1),
			g:    newGather(maxFramesPerWrite),
			ctr:  t.counters(name, i),
		}
	}
	return p
}

// Close fails everything in flight to this peer and joins its goroutines.
// It is idempotent.
func (p *peer) Close() error {
	p.closeOnce.Do(func() {
		p.t.forget(p)
		for _, l := range p.lanes {
			l.close()
		}
		p.wg.Wait()
	})
	return nil
}

// laneShare is the bytes of one submission that justify one more lane:
// spreading a small burst over many connections costs more wake-ups than
// it gains, a large one gains parallel copies on both sides. Measured on
// the 2-core VM (batch 128, three interleaved runs, GB/s means): 1 MiB
// gave 2.26 / 2.19 at 64 KiB WRITE / READ, 4 MiB 2.67 / 2.33, 16 MiB
// 2.03 / 2.15; 1 MiB requests were alike within noise.
const laneShare = 4 << 20

// submit spreads ss over the lanes in contiguous runs (one lane per
// laneShare bytes, at most all of them), starting at a rotating lane so
// that small submissions still use every lane over time.
func (p *peer) submit(ss []*driver.Slice) {
	if len(ss) == 1 && ss[0].Attempt() > 0 {
		// A retry after a broken connection: other lanes may be broken
		// too without knowing it yet, so use the freshest one.
		p.freshLane().enqueue(ss, nil)
		return
	}
	var total int
	for _, s := range ss {
		total += len(s.Local)
	}
	n := min(len(p.lanes), max(1, total/laneShare), len(ss))
	start := int(p.rr.Add(1))
	per := (len(ss) + n - 1) / n
	for i := 0; len(ss) > 0; i++ {
		k := min(per, len(ss))
		p.lanes[(start+i)%len(p.lanes)].enqueue(ss[:k], nil)
		ss = ss[k:]
	}
}

// freshLane returns a lane that will dial anew, or else the one connected
// most recently.
func (p *peer) freshLane() *lane {
	var best *lane
	var bestGen uint64
	for _, l := range p.lanes {
		l.mu.Lock()
		c, g := l.conn, l.gen
		l.mu.Unlock()
		if c == nil {
			return l
		}
		if best == nil || g > bestGen {
			best, bestGen = l, g
		}
	}
	return best
}

// inflight is a request written (or being written) on a lane's
// connection: a slice or a mark.
type inflight struct {
	item
	id uint64
}

// ring is a FIFO of in-flight requests, in wire order.
type ring struct {
	buf     []inflight
	head, n int
}

func (r *ring) push(e inflight) {
	if r.n == len(r.buf) {
		nb := make([]inflight, max(16, 2*len(r.buf)))
		for i := 0; i < r.n; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = e
	r.n++
}

func (r *ring) peek() (inflight, bool) {
	if r.n == 0 {
		return inflight{}, false
	}
	return r.buf[r.head], true
}

// at returns the k-th oldest request; k < r.n.
func (r *ring) at(k int) *inflight { return &r.buf[(r.head+k)%len(r.buf)] }

func (r *ring) pop() {
	r.buf[r.head] = inflight{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
}

// lane is one persistent connection to a peer, with a writer goroutine
// (started on first use) and a reader goroutine per connection.
type lane struct {
	p    *peer
	kick chan struct{} // wakes the writer

	mu      sync.Mutex // guards the fields below
	closed  bool
	started bool // writer running
	pending []item
	conn    *net.TCPConn
	rw      *sock.RawIO // conn's I/O: the writer's writes, the reader's reads
	rd      *reader     // who reads conn's replies (kept after a failure)
	ring    ring        // requests on conn awaiting replies
	reading bool        // the reader owns a popped request (payload in progress)
	// writing is set while the writer's writev may still read the payloads
	// of requests in the ring; fail then leaves completing them to the
	// writer (deferred), so no task finishes — and no memory is unpinned —
	// while the kernel may still read its memory.
	writing  bool
	deferred []item
	deferErr error
	// why the last connection was failed (fail), so a reader interrupted
	// by that failure reports the cause rather than "closed connection".
	failedConn *net.TCPConn
	failedErr  error
	nextID     uint64 // ids grow across connections
	gen        uint64 // when conn was made (peer.gens), for freshLane
	done       uint64 // replies received: progress for the watchdog
	// watchdog state, also under mu
	lastDone uint64
	stall    int
	dialing  bool // the writer is connecting
	held     int  // slices the writer took from pending and has not written
	// busy is held by whoever takes batches from pending and writes them
	// on conn: the writer goroutine, or a submitter writing its own
	// batch on an idle lane (sendInline); so frames keep their order.
	busy bool
	// handoff is set when a submitter's write did not finish without
	// waiting: busy passes to the writer, which writes the rest (through
	// handoffRW) before anything else.
	handoff   *net.TCPConn
	handoffRW *sock.RawIO

	// ctr counts the lane's traffic (per peer name and lane index: it
	// outlives this peer incarnation).
	ctr *laneCounters

	// owned by the holder of busy
	spare []item
	g     *gather
}

// vecBufs is a reader's scratch for a vector reply. It belongs to one
// connection's reader, not to the lane: after a reconnect the old
// connection's reader may still be inside a reply while the new one reads
// the next.
type vecBufs struct {
	its  []item
	st   []byte
	dst  [][]byte
	done []*driver.Slice
}

// enqueue queues ss, followed by m when not nil (a run and its mark are
// queued together, so the writer takes them in one batch).
func (l *lane) enqueue(ss []*driver.Slice, m *mark) {
	for _, s := range ss {
		if uint64(len(s.Local)) > maxPayload {
			// The engine never cuts slices this large with sane
			// configuration; refuse all rather than half a submission.
			doneAll(ss, errTooLarge)
			if m != nil {
				m.done(errTooLarge)
			}
			return
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		doneAll(ss, errPeerClosed)
		if m != nil {
			m.done(errPeerClosed)
		}
		return
	}
	for _, s := range ss {
		l.pending = append(l.pending, item{s: s})
	}
	if m != nil {
		l.pending = append(l.pending, item{m: m})
	}
	if !l.started {
		l.started = true
		l.p.wg.Add(1)
		go l.writeLoop()
	}
	if !l.busy && l.conn != nil && len(l.pending) <= maxFramesPerWrite {
		l.sendInline() // unlocks l.mu
		return
	}
	l.mu.Unlock()
	l.wake()
}

func (l *lane) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// sendInline writes the pending batch on the submitter's goroutine, the
// lane being idle and connected: no hand-off to the writer and its
// wake-up. What the socket does not take at once is left to the writer
// (handoff), so Submit never waits for the peer. l.mu is held; it
// unlocks it.
func (l *lane) sendInline() {
	l.busy = true
	batch := l.pending
	l.pending = l.spare[:0]
	l.held = len(batch)
	conn, rw := l.conn, l.rw
	l.p.wg.Add(1) // Close waits for this write as for the writer's (closed is false: the writer runs)
	l.mu.Unlock()
	defer l.p.wg.Done()
	dropCanceled(batch)
	handed := l.send(conn, rw, batch, true)
	l.mu.Lock()
	l.recycle(batch)
	if handed {
		l.handoff, l.handoffRW = conn, rw
	} else {
		l.busy, l.held = false, 0 // all written, or failed
	}
	more := handed || len(l.pending) > 0 || l.closed
	l.mu.Unlock()
	if more {
		l.wake() // the writer finishes the write, or takes what was queued meanwhile
	}
}

func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	c, rd := l.conn, l.rd
	l.mu.Unlock()
	if c != nil {
		c.Close() // the reader fails what is in flight
	}
	if rd != nil {
		rd.wake() // a parked reader too
	}
	l.wake()
}

func doneAll(ss []*driver.Slice, err error) {
	for _, s := range ss {
		s.Done(0, err)
	}
}

func (l *lane) writeLoop() {
	defer l.p.wg.Done()
	for range l.kick {
		for {
			l.mu.Lock()
			if c := l.handoff; c != nil {
				// A submitter's write to finish: busy is the writer's.
				rw := l.handoffRW
				l.handoff, l.handoffRW = nil, nil
				l.mu.Unlock()
				l.wrote(c, l.g.finish(rw))
				l.mu.Lock()
				l.busy = false
			}
			if l.busy {
				// A submitter is writing; it wakes the writer when done
				// if more was queued meanwhile.
				l.mu.Unlock()
				break
			}
			if l.closed {
				batch := l.pending
				l.pending = nil
				l.mu.Unlock()
				doneItems(batch, errPeerClosed)
				return
			}
			if len(l.pending) == 0 {
				l.held = 0
				l.mu.Unlock()
				break
			}
			batch := l.pending
			l.pending = l.spare[:0]
			l.held = len(batch)
			l.busy = true
			conn, rw := l.conn, l.rw
			l.mu.Unlock()
			dropCanceled(batch)
			if conn == nil {
				l.mu.Lock()
				l.dialing = true
				l.mu.Unlock()
				err := l.connect(l.p.t.ctx)
				l.mu.Lock()
				l.dialing = false
				l.mu.Unlock()
				if err != nil {
					doneItems(batch, err)
					l.mu.Lock()
					l.recycle(batch)
					l.busy = false
					l.mu.Unlock()
					continue
				}
				l.mu.Lock()
				conn, rw = l.conn, l.rw
				l.mu.Unlock()
			}
			if conn == nil {
				// Failed at once (e.g. the HELLO was refused).
				doneItems(batch, l.cause(nil, errPeerClosed))
			} else {
				l.send(conn, rw, batch, false)
			}
			l.mu.Lock()
			l.recycle(batch)
			l.busy = false
			l.mu.Unlock()
		}
	}
}

func (l *lane) recycle(batch []item) {
	clear(batch)
	l.spare = batch[:0]
}

// connect dials the lane's connection and runs the handshake (within
// DialTimeout); then it starts the connection's reader.
func (l *lane) connect(ctx context.Context) error {
	t := l.p.t
	ctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.p.addr)
	if err != nil {
		return fmt.Errorf("%w: dial %s at %s: %w", ErrConnection, l.p.name, l.p.addr, err) // the cause stays comparable (a refused port: the target stopped)
	}
	tc := c.(*net.TCPConn)
	tc.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	err = dialHandshake(tc, t.cfg.Auth,
		auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()}, auth.Party{Name: l.p.name, Epoch: l.p.epoch})
	tc.SetDeadline(time.Time{})
	if err != nil {
		tc.Close()
		if errors.Is(err, auth.ErrDenied) || errors.Is(err, driver.ErrPeerReset) {
			return fmt.Errorf("%w (%s at %s)", err, l.p.name, l.p.addr)
		}
		return fmt.Errorf("%w: handshake with %s at %s: %w", ErrConnection, l.p.name, l.p.addr, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		tc.Close()
		return errPeerClosed
	}
	rw := sock.NewRawIO(2 * maxFramesPerWrite)
	if err := rw.Reset(tc); err != nil {
		tc.Close()
		return fmt.Errorf("%w: %s at %s: %w", ErrConnection, l.p.name, l.p.addr, err)
	}
	l.conn, l.rw = tc, rw
	l.rd = newReader(l, tc, rw)
	l.ctr.connects.Add(1)
	l.gen = l.p.gens.Add(1)
	l.stall = 0
	l.p.wg.Add(1)
	go l.readLoop(l.rd)
	return nil
}

// send writes batch as frames on conn, maxFramesPerWrite per writev.
// With inline (a submitter's batch of one writev) it writes what the
// socket takes without waiting and, when that was not all, leaves the
// rest to the writer and reports true (busy passes to it).
func (l *lane) send(conn *net.TCPConn, rw *sock.RawIO, batch []item, inline bool) (handed bool) {
	defer cost.Move.Since(cost.Now())
	for len(batch) > 0 {
		k := min(len(batch), maxFramesPerWrite)
		chunk := batch[:k]
		l.mu.Lock()
		if l.conn != conn {
			l.mu.Unlock()
			doneItems(batch, l.cause(conn, fmt.Errorf("%w: to %s at %s", ErrConnection, l.p.name, l.p.addr)))
			return false
		}
		last := len(chunk) - 1
		for last > 0 && chunk[last].s == nil && chunk[last].m == nil {
			last--
		}
		for i := 0; i < len(chunk); i++ {
			it := chunk[i]
			if it.s == nil && it.m == nil {
				continue // a cancelled slice, already completed
			}
			if j := l.vectorEnd(chunk, i); j > i {
				l.addVector(chunk[i:j+1], j < last)
				i = j
				continue
			}
			id := l.nextID
			l.nextID++
			h := header{legacy: l.p.legacy, id: id}
			switch s := it.s; {
			case it.m != nil:
				h.op, h.addr, h.length = opMark, it.m.tn.n.ID, uint64(len(it.m.buf))
			case s.Op == driver.Write:
				h.op, h.addr, h.length = opWrite, s.RemoteAddr, uint64(len(s.Local))
			default:
				h.op, h.addr, h.length = opRead, s.RemoteAddr, uint64(len(s.Local))
			}
			if i < last {
				h.flags = flagMore
			}
			switch {
			case it.m != nil:
				l.g.add(&h, it.m.buf, nil)
			case h.op == opWrite:
				l.g.add(&h, it.s.Local, nil)
			default:
				l.g.add(&h, nil, nil)
			}
			l.ring.push(inflight{item: it, id: id})
			if it.s != nil {
				it.s.Posted()
			}
		}
		l.held -= k
		l.writing = true
		if rd := l.rd; rd != nil && rd.c == conn && rd.mode == rIdle && l.ring.n > 0 {
			rd.offer()
		}
		l.mu.Unlock()
		batch = batch[k:]
		var err error
		if inline && len(batch) == 0 {
			var done bool
			done, err = l.g.try(rw)
			if !done && err == nil {
				return true
			}
		} else {
			err = l.g.flush(rw)
		}
		if err = l.wrote(conn, err); err != nil {
			doneItems(batch, err)
			return false
		}
	}
	return false
}

// wrote ends a write on conn that returned err: a failed write fails the
// lane, and the requests failed while it was writing (deferred) are
// completed now that the kernel no longer reads their memory. It returns
// the write's error, wrapped.
func (l *lane) wrote(conn *net.TCPConn, err error) error {
	if err != nil {
		err = fmt.Errorf("%w: write to %s at %s: %v", ErrConnection, l.p.name, l.p.addr, err)
		l.fail(conn, err)
	}
	l.mu.Lock()
	l.writing = false
	deferred, derr := l.deferred, l.deferErr
	l.deferred, l.deferErr = nil, nil
	l.mu.Unlock()
	doneItems(deferred, derr)
	return err
}

// vecMaxSlice is the largest slice sent in a vector: a larger one's
// header costs little against its bytes.
const vecMaxSlice = 64 << 10

// vectorEnd returns the index of the last item of the vector that starts
// at chunk[i] (slices of one op, each at most vecMaxSlice, at most maxVec
// of them), or i when the item goes alone (a mark, a large slice, a
// version-2 target).
func (l *lane) vectorEnd(chunk []item, i int) int {
	s := chunk[i].s
	if l.p.legacy || s == nil || len(s.Local) > vecMaxSlice {
		return i
	}
	j := i
	for j+1 < len(chunk) && j+1-i < maxVec {
		n := chunk[j+1].s
		if n == nil || n.Op != s.Op || len(n.Local) > vecMaxSlice {
			break
		}
		j++
	}
	return j
}

// addVector gathers the slices of its as one vector frame; l.mu is held.
func (l *lane) addVector(its []item, more bool) {
	n := len(its)
	b := l.g.frame(headerLen + n*entryLen)
	h := header{op: opWriteV, id: l.nextID, addr: uint64(n)}
	if its[0].s.Op == driver.Read {
		h.op = opReadV
	}
	if more {
		h.flags = flagMore
	}
	for k, it := range its {
		s := it.s
		putEntry(b[headerLen+k*entryLen:], s.RemoteAddr, uint64(len(s.Local)))
		h.length += uint64(len(s.Local))
	}
	h.encode(b)
	for _, it := range its {
		if h.op == opWriteV {
			l.g.data(it.s.Local)
		}
		l.ring.push(inflight{item: it, id: l.nextID})
		l.nextID++
		it.s.Posted()
	}
}

func (l *lane) readLoop(r *reader) {
	defer l.p.wg.Done()
	for {
		err := l.readReplies(r, nil, nil)
		if err == errYield {
			r.park()
			continue
		}
		l.fail(r.c, err)
		return
	}
}

// connErr is a failed read of c, or why c was failed.
func (l *lane) connErr(c *net.TCPConn, err error) error {
	return l.cause(c, fmt.Errorf("%w: read from %s at %s: %v", ErrConnection, l.p.name, l.p.addr, err))
}

// readReplies completes requests as their replies arrive, until the
// connection fails (it returns why) or r passes the reading on: on the
// reader goroutine (done nil) when the lane has nothing in flight and
// waiters read (errYield); on a waiter (waitread.go) that, or when done
// reports true or ctx ends, checked between frames and at the reader's
// ticks while it waits for the next (errHandBack). It passes only
// between frames.
func (l *lane) readReplies(r *reader, ctx context.Context, done func() bool) error {
	c, fr := r.c, r.fr
	for {
		l.mu.Lock()
		if l.conn != c || l.closed {
			l.mu.Unlock()
			return l.connErr(c, net.ErrClosed)
		}
		if l.ring.n == 0 && !l.busy && len(l.pending) == 0 && r.small && fr.br.Buffered() == 0 && (done != nil || l.p.t.wanted.Load()) {
			// Nothing in flight nor being written (a large
			// submission's rest would otherwise find the lane idle
			// with no waiter to come for it), and the last reply
			// was for small slices: large ones gain nothing from
			// the waiter's reading (1 MiB WRITEs measured slower).
			r.mode = rIdle
			l.mu.Unlock()
			return errYield
		}
		l.mu.Unlock()
		var err error
		if done != nil {
			if done() || ctx.Err() != nil {
				return errHandBack
			}
			err = r.waitHeader()
		} else {
			err = fr.header(&r.hb, 0)
		}
		if err != nil {
			if err == errIdle {
				return errHandBack
			}
			return l.connErr(c, err)
		}
		c0 := cost.Now() // per reply: the reader handles one at a time
		h, err := decodeHeader(r.hb[:])
		if err != nil {
			return fmt.Errorf("%w: from %s: %v", ErrProtocol, l.p.addr, err)
		}
		if h.length == 0 {
			// No payload follows: the next headers may come several
			// to a read, through the buffer.
			fr.direct = false
		}
		if h.vector() {
			r.small = true
			if err := l.readVector(c, fr, &r.vec, &h); err != nil {
				return err
			}
			cost.Complete.Since(c0)
			continue
		}
		l.mu.Lock()
		if l.conn != c {
			l.mu.Unlock()
			return l.connErr(c, net.ErrClosed)
		}
		e, ok := l.ring.peek()
		want := opWrite | opReply
		switch {
		case ok && e.m != nil:
			want = opMark | opReply
		case ok && e.s.Op == driver.Read:
			want = opRead | opReply
		}
		if !ok || e.id != h.id || h.op != want {
			l.mu.Unlock()
			return fmt.Errorf("%w: unexpected reply (%v) from %s", ErrProtocol, h, l.p.addr)
		}
		l.ring.pop()
		s := e.s
		r.small = s == nil || len(s.Local) <= vecMaxSlice
		serr := statusErr(h.status)
		payload := e.m == nil && serr == nil && s.Op == driver.Read
		if payload {
			l.reading = true
		} else {
			l.done++ // a reply without payload is received whole: one lock
		}
		l.mu.Unlock()

		var rerr error
		switch {
		case e.m != nil:
			if h.length != 0 {
				rerr = fmt.Errorf("%w: mark reply with %d bytes of payload from %s", ErrProtocol, h.length, l.p.addr)
			}
		case payload:
			if h.length != uint64(len(s.Local)) {
				rerr = fmt.Errorf("%w: READ reply of %d bytes for %d from %s", ErrProtocol, h.length, len(s.Local), l.p.addr)
			} else if err := fr.payload(s.Local); err != nil {
				rerr = l.connErr(c, err)
			}
			l.mu.Lock()
			if l.conn == c { // else the next connection's reader may be reading
				l.reading = false
			}
			l.done++
			l.mu.Unlock()
		case h.length != 0:
			rerr = fmt.Errorf("%w: reply with %d bytes of payload from %s", ErrProtocol, h.length, l.p.addr)
		}
		switch {
		case rerr != nil:
			// Fail the lane first: a retry of s must find the lane
			// without a connection and dial a fresh one, not queue
			// behind the broken one.
			l.fail(c, rerr)
			l.ctr.failures.Add(1)
			doneItems([]item{e.item}, rerr)
			return rerr
		case e.m != nil:
			e.m.done(serr)
		case serr != nil:
			l.ctr.failures.Add(1)
			s.Done(0, serr)
		default:
			l.ctr.bytes[s.Op%3].Add(uint64(len(s.Local)))
			l.ctr.slices[s.Op%3].Add(1)
			s.Done(uint64(len(s.Local)), nil)
		}
		cost.Complete.Since(c0)
	}
}

// readVector completes the requests of a vector reply h; an error ends
// the connection.
func (l *lane) readVector(c *net.TCPConn, fr *frameReader, v *vecBufs, h *header) error {
	n := int(h.addr)
	op := driver.Write
	if h.op == opReadV|opReply {
		op = driver.Read
	}
	l.mu.Lock()
	if l.conn != c {
		l.mu.Unlock()
		return l.connErr(c, net.ErrClosed)
	}
	ok := l.ring.n >= n
	for k := 0; ok && k < n; k++ {
		e := l.ring.at(k)
		ok = e.m == nil && e.s.Op == op && e.id == h.id+uint64(k)
	}
	if !ok {
		l.mu.Unlock()
		return fmt.Errorf("%w: unexpected reply (%v) from %s", ErrProtocol, *h, l.p.addr)
	}
	if v.its == nil {
		v.its = make([]item, 0, maxVec)
		v.st = make([]byte, maxVec)
		v.dst = make([][]byte, 0, maxVec)
		v.done = make([]*driver.Slice, 0, maxVec)
	}
	its := v.its[:n]
	for k := range its {
		e, _ := l.ring.peek()
		its[k] = e.item
		l.ring.pop()
	}
	l.reading = true
	l.mu.Unlock()

	rerr := l.readVectorData(c, fr, v, h, its)
	l.mu.Lock()
	if l.conn == c { // else the next connection's reader may be reading
		l.reading = false
	}
	l.done += uint64(n)
	l.mu.Unlock()
	if rerr != nil {
		l.fail(c, rerr) // first, as for a plain reply
		l.ctr.failures.Add(uint64(n))
		doneItems(its, rerr)
		clear(its)
		return rerr
	}
	done := v.done[:0]
	var bytes uint64
	for k, it := range its {
		if serr := statusErr(status(v.st[k])); serr != nil {
			l.ctr.failures.Add(1)
			it.s.Done(0, serr)
			continue
		}
		bytes += uint64(len(it.s.Local))
		done = append(done, it.s)
	}
	if len(done) > 0 {
		l.ctr.bytes[op%3].Add(bytes)
		l.ctr.slices[op%3].Add(uint64(len(done)))
		driver.DoneAll(done)
	}
	clear(done)
	clear(its)
	return nil
}

// readVectorData reads a vector reply's statuses (into v.st) and READ
// payloads.
func (l *lane) readVectorData(c *net.TCPConn, fr *frameReader, v *vecBufs, h *header, its []item) error {
	n := len(its)
	st := v.st[:n]
	switch h.status {
	case statusOK:
		clear(st)
	case statusVec:
		if err := fr.head(st); err != nil {
			return l.connErr(c, err)
		}
	default:
		return fmt.Errorf("%w: vector reply (%v) from %s", ErrProtocol, *h, l.p.addr)
	}
	if h.op == opWriteV|opReply {
		if h.length != 0 {
			return fmt.Errorf("%w: reply with %d bytes of payload from %s", ErrProtocol, h.length, l.p.addr)
		}
		return nil
	}
	dst := v.dst[:0]
	var want uint64
	for k, it := range its {
		if st[k] == byte(statusOK) {
			dst = append(dst, it.s.Local)
			want += uint64(len(it.s.Local))
		}
	}
	if h.length != want {
		clear(dst)
		return fmt.Errorf("%w: READ reply of %d bytes for %d from %s", ErrProtocol, h.length, want, l.p.addr)
	}
	err := fr.readv(dst)
	clear(dst)
	if err != nil {
		return l.connErr(c, err)
	}
	return nil
}

// cause returns why c (nil: the lane's last connection) was failed, or
// otherwise.
func (l *lane) cause(c *net.TCPConn, otherwise error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failedErr != nil && (c == nil || l.failedConn == c) {
		return l.failedErr
	}
	return otherwise
}

// fail closes c and fails every request in flight on it, once: only while
// c is still the lane's connection.
func (l *lane) fail(c *net.TCPConn, err error) {
	l.mu.Lock()
	if l.conn != c {
		l.mu.Unlock()
		c.Close()
		return
	}
	l.conn, l.rw = nil, nil
	rd := l.rd
	if l.closed {
		err = fmt.Errorf("%w (%v)", errPeerClosed, err)
	}
	l.failedConn, l.failedErr = c, err
	c.Close()
	failed := make([]item, 0, l.ring.n)
	for {
		e, ok := l.ring.peek()
		if !ok {
			break
		}
		l.ring.pop()
		failed = append(failed, e.item)
	}
	l.ctr.failures.Add(uint64(len(failed)))
	if l.writing {
		// The writer completes them once its writev has returned.
		l.deferred = append(l.deferred, failed...)
		if l.deferErr == nil {
			l.deferErr = err
		}
		failed = nil
	}
	l.mu.Unlock()
	if rd != nil && rd.c == c {
		rd.wake() // a parked reader ends with its connection
	}
	if len(failed) > 0 {
		l.p.t.log.Debug("tcp: lane failed", "peer", l.p.name, "addr", l.p.addr, "requests", len(failed), "err", err)
	}
	doneItems(failed, err)
}

// checkStall counts watchdog ticks without progress while requests are
// outstanding, and fails the lane after limit of them.
func (l *lane) checkStall(limit int) {
	l.mu.Lock()
	c := l.conn
	if c == nil || (l.ring.n == 0 && !l.reading) || l.done != l.lastDone {
		l.lastDone = l.done
		l.stall = 0
		l.mu.Unlock()
		return
	}
	l.stall++
	stalled := l.stall >= limit
	l.mu.Unlock()
	if stalled {
		l.fail(c, ErrTimeout)
	}
}
