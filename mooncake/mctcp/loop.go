package mctcp

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/sock"
)

// The target's event loop: one goroutine waits on its own epoll
// (sock.Poller) for the listener and every connection, and drives each
// connection through a small state machine (header, payload into memory,
// answer, next header or close). Mooncake's initiator opens a connection
// per request unless pooled; served by a goroutine each, a connection
// costs a hand-off (the accepting goroutine wakes a server on another
// thread), its registration with the runtime's poller (os.NewFile's
// fcntl, epoll_ctl) and the runtime's wake-ups of its monitor. Here a
// ready socket is served by the goroutine that waited, with system calls
// the scheduler is not told about but the wait itself.

// Connection states.
const (
	stHeader  = iota // reading a request's header (hn bytes so far)
	stPayload        // reading a WRITE's payload into mem[off:]
	stAnswer         // writing out: a status word, a READ's payload
)

// lconn is one connection of the loop; slots are reused, gen tells a
// slot's connections apart in the poller's tokens.
type lconn struct {
	fd    int
	idx   uint32
	gen   uint32
	src   netip.Addr
	peer  netip.AddrPort
	state uint8
	v2    bool
	last  bool // close once the answer is out (a rejection)
	out   bool // the poller watches output too
	// drained: the last read took all the socket had (a short read or
	// none), so the poller reports what arrives next: no read is tried
	// before it does. A connection per request thus costs no read that
	// finds nothing. Once the poller reported the peer's shutdown (hup),
	// which it reports once, only a read that finds nothing or the end
	// counts: a FIN queued behind the bytes a short read took brings no
	// further report.
	drained, hup bool
	// lane: c has answered a request before, so its initiator sends
	// requests down it one after another (Mooncake's pooled lanes); a
	// large payload's rest is read with ReadWaitFD (waitFrom). bound:
	// its SO_RCVTIMEO is set (waitBound).
	lane, bound bool
	hb          [headerLen]byte
	rb          [readAhead]byte // rb[rs:re]: read ahead of the request at hand
	rs, re      int
	mark        int // the socket's wake-up mark (SO_RCVLOWAT), 0 for none
	st          [statusLen]byte
	mem         []byte        // WRITE: where the payload lands; READ: what is sent
	off         int           // payload bytes read
	r           driver.Region // pins mem until done with it
	ans         [2][]byte     // what is left to write: status word, READ payload
	// waiting: since when it waits for its initiator's next request (0
	// while in one); stalled: since when it waits mid-request, for the
	// rest of it or for its answer to leave (0 otherwise), closed once
	// that lasts IOTimeout. Both from the watchdog's clock.
	waiting, stalled int64
	// queued: its token is on the run list, once however often the
	// poller reports it meanwhile: a connection gets one pass a round.
	queued bool
}

func (c *lconn) token() uint64 { return uint64(c.gen)<<32 | uint64(c.idx) }

// listenToken marks the listener's events: no slot has this index.
const listenToken = 1<<32 - 1

