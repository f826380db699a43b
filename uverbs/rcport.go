package uverbs

import (
	"fmt"
	"time"
)

// RCDefaults are a provider's connection defaults where its devices need
// other values than hardware does. A Provider may implement RCDefaulter;
// RCPort.Connect applies them to fields its caller left zero.
type RCDefaults struct {
	// Timeout is the ACK timeout exponent (4.096 µs * 2^Timeout).
	Timeout uint8
	// RetryCnt is the transport retry count.
	RetryCnt uint8
	// Why says why the provider differs from the hardware defaults.
	Why string
}

// RCDefaulter is implemented by providers with their own RC defaults.
type RCDefaulter interface {
	RCDefaults() RCDefaults
}

// HardwareRCDefaults are the defaults of providers without RCDefaulter:
// perftest's ACK timeout (14, ~67 ms) and 6 retries (7 retries forever on
// some devices).
var HardwareRCDefaults = RCDefaults{Timeout: 14, RetryCnt: 6}

// RCPort is one local port prepared for reliable-connected QPs: the GID the
// side sends from, the port's attributes and the device's RDMA READ limits.
// It is plain data, safe to copy and to share.
type RCPort struct {
	Num  uint8
	GID  GIDEntry
	Attr PortAttr
	// MaxRdAtomic and MaxDestRdAtomic are the device's RDMA READs (and
	// atomics) in flight per QP as initiator and as responder.
	MaxRdAtomic, MaxDestRdAtomic uint8
	// MaxQPWR and MaxCQE are the device's queue limits.
	MaxQPWR, MaxCQE int
	// Defaults are the provider's connection defaults.
	Defaults RCDefaults
}

// RCPort queries port num (1 when 0) of c and picks its GID: index gidIndex
// when gidIndex >= 0, else on RoCE the first RoCE v2 GID that maps an IPv4
// address (what RoCE v2 over IPv4 routes with), and on InfiniBand index 0.
func (c *Context) RCPort(num uint8, gidIndex int) (RCPort, error) {
	if num == 0 {
		num = 1
	}
	pa, err := c.QueryPort(num)
	if err != nil {
		return RCPort{}, err
	}
	da, err := c.QueryDevice()
	if err != nil {
		return RCPort{}, err
	}
	p := RCPort{Num: num, Attr: pa,
		MaxRdAtomic: uint8(min(255, da.MaxQPInitRdAtom)), MaxDestRdAtomic: uint8(min(255, da.MaxQPRdAtom)),
		MaxQPWR: int(da.MaxQPWR), MaxCQE: int(da.MaxCQE), Defaults: HardwareRCDefaults}
	if d, ok := c.prov.(RCDefaulter); ok {
		p.Defaults = d.RCDefaults()
	}
	ents, err := c.QueryGIDTable()
	if err != nil {
		if ents, err = c.dev.GIDs(int(num)); err != nil {
			return RCPort{}, err
		}
	}
	for _, g := range ents {
		if g.Port != int(num) {
			continue
		}
		switch {
		case gidIndex >= 0 && g.Index == gidIndex,
			gidIndex < 0 && pa.LinkLayer == LinkLayerInfiniBand && g.Index == 0,
			gidIndex < 0 && pa.LinkLayer != LinkLayerInfiniBand && g.Type == GIDTypeRoCEv2 && g.GID.Addr().Is4():
			p.GID = g
			return p, nil
		}
	}
	if gidIndex >= 0 {
		return RCPort{}, fmt.Errorf("uverbs: %s port %d has no GID index %d", c.dev.Name, num, gidIndex)
	}
	return RCPort{}, fmt.Errorf("uverbs: %s port %d has no RoCE v2 IPv4 GID (choose a GID index)", c.dev.Name, num)
}

// Endpoint describes qp on this port for its peer, with initial send PSN
// psn: QPN, PSN, GID, active MTU and, on InfiniBand, the LID.
func (p RCPort) Endpoint(qp *QP, psn PSN) Endpoint {
	e := Endpoint{QPN: qp.QPN(), PSN: psn & 0xffffff, GID: p.GID.GID, MTU: p.Attr.ActiveMTU}
	if p.Attr.LinkLayer == LinkLayerInfiniBand {
		e.LID = p.Attr.LID
	}
	return e
}

// Connect brings qp (in RESET or INIT) to RTS against remote, sending from
// this port's GID with initial PSN psn. Fields of tune that are zero take
// the port's values: the path MTU is the smaller active MTU of both ends,
// RDMA READ depths are the device's, and the ACK timeout and retry count are
// the provider's defaults.
func (p RCPort) Connect(qp *QP, psn PSN, remote Endpoint, tune ConnectConfig) error {
	cfg := tune
	cfg.Port = p.Num
	cfg.SGIDIndex = uint8(p.GID.Index)
	cfg.LocalPSN = psn
	cfg.Remote = remote
	if cfg.MTU == 0 {
		cfg.MTU = p.Attr.ActiveMTU
		if remote.MTU != 0 {
			cfg.MTU = min(cfg.MTU, remote.MTU)
		}
	}
	if cfg.MaxRdAtomic == 0 {
		cfg.MaxRdAtomic = max(1, p.MaxRdAtomic)
	}
	if cfg.MaxDestRdAtomic == 0 {
		cfg.MaxDestRdAtomic = max(1, p.MaxDestRdAtomic)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = p.Defaults.Timeout
	}
	if cfg.RetryCnt == 0 {
		cfg.RetryCnt = p.Defaults.RetryCnt
	}
	return qp.Connect(cfg)
}

// RetryBound is how long a QP connected with timeout and retry count keeps
// retransmitting to a peer that no longer answers before its work requests
// complete with WCRetryExcErr: (retry+1) ACK timeouts.
func RetryBound(timeout, retry uint8) time.Duration {
	return time.Duration(4096<<timeout) * time.Nanosecond * time.Duration(int(retry)+1)
}
