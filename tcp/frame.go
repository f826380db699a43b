package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format, version 2. A connection opens with the handshake of
// handshake.go (internal/wire frames: hello, challenge, answer, verdict;
// cluster authentication when a secret is set), then carries data frames,
// each starting with a 32-byte little-endian header:
//
//	off len field
//	  0   2 magic    "TE" (0x54 0x45)
//	  2   1 version  2
//	  3   1 op       2 WRITE, 3 READ, 4 MARK (notify.go); replies set
//	                 bit 0x80
//	  4   2 status   0 in requests; the outcome in replies
//	  6   2 flags    requests: bit 0 More; all other bits (and any bit
//	                 in replies) are reserved and rejected
//	  8   8 id       request id, echoed by the reply
//	 16   8 addr     target address
//	 24   8 length   payload or requested bytes, see below
//
// The handshake checks that the initiator addresses this incarnation of
// the segment (the epoch of its descriptor), so nothing addressed to a
// previous one ever touches memory. Then:
//
//	WRITE        header + length bytes of payload, to be stored at addr.
//	WRITE|reply  header, length 0; status says whether the payload is in
//	             memory.
//	READ         header; length is the number of bytes wanted from addr.
//	READ|reply   header; status 0: length bytes of payload follow,
//	             otherwise length is 0.
//
// More is a hint from the initiator: further requests follow at once in
// the same burst. The target holds its replies while More is set (up to a
// bound, and for at most the I/O timeout) and writes them together after
// the burst's last request.
//
// The target serves the requests of one connection in order, so replies
// come back in request order; ids let the initiator check that. Every
// range is checked against the target's registered memory before it is
// touched: a WRITE outside it has its payload read and discarded and gets
// status OutOfRange; nothing is written. A header that fails to decode
// (bad magic, unknown version or op, unknown flags, oversized length)
// means the framing cannot be trusted: the receiver closes the connection.
const (
	headerLen   = 32
	wireVersion = 2
	// maxPayload bounds one frame's payload (and a READ's request).
	maxPayload = 1 << 30
)

type op uint8

const (
	opWrite op = 2
	opRead  op = 3
	opReply op = 0x80
)

// flagMore marks a request followed at once by more of the same burst.
const flagMore uint16 = 1

type status uint16

const (
	statusOK         status = 0
	statusOutOfRange status = 1 // range not inside registered memory
	statusBusy       status = 2 // region being unregistered
	statusStaleEpoch status = 3 // handshake for another incarnation
	statusBadRequest status = 4
	// Replies to marks (notify.go).
	statusNotifyFull   status = 5 // the notification queue stayed full
	statusNotDelivered status = 6 // a run failed or was aborted
)

// header is a decoded frame header.
type header struct {
	op     op
	status status
	flags  uint16
	id     uint64
	addr   uint64
	length uint64
}

var (
	errMagic   = errors.New("tcp: frame: bad magic")
	errVersion = errors.New("tcp: frame: unsupported wire version")
	errOp      = errors.New("tcp: frame: unknown op")
	errFlags   = errors.New("tcp: frame: unknown flags")
	errLength  = errors.New("tcp: frame: length too large")
	errStatus  = errors.New("tcp: frame: status in a request")
	errShort   = errors.New("tcp: frame: short header")
)

func (h *header) encode(b []byte) {
	_ = b[headerLen-1]
	b[0], b[1], b[2], b[3] = 'T', 'E', wireVersion, byte(h.op)
	binary.LittleEndian.PutUint16(b[4:], uint16(h.status))
	binary.LittleEndian.PutUint16(b[6:], h.flags)
	binary.LittleEndian.PutUint64(b[8:], h.id)
	binary.LittleEndian.PutUint64(b[16:], h.addr)
	binary.LittleEndian.PutUint64(b[24:], h.length)
}

// decodeHeader parses and checks a header. It does not allocate.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerLen {
		return header{}, errShort
	}
	if b[0] != 'T' || b[1] != 'E' {
		return header{}, errMagic
	}
	if b[2] != wireVersion {
		return header{}, errVersion
	}
	h := header{
		op:     op(b[3]),
		status: status(binary.LittleEndian.Uint16(b[4:])),
		flags:  binary.LittleEndian.Uint16(b[6:]),
		id:     binary.LittleEndian.Uint64(b[8:]),
		addr:   binary.LittleEndian.Uint64(b[16:]),
		length: binary.LittleEndian.Uint64(b[24:]),
	}
	switch h.op &^ opReply {
	case opWrite, opRead, opMark:
	default:
		return header{}, errOp
	}
	if h.op&opReply != 0 && h.flags != 0 || h.flags&^flagMore != 0 {
		return header{}, errFlags
	}
	if h.op&opReply == 0 && h.status != statusOK {
		return header{}, errStatus
	}
	if h.length > maxPayload {
		return header{}, errLength
	}
	return h, nil
}

func (h header) String() string {
	return fmt.Sprintf("op=%#x status=%d flags=%#x id=%d addr=%#x len=%d", uint8(h.op), h.status, h.flags, h.id, h.addr, h.length)
}