const (
	loopEvents = 256
	// readAhead is what a header's read asks for: the headers of
	// pipelined requests and the start of a payload come with it.
	readAhead = 256
	// serveBudget bounds the requests one connection is served in a row
	// before the others' turn: a pooled initiator that keeps its
	// connection full cannot starve the rest.
	serveBudget = 16
	// acceptBurst bounds the connections accepted in a row.
	acceptBurst = 64
	// acceptPause: accept4 failed for want of a resource (descriptors,
	// memory); the listener is left alone this long.
	acceptPause = 50 * time.Millisecond
	// yieldEvery: the loop yields to the scheduler (runtime.Gosched) at
	// least this often while it has work. The runtime's monitor (sysmon)
	// takes a goroutine that has not been rescheduled for 10 ms for a
	// long-running one: it preempts it and, when it is in a system call
	// (the loop's wait), takes its P away, which the loop's next call
	// must win back, and each such take sends the monitor back to
	// polling every 20 µs (under Mooncake's pooled initiator: 0.13
	// monitor wake-ups and a fifth more target CPU per 64 KiB request).
	// A yield costs a wake-up of an idle thread; 4 ms keeps them few
	// and the gap between two reschedules under 10 ms.
	yieldEvery = 4 * time.Millisecond
	// waitFrom: on a lane (lconn.lane), a WRITE's payload with more than
	// this missing is read by a read that waits in the kernel, at most
	// waitBound, instead of behind a wake-up mark and the poller. Under
	// Mooncake's pooled initiator a 1 MiB WRITE left queued behind a mark
	// and taken in one or two reads made the initiator's stack take more
	// slow-path ACKs and pacing deferrals, and pieces read on the
	// poller's wake-ups cost the target a wake-up each
	// (docs/measurements.md); a sleeping read is woken inside the kernel
	// and copies what arrived at once. The loop serves no other
	// connection meanwhile: waitBound bounds that, and a wait that ends
	// short hands the rest back to the poller. From 16 KiB rather than
	// 64 KiB, the pooled 32 KiB and 64 KiB WRITE cells went from
	// 0.87-1.13 of Mooncake's target to 1.02-1.26; te's own lanes
	// measured the same.
	waitFrom  = 16 << 10
	waitBound = 2 * time.Millisecond
	// answerChunk: on a lane, an answer goes out in passes, as
	// Mooncake's target writes it: the status word alone, then the READ
	// payload at most this much a write, and between two passes the
	// loop serves its other connections (the lane waits on the run
	// list). Under Mooncake's pooled initiator (four lanes, one reader
	// thread) the kernel's copy of a payload into the socket cost te's
	// target 2.7 times Mooncake's a byte while it wrote a lane's whole
	// answer, status and payload together; in passes, pooled 64 KiB and
	// 1 MiB READs went from 0.73-0.84 of Mooncake's target to 0.95-1.10
	// (docs/measurements.md). Every pass but the last is written with
	// MSG_MORE (Vec.WriteMore): its short last segment (TCP_NODELAY is
	// set) joins the next pass's, which took pooled READs to 1.00-1.20.
	// A connection per request (not a lane) gets passes too once its
	// answer is over answerChunk: Mooncake's default-mode 1 MiB READ
	// then beat one writev in 13 of 16 interleaved rounds (+5% mean);
	// a 64 KiB one is still written whole.
	answerChunk = 64 << 10
)

type loop struct {
	t     *Transport
	p     *sock.Poller
	ln    *sock.RawListener
	vec   *sock.Vec
	marks sock.Marks
	rd    [2][]byte // a payload read's buffers

	slots     []*lconn
	free      []uint32
	live      int
	perSource map[netip.Addr]int
	run       []uint64 // tokens of connections left with work to do
	runNext   []uint64

	tick     time.Duration
	lastScan int64
	paused   int64     // the listener's pause ends (unix nanoseconds), or 0
	yielded  time.Time // the loop's last yield (yieldEvery)
}

func newLoop(t *Transport, p *sock.Poller, ln *sock.RawListener) *loop {
	return &loop{
		t: t, p: p, ln: ln, vec: sock.NewVec(2),
		perSource: map[netip.Addr]int{},
		tick:      max(t.cfg.IOTimeout/12, time.Millisecond),
	}
}

// serve runs the loop until the transport closes, then closes every
// connection and the listener (Transport.Close closes the poller).
func (l *loop) serve() {
	defer l.t.wg.Done()
	defer l.shutdown()
	l.lastScan = l.t.clock.Load()
	for {
		if time.Since(l.yielded) >= yieldEvery {
			runtime.Gosched()
			l.yielded = time.Now()
		}
		timeout := l.tick
		if len(l.run) > 0 {
			timeout = 0
		}
		n, _, err := l.p.Wait(timeout)
		if l.t.ctx.Err() != nil {
			return
		}
		if err != nil {
			l.t.log.Error("mctcp: target's poller failed; no longer serving", "err", err)
			return
		}
		for i := range n {
			tok, ev := l.p.Event(i)
			if tok == listenToken {
				l.accept()
				continue
			}
			if c := l.conn(tok); c != nil {
				c.drained = false
				c.hup = c.hup || ev&sock.Hup != 0
				l.step(c)
			}
		}
		if len(l.run) > 0 {
			l.run, l.runNext = l.runNext[:0], l.run
			if runRoundHook != nil {
				runRoundHook(l.runNext)
			}
			for _, tok := range l.runNext {
				if c := l.conn(tok); c != nil {
					c.queued = false
					l.step(c)
				}
			}
			clear(l.runNext)
		}
		now := l.t.clock.Load()
		if now-l.lastScan >= int64(l.tick) {
			l.lastScan = now
			l.scan(now)
		}
	}
}

