package mctcp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// maxPerWrite bounds the requests gathered into one writev (two iovecs
// each, below the kernel's 1024).
const maxPerWrite = 256

// laneShare is the bytes of one submission that justify one more lane (as
// in te's own tcp transport).
const laneShare = 4 << 20

// peer is the initiator's state for one remote segment: its lanes.
type peer struct {
	t     *Transport
	name  string
	addr  string
	v2    bool
	lanes []*lane
	rr    atomic.Uint32

	closeOnce sync.Once
	wg        sync.WaitGroup
}

func newPeer(t *Transport, name, addr string, v2 bool) *peer {
	p := &peer{t: t, name: name, addr: addr, v2: v2}
	p.lanes = make([]*lane, t.cfg.Lanes)
	for i := range p.lanes {
		p.lanes[i] = &lane{p: p, kick: make(chan struct{}, 1),
			hdrs: make([]byte, maxPerWrite*headerLen), iov: make([][]byte, 0, 2*maxPerWrite)}
	}
	return p
}

// Close fails everything in flight to this peer and joins its goroutines.
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

// submit spreads ss over the lanes in contiguous runs, one lane per
// laneShare bytes, starting at a rotating lane. A retry goes to a lane
// without a connection (it dials afresh) when there is one.
func (p *peer) submit(ss []*driver.Slice) {
	if len(ss) == 1 && ss[0].Attempt() > 0 {
		p.freshLane().enqueue(ss)
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
		p.lanes[(start+i)%len(p.lanes)].enqueue(ss[:k])
		ss = ss[k:]
	}
}

func (p *peer) freshLane() *lane {
	for _, l := range p.lanes {
		l.mu.Lock()
		c := l.conn
		l.mu.Unlock()
		if c == nil {
			return l
		}
	}
	return p.lanes[int(p.rr.Add(1))%len(p.lanes)]
}

// ring is a FIFO of requests awaiting answers, in wire order.
type ring struct {
	buf     []*driver.Slice
	head, n int
}

func (r *ring) push(s *driver.Slice) {
	if r.n == len(r.buf) {
		nb := make([]*driver.Slice, max(16, 2*len(r.buf)))
		for i := 0; i < r.n; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = s
	r.n++
}

func (r *ring) pop() (*driver.Slice, bool) {
	if r.n == 0 {
		return nil, false
	}
	s := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return s, true
}

// lane is one persistent connection: a writer goroutine (started on first
// use) sends requests back to back; a reader per connection takes the
// answers in order (v2 status words and READ payloads; a v1 WRITE has no
// answer and completes once written).
type lane struct {
	p    *peer
	kick chan struct{}

	mu       sync.Mutex
	closed   bool
	started  bool
	pending  []*driver.Slice
	conn     *net.TCPConn
	ring     ring // requests on conn awaiting answers
	reading  bool // the reader holds a popped request
	writing  bool // a writev may still read payloads of ring entries
	deferred []*driver.Slice
	deferErr error
	failed   *net.TCPConn
	why      error
	done     uint64 // answers received, for the watchdog
	lastDone uint64
	stall    int

	// writer only
	spare []*driver.Slice
	v1w   []*driver.Slice // v1 WRITEs of the current writev
	hdrs  []byte
	iov   [][]byte
	bufs  net.Buffers
}

func (l *lane) enqueue(ss []*driver.Slice) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		doneAll(l.p.t, ss, errPeerClosed)
		return
	}
	l.pending = append(l.pending, ss...)
	if !l.started {
		l.started = true
		l.p.wg.Add(1)
		go l.writeLoop()
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func doneAll(t *Transport, ss []*driver.Slice, err error) {
	for _, s := range ss {
		t.finish(s, 0, err)
	}
}

func (l *lane) writeLoop() {
	defer l.p.wg.Done()
	for range l.kick {
		for {
			l.mu.Lock()
			if l.closed {
				batch := l.pending
				l.pending = nil
				l.mu.Unlock()
				doneAll(l.p.t, batch, errPeerClosed)
				return
			}
			if len(l.pending) == 0 {
				l.mu.Unlock()
				break
			}
			batch := l.pending
			l.pending = l.spare[:0]
			conn := l.conn
			l.mu.Unlock()
			if conn == nil {
				if err := l.connect(l.p.t.ctx); err != nil {
					doneAll(l.p.t, batch, err)
					l.recycle(batch)
					continue
				}
				l.mu.Lock()
				conn = l.conn
				l.mu.Unlock()
			}
			if conn == nil {
				doneAll(l.p.t, batch, l.cause(nil, errPeerClosed))
			} else {
				l.send(conn, batch)
			}
			l.recycle(batch)
		}
	}
}

func (l *lane) recycle(batch []*driver.Slice) {
	clear(batch)
	l.spare = batch[:0]
}

// connect dials the lane's connection (within DialTimeout) and starts its
// reader.
func (l *lane) connect(ctx context.Context) error {
	t := l.p.t
	ctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.p.addr)
	if err != nil {
		return fmt.Errorf("%w: dial %s at %s: %v", ErrConnection, l.p.name, l.p.addr, err)
	}
	tc := c.(*net.TCPConn)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		tc.Close()
		return errPeerClosed
	}
	l.conn = tc
	l.stall = 0
	l.p.wg.Add(1)
	go l.readLoop(tc)
	return nil
}

