// Package interop checks the verbs stack against rdma-core's own tools in the
// Soft-RoCE guest. This file speaks the out-of-band exchange of rdma-core's
// ibv_rc_pingpong: over one TCP connection the client sends its destination,
// the server answers with its own, and the client acknowledges with "done".
//
// A destination travels as a NUL-terminated 51-character string
// "LLLL:QQQQQQ:PPPPPP:GGGG...G": LID (4 hex digits), QPN and PSN (6 each) and
// the 16 GID bytes in order as 32 hex digits. The tool sends it as 52 bytes and
// the acknowledgement as the 5 bytes "done\0".
package interop

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/rdmago/te/uverbs"
)

// DestLen is the size of an encoded destination on the wire, NUL included.
const DestLen = 52

var doneMsg = []byte("done\x00")

// ErrBadDest reports a malformed destination from the peer.
var ErrBadDest = errors.New("interop: malformed pingpong destination")

// Dest is what one side of ibv_rc_pingpong tells the other.
type Dest struct {
	LID uint16
	QPN uverbs.QPN
	PSN uverbs.PSN
	GID uverbs.GID
}

// Marshal encodes d the way the tool does.
func (d Dest) Marshal() [DestLen]byte {
	var b [DestLen]byte
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, uint32(d.QPN)&0xffffff, uint32(d.PSN)&0xffffff, hex.EncodeToString(d.GID[:]))
	copy(b[:], s)
	return b
}

// ParseDest decodes a destination received from the peer: exactly the four
// fixed-width hex fields, then NUL (or the end of b).
func ParseDest(b []byte) (Dest, error) {
	var d Dest
	if len(b) < DestLen-1 {
		return d, fmt.Errorf("%w: %d bytes", ErrBadDest, len(b))
	}
	if len(b) >= DestLen && b[DestLen-1] != 0 {
		return d, fmt.Errorf("%w: not NUL-terminated", ErrBadDest)
	}
	s := b[:DestLen-1]
	if s[4] != ':' || s[11] != ':' || s[18] != ':' {
		return d, fmt.Errorf("%w: %q", ErrBadDest, s)
	}
	field := func(f []byte, bits int) (uint64, error) {
		for _, c := range f { // ParseUint alone would accept a sign or "0x"
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return 0, fmt.Errorf("%w: %q", ErrBadDest, s)
			}
		}
		v, err := strconv.ParseUint(string(f), 16, bits)
		if err != nil {
			return 0, fmt.Errorf("%w: %q", ErrBadDest, s)
		}
		return v, nil
	}
	lid, err := field(s[0:4], 16)
	if err != nil {
		return d, err
	}
	qpn, err := field(s[5:11], 24)
	if err != nil {
		return d, err
	}
	psn, err := field(s[12:18], 24)
	if err != nil {
		return d, err
	}
	for i := range d.GID {
		v, err := field(s[19+2*i:21+2*i], 8)
		if err != nil {
			return d, err
		}
		d.GID[i] = byte(v)
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uverbs.QPN(qpn), uverbs.PSN(psn)
	return d, nil
}

func deadline(ctx context.Context, c net.Conn) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(time.Minute))
	}
}

// ServerExchange runs the server side on an accepted connection: read the
// client's destination, call connect (which must bring the local QP to RTR at
// least, since the client may send as soon as it has the reply), send local,
// and wait for the client's acknowledgement.
func ServerExchange(ctx context.Context, c net.Conn, local Dest, connect func(remote Dest) error) (Dest, error) {
	deadline(ctx, c)
	var buf [DestLen]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		return Dest{}, fmt.Errorf("interop: read client destination: %w", err)
	}
	remote, err := ParseDest(buf[:])
	if err != nil {
		return Dest{}, err
	}
	if err := connect(remote); err != nil {
		return remote, err
	}
	msg := local.Marshal()
	if _, err := c.Write(msg[:]); err != nil {
		return remote, fmt.Errorf("interop: send server destination: %w", err)
	}
	ack := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(c, ack); err != nil {
		return remote, fmt.Errorf("interop: read client acknowledgement: %w", err)
	}
	if string(ack) != string(doneMsg) {
		return remote, fmt.Errorf("%w: acknowledgement %q", ErrBadDest, ack)
	}
	return remote, nil
}

// ClientExchange runs the client side: send local, read the server's
// destination, acknowledge it. The caller connects its QP afterwards.
func ClientExchange(ctx context.Context, c net.Conn, local Dest) (Dest, error) {
	deadline(ctx, c)
	msg := local.Marshal()
	if _, err := c.Write(msg[:]); err != nil {
		return Dest{}, fmt.Errorf("interop: send client destination: %w", err)
	}
	var buf [DestLen]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		return Dest{}, fmt.Errorf("interop: read server destination: %w", err)
	}
	remote, err := ParseDest(buf[:])
	if err != nil {
		return Dest{}, err
	}
	if _, err := c.Write(doneMsg); err != nil {
		return remote, fmt.Errorf("interop: send acknowledgement: %w", err)
	}
	return remote, nil
}
