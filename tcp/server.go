package tcp

import (
	"errors"
	"io"
	"net"
	"time"

	"github.com/rdmago/te/engine"
)

const connBufSize = 64 << 10

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		if len(t.conns) >= t.cfg.MaxConns {
			t.mu.Unlock()
			c.Close()
			t.log.Debug("tcp: connection refused: too many", "remote", c.RemoteAddr(), "max", t.cfg.MaxConns)
			continue
		}
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(c.(*net.TCPConn))
	}
}

// serve answers one initiator connection's requests, in order.
func (t *Transport) serve(c *net.TCPConn) {
	defer t.wg.Done()
	defer func() {
		c.Close()
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}()
	if err := t.serveConn(c); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		t.log.Debug("tcp: serve connection", "remote", c.RemoteAddr(), "err", err)
	}
}

// flushBytes bounds the reply bytes gathered before a write.
const flushBytes = 1 << 20

func (t *Transport) serveConn(c *net.TCPConn) error {
	fr := newFrameReader(c)
	fr.payloadTimeout = t.cfg.IOTimeout
	g := newGather(maxFramesPerWrite)
	defer g.reset()
	var hb [headerLen]byte

	// HELLO: refuse initiators that address another incarnation, and
	// connections that hold a slot without saying anything.
	c.SetReadDeadline(time.Now().Add(t.cfg.IOTimeout))
	if err := fr.header(&hb); err != nil {
		return err
	}
	c.SetReadDeadline(time.Time{})
	h, err := decodeHeader(hb[:])
	if err != nil {
		return err
	}
	if h.op != opHello {
		return errProtocolNoHello
	}
	reply := header{op: opHello | opReply, id: h.id, addr: t.host.Epoch()}
	if h.addr != t.host.Epoch() {
		reply.status = statusStaleEpoch
	}
	reply.encode(hb[:])
	if _, err := c.Write(hb[:]); err != nil {
		return err
	}
	if reply.status != statusOK {
		return errRemoteStale
	}

	more := false
	for {
		// Write the gathered replies once a burst of requests ends (or
		// the gather is full), so they leave in one writev.
		if !g.empty() && (!more || g.full() || g.bytes >= flushBytes) {
			// An initiator that stops reading must not keep regions
			// pinned (READ payloads wait in g) for ever.
			c.SetWriteDeadline(time.Now().Add(t.cfg.IOTimeout))
			if err := g.flush(c); err != nil {
				return err
			}
		}
		if err := fr.header(&hb); err != nil {
			return err
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			return err // framing cannot be trusted: drop the connection
		}
		more = h.flags&flagMore != 0
		switch h.op {
		case opWrite:
			reply = header{op: opWrite | opReply, id: h.id, addr: h.addr}
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				reply.status = acquireStatus(aerr)
				// Nothing is written: the payload is consumed and dropped.
				if err := fr.discard(int(h.length)); err != nil {
					return err
				}
			} else {
				err := fr.payload(mem)
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

var (
	errProtocolNoHello = errors.New("tcp: connection did not start with HELLO")
	errProtocolOp      = errors.New("tcp: unexpected op from initiator")
)

func acquireStatus(err error) status {
	if errors.Is(err, engine.ErrMemoryBusy) {
		return statusBusy
	}
	return statusOutOfRange
}
