package uverbs

import (
	"encoding/binary"
	"fmt"
)

// endpointWireSize is the size of an encoded Endpoint.
const endpointWireSize = 1 + 4 + 4 + 16 + 1

// endpointVersion is the first byte of an encoded Endpoint.
const endpointVersion = 1

// MarshalBinary encodes the endpoint for out-of-band exchange:
// version(1) QPN(4, big-endian) PSN(4) GID(16) MTU(1).
func (e Endpoint) MarshalBinary() ([]byte, error) {
	b := make([]byte, 0, endpointWireSize)
	b = append(b, endpointVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(e.QPN))
	b = binary.BigEndian.AppendUint32(b, uint32(e.PSN))
	b = append(b, e.GID[:]...)
	return append(b, byte(e.MTU)), nil
}

// UnmarshalBinary decodes an endpoint produced by MarshalBinary, rejecting
// unknown versions and out-of-range fields.
func (e *Endpoint) UnmarshalBinary(b []byte) error {
	if len(b) != endpointWireSize {
		return fmt.Errorf("uverbs: endpoint of %d bytes, want %d", len(b), endpointWireSize)
	}
	if b[0] != endpointVersion {
		return fmt.Errorf("uverbs: endpoint version %d not supported", b[0])
	}
	qpn := binary.BigEndian.Uint32(b[1:])
	psn := binary.BigEndian.Uint32(b[5:])
	mtu := MTU(b[25])
	if qpn > 0xffffff || psn > 0xffffff || (mtu != 0 && mtu.Bytes() == 0) {
		return fmt.Errorf("uverbs: endpoint out of range (QPN %#x PSN %#x MTU %d)", qpn, psn, mtu)
	}
	*e = Endpoint{QPN: QPN(qpn), PSN: PSN(psn), MTU: mtu}
	copy(e.GID[:], b[9:25])
	return nil
}

// LocalEndpoint describes this QP for its peer: its QPN, the initial send
// PSN the caller chose, the GID it will use and the port's active MTU.
func (qp *QP) LocalEndpoint(port uint8, gid GID, psn PSN) (Endpoint, error) {
	if port == 0 {
		port = 1
	}
	pa, err := qp.pd.ctx.QueryPort(port)
	if err != nil {
		return Endpoint{}, err
	}
	return Endpoint{QPN: qp.qpn, PSN: psn & 0xffffff, GID: gid, MTU: pa.ActiveMTU}, nil
}
