package rdma

import (
	"errors"
	"fmt"

	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/uverbs"
)

// The control connection carries internal/wire frames (magic "TERH"). It
// opens with te's handshake (internal/control: control.RDMA's hello,
// challenge, answer and verdict, with or without a secret): no endpoint is
// set up before the target's verdict. Then the initiator sends hsConnect
// for each endpoint it needs and hsRelease for one it evicts; the target
// answers every hsConnect with hsAccept or hsReject. Those frames are
// strictly request/response, one at a time; besides them the target sends
// hsCredit whenever it has reposted notification receives (notify.go),
// which the initiator's reader takes aside.
//
// Version 3 (control.RDMA.Version) added the accept's notification
// credits and hsCredit.
const (
	hsConnect wire.Type = 1
	hsAccept  wire.Type = 2
	hsReject  wire.Type = 3
	hsRelease wire.Type = 4
	// Types 5 to 8 are the handshake's (control.RDMA).
	hsCredit wire.Type = 9

	maxNameLen = 1024
	maxMsgLen  = 1024
	// maxQPsPerMsg bounds the QPs of one endpoint in a message.
	maxQPsPerMsg = 64
	// maxCreditsPerMsg bounds the entries of one credit message.
	maxCreditsPerMsg = 512
	creditLen        = 4 + 1 + 2
)

var (
	handshake = &control.RDMA
	hsProto   = handshake.Proto("rdma handshake", func(t wire.Type) (int, bool) {
		switch t {
		case hsConnect:
			return 2 + maxNameLen + 8 + 8 + 4 + 2 + 2 + portInfoLen + 1 + maxQPsPerMsg*8, true
		case hsAccept:
			return 4 + portInfoLen + 1 + maxQPsPerMsg*8 + 2, true
		case hsReject:
			return 1 + 2 + maxMsgLen, true
		case hsRelease:
			return 4, true
		case hsCredit:
			return 2 + maxCreditsPerMsg*creditLen, true
		}
		return 0, false
	}, func(t wire.Type) string {
		switch t {
		case hsConnect:
			return "connect"
		case hsAccept:
			return "accept"
		case hsReject:
			return "reject"
		case hsRelease:
			return "release"
		case hsCredit:
			return "credit"
		}
		return fmt.Sprintf("type %d", uint8(t))
	})
)

// rejectCode says why a target refused an endpoint.
type rejectCode uint8

const (
	rejectStaleEpoch rejectCode = 1 // the initiator addressed another incarnation
	rejectLimit      rejectCode = 2 // QP bounds reached
	rejectBadRail    rejectCode = 3 // no such target rail
	rejectInternal   rejectCode = 4 // creating or connecting a QP failed
	rejectProtocol   rejectCode = 6 // a malformed or unexpected message
)

// errRejected wraps every refusal; the message carries the target's reason.
var errRejected = errors.New("rdma: handshake rejected")

// portInfo is the part of uverbs.Endpoint that is per port.
type portInfo struct {
	GID uverbs.GID
	LID uint16
	MTU uverbs.MTU
}

const portInfoLen = 16 + 2 + 1

func (p portInfo) put(e *wire.Enc) {
	e.Fixed(p.GID[:])
	e.U16(p.LID)
	e.U8(uint8(p.MTU))
}

func getPortInfo(d *wire.Dec) portInfo {
	var p portInfo
	copy(p.GID[:], d.Fixed(16))
	p.LID = d.U16()
	p.MTU = uverbs.MTU(d.U8())
	return p
}

// qpInfo is one QP's half of a connection.
type qpInfo struct {
	QPN uverbs.QPN
	PSN uverbs.PSN
}

func putQPs(e *wire.Enc, qps []qpInfo) {
	e.U8(uint8(len(qps)))
	for _, q := range qps {
		e.U32(uint32(q.QPN))
		e.U32(uint32(q.PSN))
	}
}

func getQPs(d *wire.Dec) []qpInfo {
	n := int(d.U8())
	if d.Err() != nil {
		return nil
	}
	if n == 0 || n > maxQPsPerMsg {
		d.Fixed(-1) // poison: a QP count outside 1..maxQPsPerMsg
		return nil
	}
	qps := make([]qpInfo, 0, n)
	for range n {
		qpn, psn := d.U32(), d.U32()
		if qpn > 0xffffff || psn > 0xffffff {
			d.Fixed(-1) // poison: QPNs and PSNs are 24 bits
			return nil
		}
		qps = append(qps, qpInfo{QPN: uverbs.QPN(qpn), PSN: uverbs.PSN(psn)})
	}
	return qps
}

