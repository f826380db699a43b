package p2p

import (
	"fmt"
	"io"

	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// Wire format of the handshake socket: internal/wire frames, magic "TEMD",
// version control.P2P.Version, flags zero. A connection opens with the authenticated
// handshake of internal/control (hello, challenge, answer, verdict;
// proofs bound to "p2p" and both stores' names and epochs), then carries
// any number of request/response exchanges, one at a time:
//
//	get         request: payload is the segment name
//	descriptor  response: segment.Marshal output
//	not-found   response: the peer has no such segment; payload is the name
//	error       response: the request was refused; payload is a message
//
// Both sides bound each payload by its type before reading it; a server
// reads requests with a bound of 0 for descriptors.
const (
	headerLen = wire.HeaderLen

	// maxNameLen bounds a segment name, the only payload of a request.
	maxNameLen = 1024
	// maxErrorLen bounds a peer's error message.
	maxErrorLen = 4096
)

// frameType says what a frame carries.
type frameType = wire.Type

const (
	frameGet        frameType = 1
	frameDescriptor frameType = 2
	frameNotFound   frameType = 3
	frameError      frameType = 4
	frameHello      frameType = 5
	frameChallenge  frameType = 6
	frameAnswer     frameType = 7
	frameVerdict    frameType = 8
)

func typeName(t frameType) string {
	switch t {
	case frameGet:
		return "get"
	case frameDescriptor:
		return "descriptor"
	case frameNotFound:
		return "not-found"
	case frameError:
		return "error"
	case frameHello:
		return "hello"
	case frameChallenge:
		return "challenge"
	case frameAnswer:
		return "answer"
	case frameVerdict:
		return "verdict"
	}
	return fmt.Sprintf("frame(%d)", uint8(t))
}

// errFrame marks a malformed frame; compare with errors.Is.
var errFrame = wire.ErrFrame

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

func newProto(maxDescriptor int) wire.Proto {
	return handshake.Proto("p2p", func(t wire.Type) (int, bool) { return maxPayload(t, maxDescriptor) }, typeName)
}

var (
	// handshake is te's handshake as p2p frames it (control.P2P).
	handshake = &control.P2P
	// requests is what a server reads: no descriptors.
	requests = newProto(0)
	// responses is what a client reads.
	responses = newProto(segment.MaxEncodedSize)
)

// appendFrame appends one frame to dst.
func appendFrame(dst []byte, t frameType, payload []byte) []byte {
	return responses.Append(dst, t, 0, payload)
}

// readFrame reads one frame. The header is read into hdr (headerLen bytes)
// so callers can reuse it; the payload is freshly allocated, only after its
// length passed the bound: maxDescriptor is 0 (a server reading requests)
// or at least segment.MaxEncodedSize (a client reading responses).
func readFrame(r io.Reader, hdr []byte, maxDescriptor int) (frameType, []byte, error) {
	p := &responses
	if maxDescriptor < segment.MaxEncodedSize {
		p = &requests
		if maxDescriptor > 0 {
			q := newProto(maxDescriptor)
			p = &q
		}
	}
	h, payload, err := p.Read(r, hdr, nil)
	if err != nil {
		return 0, nil, err
	}
	if h.Flags != 0 {
		return 0, nil, fmt.Errorf("%w: p2p: reserved flags %#x set", errFrame, h.Flags)
	}
	return h.Type, payload, nil
}
