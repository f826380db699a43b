package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"

	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/sock"
)

// directRead is the payload size above which payload bytes bypass the
// connection's read buffer: what is already buffered is copied, the rest
// is read by the kernel straight into registered memory.
const directRead = 16 << 10

// frameReader reads frames from a connection: small frames through a read
// buffer, so one system call brings in many of them; large payloads
// straight into registered memory. After a large payload the read of the
// next header takes at most afterPayload bytes when nothing is buffered,
// so the payload behind it lands in memory without passing through the
// buffer (but for at most that much).
type frameReader struct {
	br     *bufio.Reader
	src    capReader       // br's source: rw, its fills capped after a large payload
	c      *net.TCPConn    // its deadlines bound rw's reads
	rw     *sock.RawIO     // c's reads, outside the scheduler
	vr     *sock.VecReader // made for the first vector
	direct bool            // the last payload was large
	// exactAfterVec makes a vector's payloads read straight into memory
	// count as a large payload: the next header's read is then capped, so
	// the payloads behind it do not pass through the buffer (the
	// initiator: a READV reply's header, then its payloads; the target:
	// a WRITEV's header, its entries (head), then its payloads), with no
	// copy of up to connBufSize bytes through the buffer.
	exactAfterVec bool
	// timeout, when set, bounds reading the rest of a frame once it has
	// begun (header, payload, discarded payload): a sender that stalls
	// mid-frame must not hold the connection, or keep the destination
	// region pinned.
	timeout time.Duration
}

// newFrameReader reads c through rw (pointed at c): system calls that do
// not enter the scheduler (sock.RawIO), so a reader woken for each reply
// or request does not wake the runtime's monitor thread.
func newFrameReader(c *net.TCPConn, rw *sock.RawIO) *frameReader {
	r := &frameReader{c: c, rw: rw}
	r.src.rw = rw
	r.br = bufio.NewReaderSize(&r.src, connBufSize)
	return r
}

// capReader is a frameReader's buffer source: rw, whose reads take at
// most max bytes while max is set.
type capReader struct {
	rw  *sock.RawIO
	max int
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.max > 0 && len(p) > c.max {
		p = p[:c.max]
	}
	return c.rw.Read(p)
}

// afterPayload is what a header's read takes at most after a large
// payload read straight into memory: the header and a small frame behind
// it (a note's mark after its data, a vector's first entries), in one
// system call, while a large payload behind it passes through the
// buffer by at most this much.
const afterPayload = 1 << 10

// errIdle: no byte of the next header arrived within the idle bound.
var errIdle = errors.New("tcp: no request within the idle bound")

// ready reports whether a whole header is buffered (reading it will not
// wait).
func (r *frameReader) ready() bool {
	return r.br.Buffered() >= headerLen
}

// header reads the next frame header. With idle > 0 it returns errIdle,
// having consumed nothing, when no byte arrives within idle; once a byte
// has arrived, the rest must come within r.timeout (when set).
func (r *frameReader) header(hb *[headerLen]byte, idle time.Duration) error {
	if !r.direct || r.br.Buffered() > 0 {
		return r.readHeader(hb, idle)
	}
	// After a large payload: nothing of the next one is drawn into the
	// buffer beyond afterPayload bytes.
	r.src.max = afterPayload
	err := r.readHeader(hb, idle)
	r.src.max = 0
	return err
}

func (r *frameReader) readHeader(hb *[headerLen]byte, idle time.Duration) error {
	if r.br.Buffered() >= headerLen || (idle == 0 && r.timeout == 0) {
		_, err := io.ReadFull(r.br, hb[:])
		return err
	}
	// Wait for the first byte, for at most idle.
	if idle > 0 {
		r.c.SetReadDeadline(time.Now().Add(idle))
	}
	var err error
	if r.br.Buffered() == 0 {
		_, err = r.br.Peek(1)
	}
	if err != nil {
		r.c.SetReadDeadline(time.Time{})
		var ne net.Error
		if idle > 0 && errors.As(err, &ne) && ne.Timeout() {
			return errIdle
		}
		return err
	}
	// The header has begun. Usually it arrived whole; else the rest must
	// come within the timeout.
	whole := r.br.Buffered() >= headerLen
	switch {
	case !whole && r.timeout > 0:
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
	case idle > 0:
		r.c.SetReadDeadline(time.Time{})
	}
	_, err = io.ReadFull(r.br, hb[:])
	if !whole && r.timeout > 0 {
		r.c.SetReadDeadline(time.Time{})
	}
	return err
}

// payload fills dst.
func (r *frameReader) payload(dst []byte) error {
	if r.timeout > 0 && r.br.Buffered() < len(dst) {
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
		defer r.c.SetReadDeadline(time.Time{})
	}
	r.direct = len(dst) >= directRead
	if !r.direct {
		_, err := io.ReadFull(r.br, dst)
		return err
	}
	n := 0
	if r.br.Buffered() > 0 {
		n, _ = r.br.Read(dst) // buffered bytes only: no system call
	}
	if n < len(dst) {
		_, err := io.ReadFull(r.rw, dst[n:])
		return err
	}
	return nil
}

// head reads what follows a vector's header before its payloads (a
// request's entries, a reply's statuses): when the header followed a
// large payload, what is buffered and the rest exactly, so the payloads
// behind it are not drawn into the buffer; else through the buffer.
func (r *frameReader) head(dst []byte) error {
	if !r.direct {
		return r.payload(dst)
	}
	n := 0
	if r.br.Buffered() > 0 {
		n, _ = r.br.Read(dst) // buffered bytes only: no system call
	}
	if n == len(dst) {
		return nil
	}
	if r.timeout > 0 {
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
		defer r.c.SetReadDeadline(time.Time{})
	}
	_, err := io.ReadFull(r.rw, dst[n:])
	return err
}