// runRoundHook, when a test sets it, sees each round's run list.
var runRoundHook func(run []uint64)

// queue puts c on the run list, unless it is there already.
func (l *loop) queue(c *lconn) {
	if !c.queued {
		c.queued = true
		l.run = append(l.run, c.token())
	}
}

// conn is the connection of a token; nil once that one closed.
func (l *loop) conn(tok uint64) *lconn {
	idx := uint32(tok)
	if int(idx) >= len(l.slots) {
		return nil
	}
	c := l.slots[idx]
	if c.fd < 0 || c.gen != uint32(tok>>32) {
		return nil
	}
	return c
}

// scan closes the connections stalled mid-request for IOTimeout (a
// stamp is up to a tick early: closed once it is IOTimeout and a tick
// old), and takes the listener back after a pause.
func (l *loop) scan(now int64) {
	since := now - int64(l.t.cfg.IOTimeout+l.tick)
	for _, c := range l.slots {
		if c.fd >= 0 && c.stalled != 0 && c.stalled <= since {
			l.t.log.Debug("mctcp: connection stalled mid-request; closed", "remote", c.peer, "io_timeout", l.t.cfg.IOTimeout)
			l.close(c, nil)
		}
	}
	if l.paused != 0 && now >= l.paused {
		if err := l.p.AddListener(l.ln, listenToken); err != nil {
			l.t.log.Error("mctcp: listener not resumed", "err", err)
			return
		}
		l.paused = 0
	}
}

func (l *loop) accept() {
	for range acceptBurst {
		fd, peer, err := l.ln.Accept()
		if err == sock.ErrWouldBlock {
			return
		}
		if err != nil {
			// Out of descriptors or memory: the listener stays
			// readable, so it is set aside for a while rather than
			// spun on.
			l.t.log.Warn("mctcp: accept failed; pausing the listener", "addr", l.ln.Addr(), "err", err, "pause", acceptPause)
			if err := l.p.RemoveListener(l.ln); err == nil {
				l.paused = l.t.clock.Load() + int64(acceptPause)
			}
			return
		}
		l.admit(fd, peer)
	}
}

// admit serves fd unless the target is at a bound and no connection can
// make room: then the one that has waited longest for its initiator is
// closed instead, so held connections cannot lock initiators out.
func (l *loop) admit(fd int, peer netip.AddrPort) {
	src := peer.Addr()
	full := l.live >= l.t.cfg.MaxConns
	srcFull := l.perSource[src] >= l.t.cfg.MaxConnsPerSource
	if full || srcFull {
		var victim *lconn
		for _, c := range l.slots {
			if c.fd < 0 || c.waiting == 0 || (srcFull && c.src != src) {
				continue
			}
			if victim == nil || c.waiting < victim.waiting {
				victim = c
			}
		}
		if victim == nil {
			sock.CloseFD(fd)
			l.t.log.Debug("mctcp: connection refused: every slot busy", "remote", peer)
			return
		}
		l.close(victim, nil)
	}
	var c *lconn
	if k := len(l.free); k > 0 {
		c = l.slots[l.free[k-1]]
		l.free = l.free[:k-1]
	} else {
		c = &lconn{idx: uint32(len(l.slots))}
		l.slots = append(l.slots, c)
	}
	c.fd, c.src, c.peer = fd, src, peer
	c.state, c.last, c.out, c.drained, c.hup = stHeader, false, false, true, false
	c.lane, c.bound, c.queued = false, false, false
	c.rs, c.re, c.mark = 0, 0, 0
	c.waiting, c.stalled = l.t.clock.Load(), 0
	l.live++
	l.perSource[src]++
	// Watched from now on: a header that came with the connection is
	// reported at once.
	if err := l.p.Add(fd, c.token()); err != nil {
		l.close(c, err)
	}
}

