package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/rdmago/te/internal/sock"
)

// A caller of the engine's Wait reads its lane's replies itself
// (driver.Helper). Otherwise the lane's reader goroutine, woken by the
// poller, completes the batch and readies the waiter, and the runtime
// wakes an idle thread for it that finds nothing to do: on loopback that
// second hand-off costs as much as a tenth of a 4 KiB batch. A waiter
// parked in the poller is woken there once, and runs on the thread that
// polled.
//
// Only one goroutine reads a connection at a time, and the reading
// passes only between frames, under the lane's lock:
//
//   - rGoroutine: the reader goroutine reads (or waits in the poller).
//   - rIdle: nobody reads; the lane had nothing in flight when its reader
//     stopped at a frame boundary, and the goroutine is parked (park).
//     It stops so only while callers of Wait help (Transport.wanted): a
//     dead peer is then noticed at the lane's next request, which fails
//     and is retried on a fresh connection like any broken lane's.
//   - rClaim: a request was written while idle: the reader is listed for
//     a waiter (Transport.claims). A waiter that takes it reads; a claim
//     that no waiter took within one to two ticks goes back to the
//     goroutine (and the lanes stop going idle until a waiter helps
//     again), as does a failure and Close.
//   - rWaiter: a waiter reads, until its batch is done (then the lane
//     goes idle if nothing else is in flight, else back to the
//     goroutine) or it is kicked out of its wait for the next reply: at
//     a tick after its ctx ended or its batch finished on other lanes.
//
// The tick is the reader's timer, armed while a claim or a waiter may
// need it and left running across batches rather than stopped and set
// per batch: a timer set per batch (or a read deadline per wait) made
// the runtime break its poller's sleep once a batch, which cost about
// what the waiter's reading saved. Kicking a waiter sets a read deadline
// in the past only while it waits for a header's first byte (inHeader),
// and the waiter clears it before it reads on, so no frame is cut.
//
// The goroutine stays until its connection has failed and no waiter
// reads it, so Close, which joins it, never returns while a waiter may
// still complete a slice of the connection.
type rmode uint8

const (
	rGoroutine rmode = iota
	rIdle
	rClaim
	rWaiter
)

// readerTick is the reader timer's period: a claim waits one to two of
// them for a waiter (callers that poll Status instead of waiting pay
// that once, then the lanes stop going idle until a caller of Wait helps
// again), and a waiter sees its ctx end within two. A variable for tests.
var readerTick = 5 * time.Millisecond

var (
	errYield    = errors.New("tcp: reader idle")
	errHandBack = errors.New("tcp: reading handed back")
)

// reader is who reads one connection's replies.
type reader struct {
	l   *lane
	c   *net.TCPConn
	fr  *frameReader
	hb  [headerLen]byte
	vec vecBufs // a vector reply's scratch

	// under l.mu
	mode     rmode
	armed    bool   // timer running
	ticks    uint64 // timer expiries
	claimed  uint64 // ticks at the claim (rClaim)
	wctx     context.Context
	wdone    func() bool
	inHeader bool // the waiter waits for a header's first byte
	small    bool // the last reply was for slices of at most vecMaxSlice
	kicked   bool // a past read deadline was set for it

	kick   chan struct{} // wakes the parked goroutine
	timer  *time.Timer
	listed bool // in Transport.claims; under Transport.cmu
}

func newReader(l *lane, c *net.TCPConn, rw *sock.RawIO) *reader {
	r := &reader{l: l, c: c, fr: newFrameReader(c, rw), kick: make(chan struct{}, 1)}
	r.fr.exactAfterVec = true
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	return r
}

func (r *reader) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// arm starts the timer unless it runs; l.mu is held.
func (r *reader) arm() {
	if !r.armed {
		r.armed = true
		r.timer.Reset(readerTick)
	}
}

// offer lists an idle reader for a waiter, a request having been
// written; l.mu is held.
func (r *reader) offer() {
	r.mode = rClaim
	r.claimed = r.ticks
	r.arm()
	t := r.l.p.t
	t.cmu.Lock()
	if !r.listed {
		r.listed = true
		t.claims = append(t.claims, r)
	}
	t.cmu.Unlock()
}

