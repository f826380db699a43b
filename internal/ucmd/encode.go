package ucmd

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmago/te/internal/uapi"
)

var le = binary.LittleEndian

// ErrTooLarge means a command does not fit the command arena or the 16-bit
// word counts of the write() header.
var ErrTooLarge = errors.New("ucmd: command too large")

const (
	cmdHdrSize   = 8
	exCmdHdrSize = 16
	// respOff is where write() responses go inside the arena.
	respOff = 2048
)

// EncodeWrite lays out a legacy (non-extended) write() command in buf, whose
// first byte is at address base:
//
//	buf[0:8]   ib_uverbs_cmd_hdr{cmd, in_words, out_words}
//	buf[8:]    req, then drvIn (driver request)
//	buf[2048:] response area: core response (respLen) then driver response (drvOutLen)
//
// in_words counts the whole write including the header in 4-byte words;
// out_words counts core+driver response bytes. When respLen+drvOutLen > 0 the
// first 8 bytes of req must be the response pointer field and are set to
// base+2048. It returns the number of bytes to write().
func EncodeWrite(buf []byte, base uint64, cmd uint32, req, drvIn []byte, respLen, drvOutLen int) (int, error) {
	n := cmdHdrSize + len(req) + len(drvIn)
	out := respLen + drvOutLen
	if n%4 != 0 || out%4 != 0 || n/4 > 0xffff || out/4 > 0xffff || n > respOff || respOff+out > len(buf) {
		return 0, fmt.Errorf("%w: write cmd %d: %d request bytes, %d response bytes", ErrTooLarge, cmd, n, out)
	}
	clear(buf[:n])
	le.PutUint32(buf[0:], cmd)
	le.PutUint16(buf[4:], uint16(n/4))
	le.PutUint16(buf[6:], uint16(out/4))
	copy(buf[cmdHdrSize:], req)
	copy(buf[cmdHdrSize+len(req):], drvIn)
	if out > 0 {
		if len(req) < 8 {
			return 0, fmt.Errorf("ucmd: write cmd %d has a response but no response field", cmd)
		}
		le.PutUint64(buf[cmdHdrSize:], base+respOff)
		clear(buf[respOff : respOff+out])
	}
	return n, nil
}

// EncodeWriteEx lays out an extended write() command (cmd has bit 31 set):
//
//	buf[0:8]   ib_uverbs_cmd_hdr{cmd, in_words = len(req)/8, out_words = respLen/8}
//	buf[8:24]  ib_uverbs_ex_cmd_hdr{response, provider_in_words, provider_out_words}
//	buf[24:]   req, then drvIn
//	buf[2048:] response area (zero-filled): core response then driver response
//
// Word counts are in 8-byte units and exclude both headers.
func EncodeWriteEx(buf []byte, base uint64, cmd uint32, req, drvIn []byte, respLen, drvOutLen int) (int, error) {
	n := cmdHdrSize + exCmdHdrSize + len(req) + len(drvIn)
	out := respLen + drvOutLen
	if cmd&uapi.CmdFlagExtended == 0 || len(req)%8 != 0 || len(drvIn)%8 != 0 || respLen%8 != 0 || drvOutLen%8 != 0 ||
		len(req)/8 > 0xffff || len(drvIn)/8 > 0xffff || respLen/8 > 0xffff || drvOutLen/8 > 0xffff ||
		n > respOff || respOff+out > len(buf) {
		return 0, fmt.Errorf("%w: ex cmd %#x: %d+%d request bytes, %d+%d response bytes", ErrTooLarge, cmd, len(req), len(drvIn), respLen, drvOutLen)
	}
	clear(buf[:n])
	le.PutUint32(buf[0:], cmd)
	le.PutUint16(buf[4:], uint16(len(req)/8))
	le.PutUint16(buf[6:], uint16(respLen/8))
	if out > 0 {
		le.PutUint64(buf[8:], base+respOff)
		clear(buf[respOff : respOff+out])
	}
	le.PutUint16(buf[16:], uint16(len(drvIn)/8))
	le.PutUint16(buf[18:], uint16(drvOutLen/8))
	copy(buf[24:], req)
	copy(buf[24+len(req):], drvIn)
	return n, nil
}

// Response returns the response area of a write command encoded in buf.
func Response(buf []byte, n int) []byte { return buf[respOff : respOff+n] }

// ---- ioctl -------------------------------------------------------------------

const (
	ioctlHdrSize = 24
	attrSize     = 16
	// MaxAttrs is how many attributes a Builder holds.
	MaxAttrs = 24
	// dataStart is where attribute payloads start in the buffer.
	dataStart = 512
)

// Builder encodes one RDMA_VERBS_IOCTL call into a buffer at address base:
// the header and the attribute array at the start, attribute payloads
// (PTR_IN > 8 bytes, PTR_OUT buffers) from offset 512 on, 8-byte aligned.
type Builder struct {
	buf    []byte
	base   uint64
	n      int
	data   int
	err    error
	driver uint32
	obj    uint16
	method uint16
}

// NewBuilder starts an ioctl for (object, method) with the device's driver id.
func NewBuilder(buf []byte, base uint64, driverID uint32, object, method uint16) *Builder {
	b := &Builder{}
	b.Reset(buf, base, driverID, object, method)
	return b
}

// Reset reuses b for a new call.
func (b *Builder) Reset(buf []byte, base uint64, driverID uint32, object, method uint16) {
	*b = Builder{buf: buf, base: base, data: dataStart, driver: driverID, obj: object, method: method}
	clear(buf[:dataStart])
}