// close closes c and frees its slot; err (unless the peer's closing) is
// logged.
func (l *loop) close(c *lconn, err error) {
	if err != nil && !errors.Is(err, io.EOF) {
		l.t.log.Debug("mctcp: serve connection", "remote", c.peer, "err", err)
	}
	if c.r != nil {
		c.r.Release()
		c.r = nil
	}
	c.mem = nil
	c.ans = [2][]byte{}
	sock.CloseFD(c.fd)
	c.fd = -1
	c.gen++
	c.waiting, c.stalled = 0, 0
	l.live--
	if l.perSource[c.src]--; l.perSource[c.src] <= 0 {
		delete(l.perSource, c.src)
	}
	l.free = append(l.free, c.idx)
}

// step serves c until its socket has nothing more for now (or it has
// been served serveBudget requests: then it waits on the run list).
func (l *loop) step(c *lconn) {
	waited := false // a wait ended short: no other until the poller reports c
	for budget := serveBudget; ; {
		switch c.state {
		case stHeader:
			if c.re-c.rs >= headerLen {
				copy(c.hb[:], c.rb[c.rs:])
				c.rs += headerLen
				c.waiting, c.stalled = 0, 0
				if !l.request(c) {
					return
				}
				continue
			}
			if c.drained {
				if c.mark != 0 {
					if err := l.marks.Set(c.fd, 0, &c.mark); err != nil {
						l.close(c, err)
						return
					}
				}
				now := l.t.clock.Load()
				if c.re == c.rs {
					c.stalled = 0
					if c.waiting == 0 {
						c.waiting = now
					}
				} else {
					c.waiting, c.stalled = now, now
				}
				return
			}
			if c.rs > 0 {
				c.re = copy(c.rb[:], c.rb[c.rs:c.re])
				c.rs = 0
			}
			n, err := sock.ReadFD(c.fd, c.rb[c.re:])
			if err == sock.ErrWouldBlock {
				c.drained = true
				continue
			}
			if err != nil {
				if err == io.EOF && c.re > 0 {
					err = io.ErrUnexpectedEOF
				}
				l.close(c, err)
				return
			}
			c.drained = n < len(c.rb)-c.re && !c.hup
			c.re += n
		case stPayload:
			if c.re > c.rs {
				k := copy(c.mem[c.off:], c.rb[c.rs:c.re])
				c.rs += k
				c.off += k
			} else if rest := len(c.mem) - c.off; c.drained && c.lane && !waited && rest > waitFrom {
				if !l.await(c) {
					return
				}
				waited = c.off < len(c.mem)
			} else if c.drained {
				// Wake-up marks for large payloads (server.go's
				// lowatFrom): the rest, up to lowatMax.
				if rest := len(c.mem) - c.off; rest > lowatFrom || c.mark != 0 {
					want := 0
					if rest > lowatFrom {
						want = min(rest, lowatMax)
					}
					if err := l.marks.Set(c.fd, want, &c.mark); err != nil {
						l.close(c, err)
						return
					}
				}
				c.stalled = l.t.clock.Load()
				return
			} else {
				// The payload's rest, and what follows it.
				c.rs, c.re = 0, 0
				l.rd = [2][]byte{c.mem[c.off:], c.rb[:]}
				n, err := l.vec.Read(c.fd, l.rd[:])
				l.rd = [2][]byte{}
				if err == sock.ErrWouldBlock {
					c.drained = true
					continue
				}
				if err != nil {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					l.close(c, err)
					return
				}
				rest := len(c.mem) - c.off
				c.drained = n < rest+len(c.rb) && !c.hup
				k := min(n, rest)
				c.off += k
				c.re = n - k
			}
			if c.off < len(c.mem) {
				continue
			}
			c.r.Release()
			c.r, c.mem = nil, nil
			l.answer(c, statusOK, nil)
		case stAnswer:
			out := c.ans
			more, pass := false, c.lane || len(out[1]) > answerChunk
			if pass {
				// A pass (answerChunk): the status word, or a chunk;
				// a short segment at its end waits for the next pass.
				if len(out[0]) > 0 {
					out[1] = nil
				} else if len(out[1]) > answerChunk {
					out[1] = out[1][:answerChunk]
				}
				more = len(out[1]) < len(c.ans[1])
			}
			var n int
			var err error
			if more {
				n, err = l.vec.WriteMore(c.fd, out[:])
			} else {
				n, err = l.vec.Write(c.fd, out[:])
			}
			if err == sock.ErrWouldBlock {
				c.stalled = l.t.clock.Load()
				if !c.out {
					if err := l.p.WatchOut(c.fd, c.token()); err != nil {
						l.close(c, err)
						return
					}
					c.out = true
				}
				return
			}
			if err != nil {
				l.close(c, err)
				return
			}
			for i := range c.ans {
				k := min(n, len(c.ans[i]))
				c.ans[i] = c.ans[i][k:]
				n -= k
			}
			if len(c.ans[0])+len(c.ans[1]) > 0 {
				if pass {
					l.queue(c)
					return
				}
				continue
			}
			c.stalled = 0
			if c.r != nil {
				c.r.Release()
				c.r, c.mem = nil, nil
			}
			if c.last {
				l.close(c, nil)
				return
			}
			c.state, c.lane = stHeader, true
			if budget--; budget == 0 {
				l.queue(c)
				return
			}
		}
	}
}