// park waits, the goroutine having stopped reading, until it reads again:
// its claim expired or was released, a waiter handed back, or the
// connection failed.
func (r *reader) park() {
	l := r.l
	for {
		tick := false
		select {
		case <-r.kick:
		case <-r.timer.C:
			tick = true
		}
		l.mu.Lock()
		if tick {
			r.armed = false
			r.ticks++
		}
		live := l.conn == r.c && !l.closed
		switch {
		case !live && r.mode != rWaiter:
		case r.mode == rClaim && tick && r.ticks-r.claimed >= 2:
			// No waiter came: read, and let the lanes stop going
			// idle until one helps again.
			l.p.t.wanted.Store(false)
		case r.mode == rClaim:
			r.arm()
			fallthrough
		case r.mode == rIdle:
			// A stale kick (a failure's, a hand-back's the goroutine
			// was not parked for), or a tick.
			l.mu.Unlock()
			continue
		case r.mode == rWaiter:
			// The waiter hands back with a kick, the connection's
			// failure included; kick it out of its wait when its
			// ctx ended or its batch finished elsewhere.
			if tick {
				if r.inHeader && !r.kicked && r.wctx != nil && (r.wctx.Err() != nil || r.wdone()) {
					r.kicked = true
					r.c.SetReadDeadline(time.Unix(1, 0))
				}
				r.arm()
			}
			l.mu.Unlock()
			continue
		}
		r.mode = rGoroutine
		l.mu.Unlock()
		return
	}
}

// help reads the replies of a listed lane for a caller of Wait, when
// only one is listed (a submission on one lane: below 4 MiB, where the
// hand-off costs most against the bytes). Several listed lanes (a large
// submission, or several callers' batches) go back to their goroutines
// at once, which read them in parallel: one waiter reading one of them
// measured slower at 1 MiB x 32 than the goroutines (READ 3.88 against
// 3.28-3.40 GB/s, three rounds at load 1.5-2.5).
func (t *Transport) help(ctx context.Context, done func() bool) {
	if !t.wanted.Load() {
		t.wanted.Store(true)
	}
	var mine *reader
	several := false
	for {
		t.cmu.Lock()
		n := len(t.claims)
		if n == 0 {
			t.cmu.Unlock()
			break
		}
		r := t.claims[n-1]
		t.claims[n-1] = nil
		t.claims = t.claims[:n-1]
		r.listed = false
		t.cmu.Unlock()
		switch {
		case mine == nil && !several:
			mine = r
		default:
			if mine != nil {
				mine.release()
				mine = nil
			}
			several = true
			r.release()
		}
	}
	switch {
	case mine == nil:
	case !done() && ctx.Err() == nil:
		mine.help(ctx, done)
	default:
		mine.release() // others' requests: not left to the claim's ticks
	}
}

// release gives a claimed reader to its goroutine.
func (r *reader) release() {
	l := r.l
	l.mu.Lock()
	if r.mode != rClaim {
		l.mu.Unlock()
		return
	}
	r.mode = rGoroutine
	l.mu.Unlock()
	r.wake()
}

// help takes r from its claim and reads until done, then passes the
// reading on.
func (r *reader) help(ctx context.Context, done func() bool) {
	l := r.l
	l.mu.Lock()
	if r.mode != rClaim || l.conn != r.c || l.closed {
		l.mu.Unlock()
		return
	}
	r.mode = rWaiter
	r.wctx, r.wdone = ctx, done
	r.arm()
	l.mu.Unlock()
	err := l.readReplies(r, ctx, done)
	l.mu.Lock()
	r.wctx, r.wdone = nil, nil
	l.mu.Unlock()
	if err == errYield {
		return
	}
	if err != errHandBack {
		l.fail(r.c, err)
	}
	l.mu.Lock()
	r.mode = rGoroutine
	l.mu.Unlock()
	r.wake()
}

// waitHeader reads the next header for a waiter, which a tick may kick
// out of its wait for the first byte: then it returns errIdle, having
// consumed nothing.
func (r *reader) waitHeader() error {
	fr := r.fr
	if fr.ready() {
		return fr.header(&r.hb, 0)
	}
	l := r.l
	l.mu.Lock()
	r.inHeader = true
	l.mu.Unlock()
	raw := fr.direct && fr.br.Buffered() == 0
	n := 0
	var err error
	if raw {
		n, err = fr.rw.Read(r.hb[:])
	} else if fr.br.Buffered() == 0 {
		_, err = fr.br.Peek(1)
	}
	l.mu.Lock()
	r.inHeader = false
	kicked := r.kicked
	r.kicked = false
	l.mu.Unlock()
	if kicked {
		r.c.SetReadDeadline(time.Time{})
		if err != nil && n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			return errIdle
		}
	}
	if err != nil {
		return err
	}
	switch {
	case raw && n < headerLen:
		_, err = io.ReadFull(fr.rw, r.hb[n:])
	case !raw:
		_, err = io.ReadFull(fr.br, r.hb[:])
	}
	return err
}
