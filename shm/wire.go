package shm

import (
	"fmt"
	"io"
	"net"

	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/wire"
)

// Control messages: one per SOCK_SEQPACKET packet, framed by internal/wire
// (magic "TSHM", version, type, length), fields big-endian. The connection
// opens with te's handshake (internal/control: control.SHM); memory files
// travel as SCM_RIGHTS attached to MAP and WELCOME.
//
//	initiator → target  HELLO      control's hello
//	target → initiator  CHALLENGE  control's challenge
//	initiator → target  ANSWER     control's answer
//	target → initiator  VERDICT    control's verdict
//	target → initiator  WELCOME    u32 maps | u32 slots | u32 ctl size  + fd: control page
//	target → initiator  MAP ×maps  u32 slot | u32 gen | u64 addr | u64 len | u64 file offset  + fd
//	    then at any time:
//	initiator → target  MAPREQ     u64 addr | u64 len
//	target → initiator  MAP, or NOMAP u64 addr | u64 len
//	target → initiator  UNMAP      u32 slot | u32 gen
//	target → initiator  REFUSED    str reason (then it closes)
//	initiator → target  BELL       notes in the ring (notify.go)
//	target → initiator  ROOM       a free slot in the ring
//	target → initiator  NOTELOST   u64 id | u16 status
var handshake = &control.SHM

// The handshake's types (the fuzz test builds packets with them).
var (
	msgHello = control.SHM.Hello
)

const (
	msgWelcome wire.Type = 4
	msgMap     wire.Type = 5
	msgUnmap   wire.Type = 6
	msgMapReq  wire.Type = 7
	msgNoMap   wire.Type = 8
	msgRefused wire.Type = 9
)

const maxReason = 256

var proto = handshake.Proto("shm", func(t wire.Type) (int, bool) {
	switch t {
	case msgWelcome:
		return 12, true
	case msgMap:
		return 32, true
	case msgUnmap:
		return 8, true
	case msgMapReq, msgNoMap:
		return 16, true
	case msgRefused:
		return 2 + maxReason, true
	case msgNoteBell, msgNoteRoom:
		return 0, true
	case msgNoteLost:
		return 10, true
	}
	return 0, false
}, func(t wire.Type) string {
	names := [...]string{4: "WELCOME", 5: "MAP", 6: "UNMAP", 7: "MAPREQ", 8: "NOMAP", 9: "REFUSED", 13: "BELL", 14: "NOTELOST", 15: "ROOM"}
	if int(t) < len(names) && names[t] != "" {
		return names[t]
	}
	return fmt.Sprintf("type %d", t)
})

// maxPacket bounds a received packet (header and the largest payload).
const maxPacket = wire.HeaderLen + control.MaxHello

// conn frames c's packets.
func conn(c *net.UnixConn) *control.PacketConn {
	return control.Packet(c, &proto, make([]byte, maxPacket))
}

type welcome struct {
	maps, slots, ctlSize uint32
}

func (w welcome) append(b []byte) []byte {
	var e wire.Enc
	e.U32(w.maps)
	e.U32(w.slots)
	e.U32(w.ctlSize)
	return proto.Append(b, msgWelcome, 0, e.B)
}

func parseWelcome(p []byte) (welcome, error) {
	d := wire.NewDec(p)
	w := welcome{maps: d.U32(), slots: d.U32(), ctlSize: d.U32()}
	return w, d.Finish()
}

// mapMsg offers one registered region: its slot in the control page, the
// generation that slot holds while the region is live, the region's
// address in the target and its offset in the attached memory file.
type mapMsg struct {
	slot, gen uint32
	addr, n   uint64
	off       uint64
}

func (m mapMsg) append(b []byte) []byte {
	var e wire.Enc
	e.U32(m.slot)
	e.U32(m.gen)
	e.U64(m.addr)
	e.U64(m.n)
	e.U64(m.off)
	return proto.Append(b, msgMap, 0, e.B)
}

func parseMap(p []byte) (mapMsg, error) {
	d := wire.NewDec(p)
	m := mapMsg{slot: d.U32(), gen: d.U32(), addr: d.U64(), n: d.U64(), off: d.U64()}
	if err := d.Finish(); err != nil {
		return m, err
	}
	if m.slot >= maxSlots || m.gen == 0 || m.n == 0 || m.addr+m.n < m.addr || m.off+m.n < m.off {
		return m, fmt.Errorf("%w: shm: MAP slot %d gen %d [%#x+%d) at offset %#x", wire.ErrFrame, m.slot, m.gen, m.addr, m.n, m.off)
	}
	return m, nil
}

func appendUnmap(b []byte, slot, gen uint32) []byte {
	var e wire.Enc
	e.U32(slot)
	e.U32(gen)
	return proto.Append(b, msgUnmap, 0, e.B)
}

func parseUnmap(p []byte) (slot, gen uint32, err error) {
	d := wire.NewDec(p)
	slot, gen = d.U32(), d.U32()
	if err := d.Finish(); err != nil {
		return 0, 0, err
	}
	if slot >= maxSlots {
		return 0, 0, fmt.Errorf("%w: shm: UNMAP slot %d", wire.ErrFrame, slot)
	}
	return slot, gen, nil
}

// appendRange encodes MAPREQ and NOMAP.
func appendRange(b []byte, t wire.Type, addr, n uint64) []byte {
	var e wire.Enc
	e.U64(addr)
	e.U64(n)
	return proto.Append(b, t, 0, e.B)
}

func parseRange(p []byte) (addr, n uint64, err error) {
	d := wire.NewDec(p)
	addr, n = d.U64(), d.U64()
	return addr, n, d.Finish()
}

func appendRefused(b []byte, reason string) []byte {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	var e wire.Enc
	e.String(reason)
	return proto.Append(b, msgRefused, 0, e.B)
}

func parseRefused(p []byte) (string, error) {
	d := wire.NewDec(p)
	s := d.String(maxReason)
	return s, d.Finish()
}

// recvPacket is control.PacketConn.Recv over a uds.Receiver: one packet
// into buf, checked against proto.
func recvPacket(r *uds.Receiver, buf []byte) (wire.Header, []byte, []int, error) {
	n, fds, err := r.Recv(buf)
	if err != nil {
		return wire.Header{}, nil, nil, err
	}
	if n == 0 {
		uds.Close(fds)
		return wire.Header{}, nil, nil, io.EOF
	}
	h, p, err := control.ParsePacket(&proto, buf[:n])
	if err != nil {
		uds.Close(fds)
		return wire.Header{}, nil, nil, err
	}
	return h, p, fds, nil
}