// connectMsg asks the target for one endpoint.
type connectMsg struct {
	Initiator   string // initiator segment name
	InitEpoch   uint64 // initiator's epoch
	TargetEpoch uint64 // the target incarnation the initiator resolved
	ID          uint32 // endpoint id, unique per control connection
	LocalRail   uint16 // initiator rail index
	RemoteRail  uint16 // target rail index
	Port        portInfo
	QPs         []qpInfo
}

func (m *connectMsg) encode() []byte {
	var e wire.Enc
	e.String(m.Initiator)
	e.U64(m.InitEpoch)
	e.U64(m.TargetEpoch)
	e.U32(m.ID)
	e.U16(m.LocalRail)
	e.U16(m.RemoteRail)
	m.Port.put(&e)
	putQPs(&e, m.QPs)
	return e.B
}

func decodeConnect(b []byte) (connectMsg, error) {
	d := wire.NewDec(b)
	m := connectMsg{Initiator: d.String(maxNameLen), InitEpoch: d.U64(), TargetEpoch: d.U64(), ID: d.U32(),
		LocalRail: d.U16(), RemoteRail: d.U16(), Port: getPortInfo(d)}
	m.QPs = getQPs(d)
	if err := d.Finish(); err != nil {
		return connectMsg{}, fmt.Errorf("rdma: connect message: %w", err)
	}
	if m.Initiator == "" {
		return connectMsg{}, fmt.Errorf("rdma: connect message: %w: empty initiator name", wire.ErrFrame)
	}
	return m, nil
}

// acceptMsg is the target's half of an endpoint.
type acceptMsg struct {
	ID   uint32
	Port portInfo
	QPs  []qpInfo
	// Notes is how many notification receives each QP has posted: the
	// initiator's credits per QP.
	Notes uint16
}

func (m *acceptMsg) encode() []byte {
	var e wire.Enc
	e.U32(m.ID)
	m.Port.put(&e)
	putQPs(&e, m.QPs)
	e.U16(m.Notes)
	return e.B
}

func decodeAccept(b []byte) (acceptMsg, error) {
	d := wire.NewDec(b)
	m := acceptMsg{ID: d.U32(), Port: getPortInfo(d)}
	m.QPs = getQPs(d)
	m.Notes = d.U16()
	if err := d.Finish(); err != nil {
		return acceptMsg{}, fmt.Errorf("rdma: accept message: %w", err)
	}
	return m, nil
}

type rejectMsg struct {
	Code rejectCode
	Msg  string
}

func (m *rejectMsg) encode() []byte {
	var e wire.Enc
	e.U8(uint8(m.Code))
	if len(m.Msg) > maxMsgLen {
		m.Msg = m.Msg[:maxMsgLen]
	}
	e.String(m.Msg)
	return e.B
}

func decodeReject(b []byte) (rejectMsg, error) {
	d := wire.NewDec(b)
	m := rejectMsg{Code: rejectCode(d.U8()), Msg: d.String(maxMsgLen)}
	if err := d.Finish(); err != nil {
		return rejectMsg{}, fmt.Errorf("rdma: reject message: %w", err)
	}
	return m, nil
}

func encodeRelease(id uint32) []byte {
	var e wire.Enc
	e.U32(id)
	return e.B
}

func decodeRelease(b []byte) (uint32, error) {
	d := wire.NewDec(b)
	id := d.U32()
	return id, d.Finish()
}

// encodeCredits encodes credit entries: u16 count, then per entry the
// endpoint id (u32), the QP's index in it (u8) and the receives reposted
// (u16).
func encodeCredits(cs []credit) []byte { return putCredits(nil, cs) }

// putCredits appends the encoding of cs to b.
func putCredits(b []byte, cs []credit) []byte {
	e := wire.Enc{B: b}
	e.U16(uint16(len(cs)))
	for _, c := range cs {
		e.U32(c.ep)
		e.U8(c.qp)
		e.U16(c.num)
	}
	return e.B
}

// decodeCredits appends the entries of a credit message to out.
func decodeCredits(b []byte, out []credit) ([]credit, error) {
	d := wire.NewDec(b)
	n := int(d.U16())
	if d.Err() == nil && (n == 0 || n > maxCreditsPerMsg) {
		return out, fmt.Errorf("rdma: credit message: %w: %d entries (1 to %d)", wire.ErrFrame, n, maxCreditsPerMsg)
	}
	for range n {
		c := credit{ep: d.U32(), qp: d.U8(), num: d.U16()}
		if d.Err() != nil {
			break
		}
		out = append(out, c)
	}
	if err := d.Finish(); err != nil {
		return out, fmt.Errorf("rdma: credit message: %w", err)
	}
	return out, nil
}
