package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"

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
		t.conns[c] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(c)
	}
}

// serve answers one initiator connection's requests, in order.
func (t *Transport) serve(c net.Conn) {
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

func (t *Transport) serveConn(c net.Conn) error {
	br := bufio.NewReaderSize(c, connBufSize)
	bw := bufio.NewWriterSize(c, connBufSize)
	var hb [headerLen]byte

	// HELLO: refuse initiators that address another incarnation.
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		return err
	}
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

	for {
		// Flush replies before blocking for more requests: replies to a
		// burst of small requests leave in one write.
		if br.Buffered() == 0 && bw.Buffered() > 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			return err
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			return err // framing cannot be trusted: drop the connection
		}
		switch h.op {
		case opWrite:
			st := statusOK
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			if aerr != nil {
				st = acquireStatus(aerr)
				// Nothing is written: the payload is consumed and dropped.
				if _, err := br.Discard(int(h.length)); err != nil {
					return err
				}
			} else {
				_, err := io.ReadFull(br, mem)
				r.Release()
				if err != nil {
					return err
				}
			}
			reply = header{op: opWrite | opReply, status: st, id: h.id, addr: h.addr}
			reply.encode(hb[:])
			if _, err := bw.Write(hb[:]); err != nil {
				return err
			}
		case opRead:
			mem, r, aerr := t.host.AcquireLocal(h.addr, h.length)
			reply = header{op: opRead | opReply, id: h.id, addr: h.addr}
			if aerr != nil {
				reply.status = acquireStatus(aerr)
			} else {
				reply.length = h.length
			}
			reply.encode(hb[:])
			if _, err := bw.Write(hb[:]); err != nil {
				if r != nil {
					r.Release()
				}
				return err
			}
			if aerr == nil {
				_, err := bw.Write(mem)
				r.Release()
				if err != nil {
					return err
				}
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