func (b *Builder) attr(id uint16, length int, flags uint16, data uint64) int {
	if b.err != nil {
		return -1
	}
	if b.n == MaxAttrs {
		b.err = fmt.Errorf("%w: more than %d ioctl attributes", ErrTooLarge, MaxAttrs)
		return -1
	}
	if length > 0xffff {
		b.err = fmt.Errorf("%w: attribute %#x of %d bytes", ErrTooLarge, id, length)
		return -1
	}
	a := b.buf[ioctlHdrSize+attrSize*b.n:]
	le.PutUint16(a[0:], id)
	le.PutUint16(a[2:], uint16(length))
	le.PutUint16(a[4:], flags)
	le.PutUint16(a[6:], 0)
	le.PutUint64(a[8:], data)
	b.n++
	return b.n - 1
}

func (b *Builder) alloc(n int) int {
	off := b.data
	if b.err == nil && off+n > len(b.buf) {
		b.err = fmt.Errorf("%w: ioctl payloads exceed %d bytes", ErrTooLarge, len(b.buf))
		return -1
	}
	b.data = (off + n + 7) &^ 7
	return off
}

// In adds a PTR_IN attribute. Payloads of up to 8 bytes travel inline in the
// attribute's data field (the kernel never dereferences them); larger ones
// are copied into the buffer and passed by address.
func (b *Builder) In(id uint16, v []byte, flags uint16) int {
	if len(v) <= 8 {
		var x [8]byte
		copy(x[:], v)
		return b.attr(id, len(v), flags, le.Uint64(x[:]))
	}
	off := b.alloc(len(v))
	if off < 0 {
		return -1
	}
	copy(b.buf[off:], v)
	return b.attr(id, len(v), flags, b.base+uint64(off))
}

// InU32 adds a 4-byte PTR_IN attribute (inline).
func (b *Builder) InU32(id uint16, v uint32, flags uint16) int {
	return b.attr(id, 4, flags, uint64(v))
}

// InU64 adds an 8-byte PTR_IN attribute (inline).
func (b *Builder) InU64(id uint16, v uint64, flags uint16) int {
	return b.attr(id, 8, flags, v)
}

// Const adds a CONST_IN attribute; its length is always 8.
func (b *Builder) Const(id uint16, v uint64, flags uint16) int { return b.attr(id, 8, flags, v) }

// Out adds a PTR_OUT attribute of n bytes (always passed by address, even
// when small). Read it after the call with Output.
func (b *Builder) Out(id uint16, n int, flags uint16) int {
	off := b.alloc(n)
	if off < 0 {
		return -1
	}
	clear(b.buf[off : off+n])
	return b.attr(id, n, flags, b.base+uint64(off))
}

// IDR adds an object handle (IDR) attribute: length 0, the handle in data.
func (b *Builder) IDR(id uint16, handle uint32, flags uint16) int {
	return b.attr(id, 0, flags, uint64(handle))
}

// NewIDR adds an IDR attribute with ACCESS_NEW; the kernel writes the new
// handle into the attribute's data field (read it with Data).
func (b *Builder) NewIDR(id uint16, flags uint16) int { return b.attr(id, 0, flags, 0) }

// FD adds a file-descriptor attribute (comp channel, async event fd).
func (b *Builder) FD(id uint16, fd int32, flags uint16) int {
	return b.attr(id, 0, flags, uint64(uint32(fd)))
}

// NewFD adds an FD attribute with ACCESS_NEW; the kernel writes the new fd
// number into the attribute's data field.
func (b *Builder) NewFD(id uint16, flags uint16) int { return b.attr(id, 0, flags, 0) }

// UHWIn adds driver request data (UVERBS_ATTR_UHW_IN); nothing if empty.
func (b *Builder) UHWIn(v []byte) int {
	if len(v) == 0 {
		return -1
	}
	return b.In(uapi.AttrUHWIn, v, 0)
}

// UHWOut adds a driver response buffer (UVERBS_ATTR_UHW_OUT); nothing if n is 0.
func (b *Builder) UHWOut(n int) int {
	if n == 0 {
		return -1
	}
	return b.Out(uapi.AttrUHWOut, n, 0)
}

// Finish writes the header and returns the encoded length of the header and
// attribute array (what the kernel's length field must equal).
func (b *Builder) Finish() (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n := ioctlHdrSize + attrSize*b.n
	le.PutUint16(b.buf[0:], uint16(n))
	le.PutUint16(b.buf[2:], b.obj)
	le.PutUint16(b.buf[4:], b.method)
	le.PutUint16(b.buf[6:], uint16(b.n))
	le.PutUint64(b.buf[8:], 0)
	le.PutUint32(b.buf[16:], b.driver)
	le.PutUint32(b.buf[20:], 0)
	return n, nil
}

func (b *Builder) attrBytes(i int) []byte {
	if i < 0 || i >= b.n {
		return nil
	}
	return b.buf[ioctlHdrSize+attrSize*i : ioctlHdrSize+attrSize*(i+1)]
}

// Data returns attribute i's data field (after the call: new handles/fds).
func (b *Builder) Data(i int) uint64 {
	a := b.attrBytes(i)
	if a == nil {
		return 0
	}
	return le.Uint64(a[8:])
}

// Flags returns attribute i's flags (the kernel sets AttrFValidOutput).
func (b *Builder) Flags(i int) uint16 {
	a := b.attrBytes(i)
	if a == nil {
		return 0
	}
	return le.Uint16(a[4:])
}

// Output returns the buffer of PTR_OUT attribute i.
func (b *Builder) Output(i int) []byte {
	a := b.attrBytes(i)
	if a == nil {
		return nil
	}
	rel := le.Uint64(a[8:]) - b.base
	n := int(le.Uint16(a[2:]))
	if rel < dataStart || rel > uint64(len(b.buf)) || int(rel)+n > len(b.buf) {
		return nil
	}
	off := int(rel)
	return b.buf[off : off+n]
}
