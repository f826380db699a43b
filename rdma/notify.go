package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/uverbs"
)

// A notification is one SEND on an RC QP of an endpoint to the target,
// posted once every slice of its submission has completed (so its data
// is in the target's memory, whichever QPs and rails it went over). The
// target's rail owner keeps receive buffers posted on every responder QP
// and replenishes one as soon as its notification is handed over; the
// initiator sends only on a QP for which it holds a credit (a receive the
// target has posted), so no SEND ever meets an empty receive queue (RNR),
// and a target whose queue is full holds the buffer, which back-pressures
// that initiator alone. Credits come back on the control connection.
//
// A notification carries the engine's note ID; the target's inbox drops
// one it has accepted already (a SEND resent after its endpoint broke may
// have landed the first time) and one whose sender has since restarted.

const (
	noteVersion   = 1
	noteHeaderLen = 28
	// noteBufSize is one notification buffer: header, name and message at
	// their bounds, rounded to 64 bytes.
	noteBufSize = (noteHeaderLen + driver.MaxNotifyName + driver.MaxNotifyMsg + 63) &^ 63
	// noteSlab is how many buffers are mapped and registered at once.
	noteSlab = 64
	// wrRecv marks the wr_id of a posted receive: 1<<63 | gen<<32 | index.
	wrRecv = 1 << 63
	// genMask keeps generations in wr_id's bits 32..62.
	genMask = 1<<31 - 1
)

// errNoteTooLarge: a notification's name or message exceeds its bound
// (the engine checks before a transport sees it).
var errNoteTooLarge = errors.New("rdma: notification too large")

// errNoteFrame: a received notification is malformed.
var errNoteFrame = errors.New("rdma: malformed notification")

// putNote writes a notification into b (at least noteBufSize bytes) and
// returns its length:
//
//	u8 version, u8 flags (0), u16 name length, u32 message length,
//	u64 note ID, u64 byte count, u32 marks, name, message.
//
// marks is how many copies of the note the target must receive before it
// delivers it: one per QP the submission's data went over (markers), or
// 1 for a note sent after its data completed.
func putNote(b []byte, seq, bytes uint64, marks uint32, name string, msg []byte) (int, error) {
	if len(name) > driver.MaxNotifyName || len(msg) > driver.MaxNotifyMsg {
		return 0, fmt.Errorf("%w: name of %d bytes (at most %d), message of %d (at most %d)", errNoteTooLarge, len(name), driver.MaxNotifyName, len(msg), driver.MaxNotifyMsg)
	}
	b[0], b[1] = noteVersion, 0
	binary.BigEndian.PutUint16(b[2:], uint16(len(name)))
	binary.BigEndian.PutUint32(b[4:], uint32(len(msg)))
	binary.BigEndian.PutUint64(b[8:], seq)
	binary.BigEndian.PutUint64(b[16:], bytes)
	binary.BigEndian.PutUint32(b[24:], marks)
	n := noteHeaderLen + copy(b[noteHeaderLen:], name)
	n += copy(b[n:], msg)
	return n, nil
}

// parseNote decodes a received notification; name and msg alias b.
func parseNote(b []byte) (seq, bytes uint64, marks uint32, name, msg []byte, err error) {
	if len(b) < noteHeaderLen {
		return 0, 0, 0, nil, nil, fmt.Errorf("%w: %d bytes, shorter than its header", errNoteFrame, len(b))
	}
	if b[0] != noteVersion || b[1] != 0 {
		return 0, 0, 0, nil, nil, fmt.Errorf("%w: version %d flags %#x, want version %d", errNoteFrame, b[0], b[1], noteVersion)
	}
	nn, mn := int(binary.BigEndian.Uint16(b[2:])), int(binary.BigEndian.Uint32(b[4:]))
	if nn > driver.MaxNotifyName || mn > driver.MaxNotifyMsg || noteHeaderLen+nn+mn != len(b) {
		return 0, 0, 0, nil, nil, fmt.Errorf("%w: name of %d and message of %d bytes in %d", errNoteFrame, nn, mn, len(b))
	}
	seq, bytes, marks = binary.BigEndian.Uint64(b[8:]), binary.BigEndian.Uint64(b[16:]), binary.BigEndian.Uint32(b[24:])
	if marks == 0 || marks > maxMarks {
		return 0, 0, 0, nil, nil, fmt.Errorf("%w: %d marks (1 to %d)", errNoteFrame, marks, maxMarks)
	}
	return seq, bytes, marks, b[noteHeaderLen : noteHeaderLen+nn], b[noteHeaderLen+nn:], nil
}

// maxMarks bounds the markers of one note: at most maxMarkEPs endpoints
// of at most maxQPsPerMsg QPs.
const maxMarks = maxMarkEPs * maxQPsPerMsg

// noteBuf is one buffer of a rail's pool.
type noteBuf struct {
	b    []byte
	addr uint64
	lkey uint32
	gen  uint32
	next int32
	// q is the target QP a receive buffer is posted on (nil while free,
	// or while its notification waits for room: held).
	q    *tgtQP
	held bool
}

// bufPool is registered memory outside the Go heap, cut into
// notification buffers: SEND sources on an initiator, receive buffers on
// a target. It grows by noteSlab buffers up to max. Owner goroutine only.
type bufPool struct {
	r     *rail
	max   int
	bufs  []noteBuf
	slabs []poolSlab
	free  int32
	nfree int
}

type poolSlab struct {
	mem *uverbs.Buffer
	mr  memReg
}

func newBufPool(r *rail, max int) *bufPool {
	return &bufPool{r: r, max: max, free: -1}
}

// get takes a free buffer (-1: none, and none can be mapped).
func (p *bufPool) get() int32 {
	if p.free < 0 && !p.grow() {
		return -1
	}
	i := p.free
	b := &p.bufs[i]
	p.free, b.next = b.next, -1
	p.nfree--
	return i
}

// put frees a buffer; a completion that still names it (its generation)
// is stale from then on.
func (p *bufPool) put(i int32) {
	b := &p.bufs[i]
	b.gen = (b.gen + 1) & genMask
	b.q, b.held = nil, false
	b.next, p.free = p.free, i
	p.nfree++
}

func (p *bufPool) grow() bool {
	n := min(noteSlab, p.max-len(p.bufs))
	if n <= 0 {
		return false
	}
	mem, err := uverbs.AllocBuffer(n * noteBufSize)
	if err != nil {
		p.r.log.Error("rdma: notification buffers", "err", err)
		return false
	}
	mr, err := p.r.v.RegMR(mem.Bytes())
	if err != nil {
		mem.Close()
		p.r.log.Error("rdma: register notification buffers", "err", err)
		return false
	}
	p.slabs = append(p.slabs, poolSlab{mem, mr})
	all := mem.Bytes()
	for k := range n {
		b := all[k*noteBufSize : (k+1)*noteBufSize : (k+1)*noteBufSize]
		p.bufs = append(p.bufs, noteBuf{b: b, addr: engine.AddrOf(b), lkey: mr.LKey(), next: -1})
		p.put(int32(len(p.bufs) - 1))
	}
	return true
}

// close releases the pool's registrations and memory (after every QP
// that used them is destroyed).
func (p *bufPool) close() error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, s := range p.slabs {
		errs = append(errs, s.mr.Close(), s.mem.Close())
	}
	p.slabs, p.bufs, p.free, p.nfree = nil, nil, -1, 0
	return errors.Join(errs...)
}
