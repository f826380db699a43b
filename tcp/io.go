package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"time"

	"github.com/rdmago/te/engine/driver"
)

// directRead is the payload size above which payload bytes bypass the
// connection's read buffer: what is already buffered is copied, the rest
// is read by the kernel straight into registered memory.
const directRead = 16 << 10

// frameReader reads frames from a connection: small frames through a read
// buffer, so one system call brings in many of them; large payloads
// straight into registered memory. After a large payload the next header
// is read exactly (32 bytes) when nothing is buffered, so the payload
// behind it lands in memory without passing through the buffer.
type frameReader struct {
	br     *bufio.Reader
	c      *net.TCPConn
	direct bool // the last payload was large
	// timeout, when set, bounds reading the rest of a frame once it has
	// begun (header, payload, discarded payload): a sender that stalls
	// mid-frame must not hold the connection, or keep the destination
	// region pinned.
	timeout time.Duration
}

func newFrameReader(c *net.TCPConn) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(c, connBufSize), c: c}
}

// errIdle: no byte of the next header arrived within the idle bound.
var errIdle = errors.New("tcp: no request within the idle bound")

// ready reports whether a whole header is buffered (reading it will not
// wait).
func (r *frameReader) ready() bool {
	return !(r.direct && r.br.Buffered() == 0) && r.br.Buffered() >= headerLen
}

// header reads the next frame header. With idle > 0 it returns errIdle,
// having consumed nothing, when no byte arrives within idle; once a byte
// has arrived, the rest must come within r.timeout (when set).
func (r *frameReader) header(hb *[headerLen]byte, idle time.Duration) error {
	raw := r.direct && r.br.Buffered() == 0
	if r.ready() || (idle == 0 && r.timeout == 0) {
		var err error
		if raw {
			_, err = io.ReadFull(r.c, hb[:])
		} else {
			_, err = io.ReadFull(r.br, hb[:])
		}
		return err
	}
	// Wait for the first byte, for at most idle.
	if idle > 0 {
		r.c.SetReadDeadline(time.Now().Add(idle))
	}
	n := 0
	var err error
	if raw {
		n, err = r.c.Read(hb[:])
	} else if r.br.Buffered() == 0 {
		_, err = r.br.Peek(1)
	}
	if err != nil {
		r.c.SetReadDeadline(time.Time{})
		var ne net.Error
		if n == 0 && idle > 0 && errors.As(err, &ne) && ne.Timeout() {
			return errIdle
		}
		return err
	}
	// The header has begun. Usually it arrived whole; else the rest must
	// come within the timeout.
	whole := (raw && n == headerLen) || (!raw && r.br.Buffered() >= headerLen)
	switch {
	case !whole && r.timeout > 0:
		r.c.SetReadDeadline(time.Now().Add(r.timeout))
	case idle > 0:
		r.c.SetReadDeadline(time.Time{})
	}
	switch {
	case raw && n < headerLen:
		_, err = io.ReadFull(r.c, hb[n:])
	case !raw:
		_, err = io.ReadFull(r.br, hb[:])
	}
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
		_, err := io.ReadFull(r.c, dst[n:])
		return err
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

// gather collects frames for one writev: headers in a fixed arena (runs of
// adjacent headers become one iovec) and payloads straight from
// registered memory, with the regions to release once written.
type gather struct {
	hdrs  []byte
	nh    int
	iov   [][]byte
	bufs  net.Buffers
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

// full reports whether no further frame fits.
func (g *gather) full() bool { return g.nh*headerLen == len(g.hdrs) }

// add appends a frame; pin (may be nil) is released after the write.
func (g *gather) add(h *header, payload []byte, pin driver.Region) {
	hb := g.hdrs[g.nh*headerLen : (g.nh+1)*headerLen : (g.nh+1)*headerLen]
	h.encode(hb)
	if k := len(g.iov); k > 0 && g.nh > 0 && len(g.iov[k-1]) > 0 &&
		&g.iov[k-1][len(g.iov[k-1])-1] == &g.hdrs[g.nh*headerLen-1] {
		// Extends the previous header run.
		g.iov[k-1] = g.hdrs[(g.nh*headerLen)-len(g.iov[k-1]) : (g.nh+1)*headerLen]
	} else {
		g.iov = append(g.iov, hb)
	}
	g.nh++
	g.bytes += headerLen
	if len(payload) > 0 {
		g.iov = append(g.iov, payload)
		g.bytes += len(payload)
	}
	if pin != nil {
		g.pins = append(g.pins, pin)
	}
}

func (g *gather) empty() bool { return g.nh == 0 }

// flush writes everything gathered and releases the pins.
func (g *gather) flush(c *net.TCPConn) error {
	if g.nh == 0 {
		return nil
	}
	g.bufs = g.iov
	_, err := g.bufs.WriteTo(c)
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
	g.bufs = nil
	g.nh, g.bytes = 0, 0
}