// send writes batch on conn, maxPerWrite requests per writev.
func (l *lane) send(conn *net.TCPConn, batch []*driver.Slice) {
	v2 := l.p.v2
	for len(batch) > 0 {
		k := min(len(batch), maxPerWrite)
		chunk := batch[:k]
		l.mu.Lock()
		if l.conn != conn {
			l.mu.Unlock()
			doneAll(l.p.t, batch, l.cause(conn, fmt.Errorf("%w: to %s at %s", ErrConnection, l.p.name, l.p.addr)))
			return
		}
		l.iov = l.iov[:0]
		l.v1w = l.v1w[:0]
		for i, s := range chunk {
			h := header{size: uint64(len(s.Local)), addr: s.RemoteAddr, op: opRead}
			if s.Op == driver.Write {
				h.op = opWrite
			}
			if v2 {
				h.op |= opV2
			}
			hb := l.hdrs[i*headerLen : (i+1)*headerLen : (i+1)*headerLen]
			h.encode(hb)
			if n := len(l.iov); n > 0 && i > 0 && s.Op != driver.Write && chunk[i-1].Op != driver.Write {
				// Adjacent READ headers go out as one iovec.
				l.iov[n-1] = l.hdrs[(i*headerLen)-len(l.iov[n-1]) : (i+1)*headerLen]
			} else {
				l.iov = append(l.iov, hb)
			}
			s.Posted()
			if s.Op == driver.Write {
				l.iov = append(l.iov, s.Local)
				if !v2 {
					l.v1w = append(l.v1w, s) // no answer comes
					continue
				}
			}
			l.ring.push(s)
		}
		l.writing = true
		l.mu.Unlock()
		batch = batch[k:]
		l.bufs = l.iov
		_, err := l.bufs.WriteTo(conn)
		l.bufs = nil
		clear(l.iov)
		if err != nil {
			err = fmt.Errorf("%w: write to %s at %s: %v", ErrConnection, l.p.name, l.p.addr, err)
			l.fail(conn, err)
		}
		l.mu.Lock()
		l.writing = false
		deferred, derr := l.deferred, l.deferErr
		l.deferred, l.deferErr = nil, nil
		l.mu.Unlock()
		doneAll(l.p.t, deferred, derr)
		for i, s := range l.v1w {
			l.v1w[i] = nil
			if err != nil {
				l.p.t.finish(s, 0, err)
			} else {
				l.p.t.finish(s, uint64(len(s.Local)), nil)
			}
		}
		if err != nil {
			doneAll(l.p.t, batch, err)
			return
		}
	}
}

