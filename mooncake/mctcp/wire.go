package mctcp

import (
	"encoding/binary"
	"fmt"
)

// Mooncake's TCP data protocol (tcp_transport_session_impl.h at 777cc778):
// a request is a 24-byte little-endian header {u64 size, u64 addr, u8
// opcode, 7 bytes of padding that carry garbage}, the payload following a
// WRITE. Under v2 the opcode has bit 0x80 set, and the target answers each
// request with an 8-byte status word ("MCTV" in the high half, the code in
// the low half) before a READ's payload and after a WRITE's payload has
// landed; a rejected request gets status 1 and a closed connection. Under
// v1 nothing is answered but a READ's payload, and a rejection is a
// closed connection.
const (
	headerLen = 24
	statusLen = 8

	opRead  = 0x00
	opWrite = 0x01
	opV2    = 0x80

	statusMagic = 0x4D435456 // "MCTV"
	statusOK    = 0
	statusBad   = 1
)

type header struct {
	size, addr uint64
	op         byte
}

func (h *header) encode(b []byte) {
	_ = b[headerLen-1]
	binary.LittleEndian.PutUint64(b[0:], h.size)
	binary.LittleEndian.PutUint64(b[8:], h.addr)
	b[16] = h.op
	clear(b[17:headerLen])
}

func decodeHeader(b []byte) header {
	return header{size: binary.LittleEndian.Uint64(b[0:]), addr: binary.LittleEndian.Uint64(b[8:]), op: b[16]}
}

func encodeStatus(b []byte, code uint32) {
	binary.LittleEndian.PutUint64(b, uint64(statusMagic)<<32|uint64(code))
}

// decodeStatus returns the status code, or an error for a word without
// the magic.
func decodeStatus(b []byte) (uint32, error) {
	w := binary.LittleEndian.Uint64(b)
	if w>>32 != statusMagic {
		return 0, fmt.Errorf("%w: status word %#016x lacks the MCTV magic", ErrProtocol, w)
	}
	return uint32(w), nil
}