// await reads the rest of c's payload with a read that waits in the
// kernel (waitFrom); false if it closed c.
func (l *loop) await(c *lconn) bool {
	if err := l.marks.Set(c.fd, 0, &c.mark); err != nil {
		l.close(c, err)
		return false
	}
	if !c.bound {
		if err := sock.SetWaitBound(c.fd, waitBound); err != nil {
			l.close(c, err)
			return false
		}
		c.bound = true
	}
	n, err := sock.ReadWaitFD(c.fd, c.mem[c.off:])
	if err == sock.ErrWouldBlock {
		return true
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		l.close(c, err)
		return false
	}
	c.off += n
	// What came meanwhile is unknown (the poller will report it too).
	c.drained = false
	return true
}

// request starts serving the header in c.hb; false if it closed c.
func (l *loop) request(c *lconn) bool {
	h := decodeHeader(c.hb[:])
	c.v2 = h.op&opV2 != 0
	op := h.op &^ opV2
	if op != opRead && op != opWrite {
		// Mooncake serves unknown opcodes as READs; te refuses them.
		return l.reject(c, fmt.Errorf("%w %#x", errUnknownOp, h.op))
	}
	if h.size == 0 {
		return l.reject(c, errors.New("mctcp: request of 0 bytes"))
	}
	mem, r, err := l.t.host.AcquireLocal(h.addr, h.size)
	if err != nil {
		return l.reject(c, err)
	}
	c.mem, c.r = mem, r
	if op == opWrite {
		c.state, c.off = stPayload, 0
		return true
	}
	l.answer(c, statusOK, mem)
	return true
}

// answer queues c's answer: a status word unless v1, then payload (a
// READ's, which c.r pins until written).
func (l *loop) answer(c *lconn, code uint32, payload []byte) {
	c.ans = [2][]byte{nil, payload}
	if c.v2 {
		encodeStatus(c.st[:], code)
		c.ans[0] = c.st[:]
	}
	c.state = stAnswer
}

// reject answers a refused request as Mooncake does (status 1 under v2,
// nothing under v1) and ends the connection: a rejected WRITE's payload
// is not read, so the stream cannot continue. False if c is closed now.
func (l *loop) reject(c *lconn, why error) bool {
	if errors.Is(why, driver.ErrOutOfRange) || errors.Is(why, driver.ErrMemoryBusy) {
		l.t.log.Debug("mctcp: request rejected", "remote", c.peer, "err", why)
	} else {
		l.t.log.Debug("mctcp: serve connection", "remote", c.peer, "err", why)
	}
	if !c.v2 {
		l.close(c, nil)
		return false
	}
	l.answer(c, statusBad, nil)
	c.last = true
	return true
}

// shutdown closes every connection and the listener.
func (l *loop) shutdown() {
	for _, c := range l.slots {
		if c.fd >= 0 {
			l.close(c, nil)
		}
	}
	l.ln.Close()
}