func (l *lane) readLoop(c *net.TCPConn) {
	defer l.p.wg.Done()
	l.fail(c, l.readAnswers(c))
}

// readAnswers completes requests as their answers arrive, until the
// connection fails; it returns why.
func (l *lane) readAnswers(c *net.TCPConn) error {
	br := bufio.NewReaderSize(c, connBufSize)
	var st [statusLen]byte
	connErr := func(err error) error {
		return l.cause(c, fmt.Errorf("%w: read from %s at %s: %v", ErrConnection, l.p.name, l.p.addr, err))
	}
	v2 := l.p.v2
	direct := false // the last READ payload bypassed the buffer
	for {
		// Wait for the next answer's first byte before taking a request:
		// the writer may not have queued it yet. After a large payload
		// the status word is read exactly, so the payload behind it
		// lands in memory without passing through the buffer.
		pre := 0
		if v2 && direct && br.Buffered() == 0 {
			n, err := c.Read(st[:])
			if err != nil {
				return connErr(err)
			}
			pre = n
		} else if _, err := br.Peek(1); err != nil {
			return connErr(err)
		}
		l.mu.Lock()
		if l.conn != c {
			l.mu.Unlock()
			return connErr(net.ErrClosed)
		}
		s, ok := l.ring.pop()
		if !ok {
			l.mu.Unlock()
			return fmt.Errorf("%w: %s sent bytes nobody asked for", ErrProtocol, l.p.addr)
		}
		l.reading = true
		l.mu.Unlock()

		var serr, rerr error
		if v2 {
			var err error
			if pre > 0 {
				_, err = io.ReadFull(c, st[pre:])
			} else {
				_, err = io.ReadFull(br, st[:])
			}
			if err != nil {
				rerr = connErr(err)
			} else if code, err := decodeStatus(st[:]); err != nil {
				rerr = fmt.Errorf("%w (from %s)", err, l.p.addr)
			} else if code != statusOK {
				serr = errRejected
			}
		}
		direct = false
		if rerr == nil && serr == nil && s.Op == driver.Read {
			var err error
			if direct, err = readPayload(br, c, s.Local); err != nil {
				rerr = connErr(err)
			}
		}
		l.mu.Lock()
		l.reading = false
		l.done++
		l.mu.Unlock()
		switch {
		case rerr != nil:
			l.fail(c, rerr)
			l.p.t.finish(s, 0, rerr)
			return rerr
		case serr != nil:
			// The target closes after a rejection: the requests behind
			// this one fail with ErrConnection and are retried.
			l.fail(c, fmt.Errorf("%w: %s closed the connection after rejecting a range", ErrConnection, l.p.addr))
			l.p.t.finish(s, 0, serr)
			return serr
		default:
			l.p.t.finish(s, uint64(len(s.Local)), nil)
		}
	}
}

func (l *lane) cause(c *net.TCPConn, otherwise error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.why != nil && (c == nil || l.failed == c) {
		return l.why
	}
	return otherwise
}

// fail closes c and fails every request awaiting an answer on it, once.
func (l *lane) fail(c *net.TCPConn, err error) {
	l.mu.Lock()
	if l.conn != c {
		l.mu.Unlock()
		c.Close()
		return
	}
	l.conn = nil
	if l.closed {
		err = fmt.Errorf("%w (%v)", errPeerClosed, err)
	}
	l.failed, l.why = c, err
	c.Close()
	failed := make([]*driver.Slice, 0, l.ring.n)
	for {
		s, ok := l.ring.pop()
		if !ok {
			break
		}
		failed = append(failed, s)
	}
	if l.writing {
		// The writer completes them once its writev has returned: the
		// kernel may still be reading their memory.
		l.deferred = append(l.deferred, failed...)
		if l.deferErr == nil {
			l.deferErr = err
		}
		failed = nil
	}
	l.mu.Unlock()
	doneAll(l.p.t, failed, err)
}

// checkStall fails the lane after limit watchdog ticks without an answer
// while requests are outstanding.
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
