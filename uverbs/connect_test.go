package uverbs

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestConnectAttrsRoCE: on an Ethernet port the peer is reached by GID
// with a GRH; defaults fill what the caller left zero.
func TestConnectAttrsRoCE(t *testing.T) {
	gid := GIDFromAddr(netip.MustParseAddr("10.0.1.2"))
	cfg := ConnectConfig{SGIDIndex: 3, LocalPSN: 0x1abcdef, TrafficClass: 96, SL: 2,
		Remote: Endpoint{QPN: 0x99, PSN: 0x2000001, GID: gid, MTU: MTU1024, LID: 5}}
	pa := PortAttr{ActiveMTU: MTU4096, LinkLayer: LinkLayerEthernet}
	rtr, rts, err := connectAttrs(&cfg, &pa)
	if err != nil {
		t.Fatal(err)
	}
	wantRTR := QPAttr{State: QPStateRTR, PathMTU: MTU1024, DestQPN: 0x99, RQPSN: 1, MaxDestRdAtomic: 16, MinRNRTimer: 12,
		AV: AddressVector{DGID: gid, SGIDIndex: 3, HopLimit: 64, TrafficClass: 96, SL: 2, IsGlobal: true, Port: 1}}
	wantRTS := QPAttr{State: QPStateRTS, Timeout: 14, RetryCnt: 6, RNRRetry: 7, SQPSN: 0xabcdef, MaxRdAtomic: 16}
	if d := cmp.Diff(wantRTR, rtr); d != "" {
		t.Errorf("RTR (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantRTS, rts); d != "" {
		t.Errorf("RTS (-want +got):\n%s", d)
	}
	if cfg.Port != 1 || cfg.Access != AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic {
		t.Errorf("defaults: port %d access %v", cfg.Port, cfg.Access)
	}
}

// TestConnectAttrsInfiniBand: on an InfiniBand port the peer is reached by
// its LID, without a GRH; a peer endpoint without a LID is refused.
func TestConnectAttrsInfiniBand(t *testing.T) {
	cfg := ConnectConfig{Port: 2, SGIDIndex: 3, MTU: MTU2048, RNRRetry: 3, SL: 1,
		Remote: Endpoint{QPN: 0x77, PSN: 9, GID: GIDFromAddr(netip.MustParseAddr("10.0.1.2")), MTU: MTU4096, LID: 0x0102}}
	pa := PortAttr{ActiveMTU: MTU4096, LinkLayer: LinkLayerInfiniBand, LID: 0x0201}
	rtr, rts, err := connectAttrs(&cfg, &pa)
	if err != nil {
		t.Fatal(err)
	}
	wantRTR := QPAttr{State: QPStateRTR, PathMTU: MTU2048, DestQPN: 0x77, RQPSN: 9, MaxDestRdAtomic: 16, MinRNRTimer: 12,
		AV: AddressVector{DLID: 0x0102, SL: 1, Port: 2}}
	if d := cmp.Diff(wantRTR, rtr); d != "" {
		t.Errorf("RTR (-want +got):\n%s", d)
	}
	if rts.RNRRetry != 3 || rts.State != QPStateRTS {
		t.Errorf("RTS %+v", rts)
	}

	cfg.Remote.LID = 0
	if _, _, err := connectAttrs(&cfg, &pa); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("peer without a LID: %v", err)
	}
}
