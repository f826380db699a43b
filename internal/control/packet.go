package control

import (
	"fmt"
	"io"
	"net"

	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/wire"
)

// PacketConn frames a SOCK_SEQPACKET unix socket: one frame per packet,
// whose header must declare exactly the packet's length, with file
// descriptors attached where the protocol passes them.
type PacketConn struct {
	c   *net.UnixConn
	p   *wire.Proto
	buf []byte
}

// Packet returns the framing of c; buf receives packets and must hold the
// largest frame of p.
func Packet(c *net.UnixConn, p *wire.Proto, buf []byte) *PacketConn {
	return &PacketConn{c: c, p: p, buf: buf}
}

// WriteFrame sends one frame without descriptors.
func (pc *PacketConn) WriteFrame(t wire.Type, payload []byte) error {
	return uds.Send(pc.c, pc.p.Append(make([]byte, 0, wire.HeaderLen+len(payload)), t, 0, payload), nil)
}

// ReadFrame receives one frame that carries no descriptor.
func (pc *PacketConn) ReadFrame() (wire.Header, []byte, error) {
	h, p, _, err := pc.Recv(0)
	return h, p, err
}

// Recv receives one frame with at most want descriptors (the caller owns
// them). The payload aliases the buffer until the next call. An orderly
// close by the peer is io.EOF.
func (pc *PacketConn) Recv(want int) (wire.Header, []byte, []int, error) {
	n, fds, err := uds.Recv(pc.c, pc.buf, want)
	if err != nil {
		return wire.Header{}, nil, nil, err
	}
	if n == 0 {
		uds.Close(fds)
		return wire.Header{}, nil, nil, io.EOF
	}
	h, p, err := ParsePacket(pc.p, pc.buf[:n])
	if err != nil {
		uds.Close(fds)
		return wire.Header{}, nil, nil, err
	}
	return h, p, fds, nil
}

// ParsePacket checks a received packet's header (no flags; the length
// must match the packet exactly) and returns it and the payload.
func ParsePacket(p *wire.Proto, pkt []byte) (wire.Header, []byte, error) {
	h, err := p.ParseHeader(pkt)
	if err == nil && h.Flags != 0 {
		err = fmt.Errorf("%w: %s: flags %#x set", wire.ErrFrame, p.Name, h.Flags)
	}
	if err == nil && h.Len != len(pkt)-wire.HeaderLen {
		err = fmt.Errorf("%w: %s: header declares %d payload bytes, the packet has %d", wire.ErrFrame, p.Name, h.Len, len(pkt)-wire.HeaderLen)
	}
	if err != nil {
		return wire.Header{}, nil, err
	}
	return h, pkt[wire.HeaderLen:], nil
}