// readv fills the buffers of dsts in order (a vector's payloads): what
// is buffered is copied, the rest read by the kernel straight into them,
// as many as one readv takes at a time. It consumes dsts (the caller's
// scratch).
func (r *frameReader) readv(dsts [][]byte) error {
	total := 0
	for _, d := range dsts {
		total += len(d)
	}
	if total == 0 {
		return nil
	}
	if r.timeout > 0 && r.br.Buffered() < total {
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
		defer r.c.SetReadDeadline(time.Time{})
	}
	r.direct = false
	i := 0
	for i < len(dsts) && r.br.Buffered() > 0 {
		n, _ := r.br.Read(dsts[i]) // buffered bytes only: no system call
		dsts[i] = dsts[i][n:]
		if len(dsts[i]) == 0 {
			i++
		}
	}
	for ; i < len(dsts) && len(dsts[i]) == 0; i++ {
	}
	if i == len(dsts) {
		return nil
	}
	if r.vr == nil {
		vr, err := sock.NewVecReader(r.c, maxVec)
		if err != nil {
			return err
		}
		r.vr = vr
	}
	r.direct = r.exactAfterVec
	for i < len(dsts) {
		n, err := r.vr.Read(dsts[i:])
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		for n > 0 {
			k := min(n, len(dsts[i]))
			dsts[i] = dsts[i][k:]
			n -= k
			for i < len(dsts) && len(dsts[i]) == 0 {
				i++
			}
		}
	}
	return nil
}

// discard drops n payload bytes, within the timeout.
func (r *frameReader) discard(n int) error {
	if r.timeout > 0 && r.br.Buffered() < n {
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
		defer r.c.SetReadDeadline(time.Time{})
	}
	_, err := r.br.Discard(n)
	return err
}

// gather collects frames for one writev: headers (and a vector's entries
// or statuses) in a fixed arena, payloads straight from registered
// memory, with the regions to release once written. Buffers adjacent in
// memory (a run of headers, the payloads of consecutive requests) become
// one iovec.
type gather struct {
	hdrs  []byte
	used  int // arena bytes
	nh    int // frames
	iov   [][]byte
	pins  []driver.Region
	bytes int
}

func newGather(frames int) *gather {
	return &gather{
		hdrs: make([]byte, frames*headerLen),
		iov:  make([][]byte, 0, 2*frames),
		pins: make([]driver.Region, 0, frames),
	}
}

// full reports whether no further plain frame fits.
func (g *gather) full() bool { return !g.room(headerLen, 2, 1) }

// room reports whether a frame of arena bytes in the arena, iovs buffers
// and pins regions fits.
func (g *gather) room(arena, iovs, pins int) bool {
	return g.used+arena <= len(g.hdrs) && len(g.iov)+iovs <= cap(g.iov) && len(g.pins)+pins <= cap(g.pins)
}

// frame starts a frame of n bytes in the arena (a header, and a vector's
// entries or statuses) and returns them to be filled; room must have said
// it fits.
func (g *gather) frame(n int) []byte {
	b := g.hdrs[g.used : g.used+n] // its capacity lets the next frame extend its iovec
	g.used += n
	g.nh++
	g.data(b)
	return b
}

// data appends buf to the frames.
func (g *gather) data(buf []byte) {
	if len(buf) == 0 {
		return
	}
	g.bytes += len(buf)
	if k := len(g.iov); k > 0 {
		if q := g.iov[k-1]; cap(q) > len(q) && &q[:len(q)+1][len(q)] == &buf[0] {
			g.iov[k-1] = q[:len(q)+len(buf)] // adjacent in memory
			return
		}
	}
	g.iov = append(g.iov, buf)
}

// pin releases r after the write.
func (g *gather) pin(r driver.Region) { g.pins = append(g.pins, r) }

// add appends a plain frame; pin (may be nil) is released after the
// write.
func (g *gather) add(h *header, payload []byte, pin driver.Region) {
	h.encode(g.frame(headerLen))
	g.data(payload)
	if pin != nil {
		g.pin(pin)
	}
}

func (g *gather) empty() bool { return g.nh == 0 }

// flush writes everything gathered through rw and releases the pins.
func (g *gather) flush(rw *sock.RawIO) error {
	if g.nh == 0 {
		return nil
	}
	_, err := rw.WriteBuffers(g.iov)
	g.reset()
	return err
}

// try writes what the socket takes of everything gathered without
// waiting (sock.RawIO.TryWriteBuffers) and reports whether that was all;
// if not, finish writes the rest. The pins are released once all is
// written (or the write failed).
func (g *gather) try(rw *sock.RawIO) (bool, error) {
	if g.nh == 0 {
		return true, nil
	}
	done, err := rw.TryWriteBuffers(g.iov)
	if done || err != nil {
		g.reset()
	}
	return done, err
}

// finish writes what try left, waiting while the socket is full.
func (g *gather) finish(rw *sock.RawIO) error {
	_, err := rw.Finish()
	g.reset()
	return err
}

// reset drops what was gathered (after a write, or when it failed).
func (g *gather) reset() {
	for _, r := range g.pins {
		r.Release()
	}
	clear(g.pins)
	g.pins = g.pins[:0]
	clear(g.iov)
	g.iov = g.iov[:0]
	g.nh, g.used, g.bytes = 0, 0, 0
}
