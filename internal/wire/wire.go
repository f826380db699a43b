// Package wire is the one frame codec of te's control connections: the p2p
// metadata exchange, the TCP transport's handshake and the RDMA transport's
// QP handshake. It is pure data (no sockets, no syscalls) so it can be fuzzed
// on its own.
//
// Every frame, in both directions:
//
//	offset size
//	0      4    magic, one per protocol ("TEMD", "TERH", ...)
//	4      1    protocol version
//	5      1    frame type
//	6      2    flags, zero unless the protocol defines them
//	8      4    payload length, big-endian
//	12     n    payload
//
// A Proto names the magic, the version and a bound per frame type; a header
// whose type is unknown or whose length exceeds its type's bound is rejected
// before any payload byte is read, so a peer cannot make the reader allocate
// more than the bound.
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// HeaderLen is the size of a frame header.
const HeaderLen = 12

// ErrFrame marks a malformed frame or payload; compare with errors.Is.
var ErrFrame = errors.New("wire: malformed frame")

// ErrMagic marks a frame whose first bytes are not the protocol's magic:
// the peer speaks something else. It wraps ErrFrame.
var ErrMagic = fmt.Errorf("%w: not this protocol's magic", ErrFrame)

// Type is a frame type, defined by each protocol.
type Type uint8

// Proto describes one protocol's frames.
type Proto struct {
	// Name appears in errors ("p2p", "rdma handshake").
	Name    string
	Magic   [4]byte
	Version uint8
	// Limit returns the largest payload a frame of type t may carry, and
	// false for a type the protocol does not define.
	Limit func(t Type) (max int, ok bool)
	// TypeName names a type in errors; nil prints the number.
	TypeName func(t Type) string
}

func (p *Proto) typeName(t Type) string {
	if p.TypeName != nil {
		return p.TypeName(t)
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// Header is a parsed frame header.
type Header struct {
	Type  Type
	Flags uint16
	Len   int
}

// Append appends one frame to dst.
func (p *Proto) Append(dst []byte, t Type, flags uint16, payload []byte) []byte {
	var h [HeaderLen]byte
	copy(h[:4], p.Magic[:])
	h[4] = p.Version
	h[5] = byte(t)
	binary.BigEndian.PutUint16(h[6:], flags)
	binary.BigEndian.PutUint32(h[8:], uint32(len(payload)))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// ParseHeader checks a frame header: magic, version, a known type and a
// payload length within that type's bound.
func (p *Proto) ParseHeader(h []byte) (Header, error) {
	if len(h) < HeaderLen {
		return Header{}, fmt.Errorf("%w: %s: short header (%d bytes)", ErrFrame, p.Name, len(h))
	}
	if [4]byte(h[:4]) != p.Magic {
		return Header{}, p.badMagic(h[:4])
	}
	if h[4] != p.Version {
		return Header{}, fmt.Errorf("%w: %s: version %d, want %d", ErrFrame, p.Name, h[4], p.Version)
	}
	t := Type(h[5])
	limit, ok := p.Limit(t)
	if !ok {
		return Header{}, fmt.Errorf("%w: %s: unknown frame type %d", ErrFrame, p.Name, h[5])
	}
	// Compare as uint64 so a huge length cannot wrap int on any platform.
	n := uint64(binary.BigEndian.Uint32(h[8:]))
	if n > uint64(limit) {
		return Header{}, fmt.Errorf("%w: %s: %s payload of %d bytes exceeds %d", ErrFrame, p.Name, p.typeName(t), n, limit)
	}
	return Header{Type: t, Flags: binary.BigEndian.Uint16(h[6:]), Len: int(n)}, nil
}

// MagicError is the ErrMagic of one frame: the bytes that came instead of
// the magic (up to four).
type MagicError struct {
	Proto string
	Got   []byte
}

func (e *MagicError) Error() string {
	return fmt.Sprintf("%s: bad magic %q", e.Proto, e.Got)
}

// Unwrap makes a MagicError match ErrMagic and ErrFrame.
func (e *MagicError) Unwrap() error { return ErrMagic }

func (p *Proto) badMagic(got []byte) error {
	return &MagicError{Proto: p.Name, Got: append([]byte(nil), got...)}
}

// Read reads one frame. The header is read into hdr (at least HeaderLen
// bytes, reusable by the caller); the payload goes into buf when it fits
// there, else into a fresh slice allocated only after its length passed the
// bound. A payload cut short is an ErrFrame wrapping io.ErrUnexpectedEOF; a
// clean end before the header is io.EOF. Bytes that cannot begin the magic
// fail with a MagicError as soon as they arrive, without waiting for a
// whole header: a peer of another protocol is told at once.
func (p *Proto) Read(r io.Reader, hdr, buf []byte) (Header, []byte, error) {
	if err := p.readHeader(r, hdr[:HeaderLen]); err != nil {
		return Header{}, nil, err
	}
	h, err := p.ParseHeader(hdr)
	if err != nil {
		return Header{}, nil, err
	}
	payload := buf[:0]
	if cap(buf) < h.Len {
		payload = make([]byte, h.Len)
	}
	payload = payload[:h.Len]
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Header{}, nil, fmt.Errorf("%w: %s: %s payload: %w", ErrFrame, p.Name, p.typeName(h.Type), err)
	}
	return h, payload, nil
}

// readHeader fills hdr as io.ReadFull does, checking the magic as its
// bytes arrive.
func (p *Proto) readHeader(r io.Reader, hdr []byte) error {
	got := 0
	for got < len(hdr) {
		n, err := r.Read(hdr[got:])
		got += n
		if k := min(got, len(p.Magic)); !bytes.Equal(hdr[:k], p.Magic[:k]) {
			return p.badMagic(hdr[:k])
		}
		if got == len(hdr) {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) && got > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// Write writes one frame in a single Write call.
func (p *Proto) Write(w io.Writer, t Type, flags uint16, payload []byte) error {
	_, err := w.Write(p.Append(make([]byte, 0, HeaderLen+len(payload)), t, flags, payload))
	return err
}
