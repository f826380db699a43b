package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format of the handshake socket. Every message, in both directions, is
// one frame:
//
//	offset size
//	0      4    magic "TEMD"
//	4      1    wire version (1)
//	5      1    frame type
//	6      2    reserved, zero
//	8      4    payload length, big-endian
//	12     n    payload
//
// A connection carries any number of request/response exchanges, one at a
// time. Requests are small (a segment name); responses carry
// segment.Marshal output. Both sides bound the payload before reading it.
const (
	wireVersion = 1
	headerLen   = 12

	// maxNameLen bounds a segment name, the only payload of a request.
	maxNameLen = 1024
	// maxErrorLen bounds a peer's error message.
	maxErrorLen = 4096
)

var magic = [4]byte{'T', 'E', 'M', 'D'}

// frameType says what a frame carries.
type frameType uint8

const (
	frameGet        frameType = 1 // request: payload is the segment name
	frameDescriptor frameType = 2 // response: payload is segment.Marshal output
	frameNotFound   frameType = 3 // response: the peer has no such segment; payload is the name
	frameError      frameType = 4 // response: the request was refused; payload is a message
)

func (t frameType) String() string {
	switch t {
	case frameGet:
		return "get"
	case frameDescriptor:
		return "descriptor"
	case frameNotFound:
		return "not-found"
	case frameError:
		return "error"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// errFrame marks a malformed frame; compare with errors.Is.
var errFrame = errors.New("p2p: malformed frame")

// maxPayload returns the largest payload a frame of type t may carry.
func maxPayload(t frameType, maxDescriptor int) (int, bool) {
	switch t {
	case frameGet, frameNotFound:
		return maxNameLen, true
	case frameDescriptor:
		return maxDescriptor, true
	case frameError:
		return maxErrorLen, true
	}
	return 0, false
}

// appendFrame appends one frame to dst.
func appendFrame(dst []byte, t frameType, payload []byte) []byte {
	var h [headerLen]byte
	copy(h[:4], magic[:])
	h[4] = wireVersion
	h[5] = byte(t)
	binary.BigEndian.PutUint32(h[8:], uint32(len(payload)))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// parseHeader checks a frame header and returns its type and payload length.
// maxDescriptor bounds descriptor payloads; every other type has a fixed
// bound.
func parseHeader(h []byte, maxDescriptor int) (frameType, int, error) {
	if len(h) < headerLen {
		return 0, 0, fmt.Errorf("%w: short header (%d bytes)", errFrame, len(h))
	}
	if [4]byte(h[:4]) != magic {
		return 0, 0, fmt.Errorf("%w: bad magic %q", errFrame, h[:4])
	}
	if h[4] != wireVersion {
		return 0, 0, fmt.Errorf("%w: wire version %d, want %d", errFrame, h[4], wireVersion)
	}
	if h[6] != 0 || h[7] != 0 {
		return 0, 0, fmt.Errorf("%w: reserved bytes set", errFrame)
	}
	t := frameType(h[5])
	limit, ok := maxPayload(t, maxDescriptor)
	if !ok {
		return 0, 0, fmt.Errorf("%w: unknown type %d", errFrame, h[5])
	}
	// Compare as uint64 so a huge length cannot wrap int on any platform.
	n := uint64(binary.BigEndian.Uint32(h[8:]))
	if n > uint64(limit) {
		return 0, 0, fmt.Errorf("%w: %v payload of %d bytes exceeds %d", errFrame, t, n, limit)
	}
	return t, int(n), nil
}

// readFrame reads one frame. The header is read into hdr (headerLen bytes)
// so callers can reuse it; the payload is freshly allocated, only after its
// length passed the bound.
func readFrame(r io.Reader, hdr []byte, maxDescriptor int) (frameType, []byte, error) {
	if _, err := io.ReadFull(r, hdr[:headerLen]); err != nil {
		return 0, nil, err
	}
	t, n, err := parseHeader(hdr, maxDescriptor)
	if err != nil {
		return 0, nil, err
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("%w: %v payload: %w", errFrame, t, err)
	}
	return t, payload, nil
}
