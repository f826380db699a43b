package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format, version 3 (version 2 is its subset without vectors). A
// connection opens with the handshake of
// handshake.go (internal/wire frames: hello, challenge, answer, verdict;
// cluster authentication when a secret is set), then carries data frames,
// each starting with a 32-byte little-endian header:
//
//	off len field
//	  0   2 magic    "TE" (0x54 0x45)
//	  2   1 version  3, or 2 (no vector ops); a reply carries its
//	                 request's
//	  3   1 op       2 WRITE, 3 READ, 4 MARK (notify.go), 5 WRITEV,
//	                 6 READV (version 3); replies set bit 0x80
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
// Vectors carry a run of small requests of one op in one frame, so
// neither side handles a header per request and the target reads a run's
// payloads straight into registered memory with one readv (a plain frame's
// small payload passes through the read buffer):
//
//	WRITEV       header (addr: the entry count n, 1..maxVec; length: the
//	             payload bytes, the sum of the entries' lengths), then n
//	             entries of 16 bytes (target address, length; little-
//	             endian u64s), then the n payloads back to back. The
//	             requests' ids are id .. id+n-1.
//	READV        header (addr n, length the bytes wanted in all), then n
//	             entries.
//	WRITEV|reply header: addr n, length 0; status 0 when every entry was
//	             applied, statusVec when n status bytes follow, one per
//	             entry in order.
//	READV|reply  header: addr n, status 0 or statusVec (then n status
//	             bytes), length the payload bytes that follow: those of
//	             the entries whose status is 0, back to back, in order.
//
// An entry is checked and refused like a plain request; its refused WRITE
// payload is read and discarded. A vector's entries count as n data
// requests where marks count them (notify.go). The initiator sends
// vectors only to a target whose descriptor says version 3.
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
	wireVersion = 3
	// wireLegacy is the version before vectors, still spoken with a peer
	// that advertises it.
	wireLegacy = 2
	// maxPayload bounds one frame's payload (and a READ's request).
	maxPayload = 1 << 30
	// maxVec bounds a vector's entries; entryLen is an entry's size.
	maxVec   = 256
	entryLen = 16
)

type op uint8

const (
	opWrite  op = 2
	opRead   op = 3
	opWriteV op = 5
	opReadV  op = 6
	opReply  op = 0x80
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
	// statusVec: a vector reply whose entries' statuses follow.
	statusVec status = 7
)

// header is a decoded frame header.
type header struct {
	legacy bool // version 2
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
	errVec     = errors.New("tcp: frame: vector entry count out of bounds")
	errVecSum  = errors.New("tcp: frame: vector entries do not add up to its length")
)

func (h *header) encode(b []byte) {
	_ = b[headerLen-1]
	v := byte(wireVersion)
	if h.legacy {
		v = wireLegacy
	}
	b[0], b[1], b[2], b[3] = 'T', 'E', v, byte(h.op)
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
	if b[2] != wireVersion && b[2] != wireLegacy {
		return header{}, errVersion
	}
	h := header{
		legacy: b[2] == wireLegacy,
		op:     op(b[3]),
		status: status(binary.LittleEndian.Uint16(b[4:])),
		flags:  binary.LittleEndian.Uint16(b[6:]),
		id:     binary.LittleEndian.Uint64(b[8:]),
		addr:   binary.LittleEndian.Uint64(b[16:]),
		length: binary.LittleEndian.Uint64(b[24:]),
	}
	switch h.op &^ opReply {
	case opWrite, opRead, opMark:
	case opWriteV, opReadV:
		if h.legacy {
			return header{}, errOp
		}
		if h.addr == 0 || h.addr > maxVec {
			return header{}, errVec
		}
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
	return fmt.Sprintf("v%d op=%#x status=%d flags=%#x id=%d addr=%#x len=%d", h.version(), uint8(h.op), h.status, h.flags, h.id, h.addr, h.length)
}

func (h header) version() int {
	if h.legacy {
		return wireLegacy
	}
	return wireVersion
}

// vector reports whether h is a vector frame (request or reply).
func (h *header) vector() bool {
	o := h.op &^ opReply
	return o == opWriteV || o == opReadV
}

// putEntry encodes a vector entry into b.
func putEntry(b []byte, addr, length uint64) {
	_ = b[entryLen-1]
	binary.LittleEndian.PutUint64(b, addr)
	binary.LittleEndian.PutUint64(b[8:], length)
}

// entry decodes the i-th vector entry of b.
func entry(b []byte, i int) (addr, length uint64) {
	e := b[i*entryLen : (i+1)*entryLen : (i+1)*entryLen]
	return binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:])
}

// checkEntries checks that the n entries of b add up to total without
// overflowing it.
func checkEntries(b []byte, n int, total uint64) error {
	var sum uint64
	for i := range n {
		_, l := entry(b, i)
		if l > total-sum {
			return errVecSum
		}
		sum += l
	}
	if sum != total {
		return errVecSum
	}
	return nil
}
