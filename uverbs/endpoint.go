package uverbs

import (
	"encoding/binary"
	"fmt"
)

// Encoded endpoints: version(1) QPN(4, big-endian) PSN(4) GID(16) MTU(1),
// then, in version 2 only, LID(2). An endpoint without a LID (RoCE) is
// encoded as version 1, so peers that predate LIDs still read it; one with
// a LID (InfiniBand) as version 2.
const (
	endpointV1Size = 1 + 4 + 4 + 16 + 1
	endpointV2Size = endpointV1Size + 2
)

// MarshalBinary encodes the endpoint for out-of-band exchange.
func (e Endpoint) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, endpointV2Size)
	v := byte(1)
	if e.LID != 0 {
		v = 2
	}
	b = append(b, v)
	b = binary.BigEndian.AppendUint32(b, uint32(e.QPN))
	b = binary.BigEndian.AppendUint32(b, uint32(e.PSN))
	b = append(b, e.GID[:]...)
	b = append(b, byte(e.MTU))
	if v == 2 {
		b = binary.BigEndian.AppendUint16(b, e.LID)
	}
	return b, nil
}

// UnmarshalBinary decodes an endpoint produced by MarshalBinary, rejecting
// unknown versions, out-of-range fields and a version 2 encoding without a
// LID (which MarshalBinary never produces).
func (e *Endpoint) UnmarshalBinary(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("uverbs: empty endpoint")
	}
	var want int
	switch b[0] {
	case 1:
		want = endpointV1Size
	case 2:
		want = endpointV2Size
	default:
		return fmt.Errorf("uverbs: endpoint version %d not supported", b[0])
	}
	if len(b) != want {
		return fmt.Errorf("uverbs: version %d endpoint of %d bytes, want %d", b[0], len(b), want)
	}
	qpn := binary.BigEndian.Uint32(b[1:])
	psn := binary.BigEndian.Uint32(b[5:])
	mtu := MTU(b[25])
	if qpn > 0xffffff || psn > 0xffffff || (mtu != 0 && mtu.Bytes() == 0) {
		return fmt.Errorf("uverbs: endpoint out of range (QPN %#x PSN %#x MTU %d)", qpn, psn, mtu)
	}
	var lid uint16
	if b[0] == 2 {
		if lid = binary.BigEndian.Uint16(b[26:]); lid == 0 {
			return fmt.Errorf("uverbs: version 2 endpoint without a LID")
		}
	}
	*e = Endpoint{QPN: QPN(qpn), PSN: PSN(psn), MTU: mtu, LID: lid}
	copy(e.GID[:], b[9:25])
	return nil
}

// LocalEndpoint describes this QP for its peer: its QPN, the initial send
// PSN the caller chose, the GID it will use, the port's active MTU and, on
// an InfiniBand port, its LID.
func (qp *QP) LocalEndpoint(port uint8, gid GID, psn PSN) (Endpoint, error) {
	if port == 0 {
		port = 1
	}
	pa, err := qp.pd.ctx.QueryPort(port)
	if err != nil {
		return Endpoint{}, err
	}
	e := Endpoint{QPN: qp.qpn, PSN: psn & 0xffffff, GID: gid, MTU: pa.ActiveMTU}
	if pa.LinkLayer == LinkLayerInfiniBand {
		e.LID = pa.LID
	}
	return e, nil
}
