package rdma

import (
	"testing"

	"github.com/rdmago/te/uverbs"
)

// FuzzControlMessages feeds every control message decoder bytes from a
// peer: none may panic, and what decodes must encode back to the same
// bytes.
func FuzzControlMessages(f *testing.F) {
	c := connectMsg{Initiator: "10.0.0.1:15001", InitEpoch: 1, TargetEpoch: 2, ID: 3, LocalRail: 1, RemoteRail: 1,
		Port: portInfo{GID: uverbs.GID{15: 1}, MTU: uverbs.MTU1024}, QPs: []qpInfo{{QPN: 0x11, PSN: 0x22}, {QPN: 0x12, PSN: 0x23}}}
	a := acceptMsg{ID: 3, Port: c.Port, QPs: c.QPs}
	rj := rejectMsg{Code: rejectStaleEpoch, Msg: "stale"}
	f.Add(uint8(0), c.encode())
	f.Add(uint8(1), a.encode())
	f.Add(uint8(2), rj.encode())
	f.Add(uint8(3), encodeRelease(9))
	f.Add(uint8(4), encodeCredits([]credit{{ep: 1, qp: 0, num: 3}, {ep: 2, qp: 1, num: 1}}))
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		switch which % 5 {
		case 0:
			if m, err := decodeConnect(b); err == nil {
				if string(m.encode()) != string(b) {
					t.Fatalf("connect re-encodes differently")
				}
				if len(m.QPs) == 0 || len(m.QPs) > maxQPsPerMsg {
					t.Fatalf("connect with %d QPs accepted", len(m.QPs))
				}
			}
		case 1:
			if m, err := decodeAccept(b); err == nil && string(m.encode()) != string(b) {
				t.Fatalf("accept re-encodes differently")
			}
		case 2:
			if m, err := decodeReject(b); err == nil && string(m.encode()) != string(b) {
				t.Fatalf("reject re-encodes differently")
			}
		case 3:
			if id, err := decodeRelease(b); err == nil && string(encodeRelease(id)) != string(b) {
				t.Fatalf("release re-encodes differently")
			}
		case 4:
			if cs, err := decodeCredits(b, nil); err == nil && string(encodeCredits(cs)) != string(b) {
				t.Fatalf("credit re-encodes differently")
			}
		}
	})
}
