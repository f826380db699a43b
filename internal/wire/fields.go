package wire

import (
	"encoding/binary"
	"fmt"
)

// Enc appends big-endian fields to a payload.
type Enc struct{ B []byte }

// U8 appends one byte.
func (e *Enc) U8(v uint8) { e.B = append(e.B, v) }

// U16 appends a uint16.
func (e *Enc) U16(v uint16) { e.B = binary.BigEndian.AppendUint16(e.B, v) }

// U32 appends a uint32.
func (e *Enc) U32(v uint32) { e.B = binary.BigEndian.AppendUint32(e.B, v) }

// U64 appends a uint64.
func (e *Enc) U64(v uint64) { e.B = binary.BigEndian.AppendUint64(e.B, v) }

// Fixed appends b as is (a field whose size both sides know).
func (e *Enc) Fixed(b []byte) { e.B = append(e.B, b...) }

// Bytes appends b with a uint16 length prefix. b must be shorter than 64 KiB.
func (e *Enc) Bytes(b []byte) {
	if len(b) > 0xffff {
		panic("wire: Enc.Bytes of more than 65535 bytes")
	}
	e.U16(uint16(len(b)))
	e.B = append(e.B, b...)
}

// String appends s with a uint16 length prefix.
func (e *Enc) String(s string) {
	if len(s) > 0xffff {
		panic("wire: Enc.String of more than 65535 bytes")
	}
	e.U16(uint16(len(s)))
	e.B = append(e.B, s...)
}

// Dec reads big-endian fields from a payload. The first error sticks: later
// reads return zero values, and Err (or Finish) reports the first failure,
// so a decoder reads every field and checks once.
type Dec struct {
	b   []byte
	off int
	err error
}

// NewDec decodes b.
func NewDec(b []byte) *Dec { return &Dec{b: b} }

func (d *Dec) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b)-d.off < n {
		d.err = fmt.Errorf("%w: %s at offset %d: need %d bytes, have %d", ErrFrame, what, d.off, n, len(d.b)-d.off)
		return nil
	}
	b := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return b
}

// U8 reads one byte.
func (d *Dec) U8() uint8 {
	if b := d.take(1, "u8"); b != nil {
		return b[0]
	}
	return 0
}

// U16 reads a uint16.
func (d *Dec) U16() uint16 {
	if b := d.take(2, "u16"); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

// U32 reads a uint32.
func (d *Dec) U32() uint32 {
	if b := d.take(4, "u32"); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// U64 reads a uint64.
func (d *Dec) U64() uint64 {
	if b := d.take(8, "u64"); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// Fixed reads n bytes; the result aliases the payload.
func (d *Dec) Fixed(n int) []byte { return d.take(n, "fixed field") }

// Bytes reads a uint16-prefixed byte string of at most max bytes; the
// result aliases the payload.
func (d *Dec) Bytes(max int) []byte {
	n := int(d.U16())
	if d.err == nil && n > max {
		d.err = fmt.Errorf("%w: field of %d bytes exceeds %d", ErrFrame, n, max)
		return nil
	}
	return d.take(n, "byte string")
}

// String reads a uint16-prefixed string of at most max bytes.
func (d *Dec) String(max int) string { return string(d.Bytes(max)) }

// Err is the first decoding error.
func (d *Dec) Err() error { return d.err }

// Finish returns the first decoding error, or an error if bytes are left
// over: a payload must be consumed exactly.
func (d *Dec) Finish() error {
	if d.err == nil && d.off != len(d.b) {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(d.b)-d.off)
	}
	return d.err
}
