package verbstest

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdmago/te/uverbs"
)

// Side is one end of an RC connection, built the way the suite builds its
// own: a context of its own (a "host"), PD, completion channel, CQ, RC QP
// and one MR. It is exported so that a provider's own tests can use the
// same footing; its helpers fail the test on any error.
type Side struct {
	T   testing.TB
	Dev Device
	Ctx *uverbs.Context
	PD  *uverbs.PD
	Ch  *uverbs.CompChannel
	CQ  *uverbs.CQ
	QP  *uverbs.QP
	MR  *uverbs.MR // the buffer: [0, Half()) to send from, [Half(), Len) to receive into
	GID uverbs.GID // source GID (RoCE); zero on InfiniBand
	PSN uverbs.PSN // initial send PSN
	// Port is the port prepared for RC connections.
	Port uverbs.RCPort
	ib   bool // InfiniBand link layer: LID routing
}

// SideConfig sizes a Side.
type SideConfig struct {
	BufSize   int // MR bytes (default 64 KiB)
	Depth     int // send and receive queue depth (default 64)
	CQEntries int // CQ entries (default 4×Depth)
}

const (
	qpDepth   = 64
	maxInline = 128
)

// NewSide opens d with tg.Options and builds a Side (in RESET: Connect
// brings it to RTS). Everything is closed at the test's cleanup, each Close
// twice to prove it idempotent.
func NewSide(t testing.TB, tg Target, d Device, cfg SideConfig) *Side {
	t.Helper()
	if d.Port == 0 {
		d.Port = 1
	}
	if cfg.BufSize == 0 {
		cfg.BufSize = 1 << 16
	}
	if cfg.Depth == 0 {
		cfg.Depth = qpDepth
	}
	if cfg.CQEntries == 0 {
		cfg.CQEntries = 4 * cfg.Depth
	}
	s := &Side{T: t, Dev: d}
	var err error
	if s.Ctx, err = uverbs.Open(d.Name, tg.Options); err != nil {
		t.Fatalf("open %s: %v", d.Name, err)
	}
	t.Cleanup(func() {
		if err := s.Ctx.Close(); err != nil {
			t.Errorf("%s: context close: %v", d.Name, err)
		}
	})
	// The same port preparation as the engine's RDMA transport and te
	// perf: GID, READ depths, provider RC defaults.
	if s.Port, err = s.Ctx.RCPort(d.Port, d.GIDIndex); err != nil {
		t.Fatal(err)
	}
	s.ib = s.Port.Attr.LinkLayer == uverbs.LinkLayerInfiniBand
	if !s.ib {
		s.GID = s.Port.GID.GID
	}
	if s.PD, err = s.Ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.Ch, err = s.Ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if s.CQ, err = s.Ctx.CreateCQ(uverbs.CQConfig{Entries: cfg.CQEntries, Channel: s.Ch}); err != nil {
		t.Fatal(err)
	}
	if s.MR, err = s.PD.AllocMR(cfg.BufSize, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite|uverbs.AccessRemoteRead|uverbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if s.QP, err = s.PD.CreateQP(uverbs.QPConfig{SendCQ: s.CQ, RecvCQ: s.CQ,
		Caps: uverbs.QPCaps{MaxSendWR: uint32(cfg.Depth), MaxRecvWR: uint32(cfg.Depth), MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: maxInline}}); err != nil {
		t.Fatal(err)
	}
	s.PSN = uverbs.PSN(rand.Uint32() & 0xffffff)
	t.Cleanup(s.close)
	return s
}

// close releases everything in order, twice, to prove Close is idempotent.
func (s *Side) close() {
	for range 2 {
		for _, c := range []interface{ Close() error }{s.QP, s.CQ, s.Ch, s.MR, s.PD} {
			if err := c.Close(); err != nil {
				s.T.Errorf("%s: close %T: %v", s.Dev.Name, c, err)
			}
		}
	}
}

// Endpoint describes s for its peer as it would travel out of band: through
// MarshalBinary and UnmarshalBinary (with the LID on InfiniBand).
func (s *Side) Endpoint() uverbs.Endpoint {
	s.T.Helper()
	e := s.Port.Endpoint(s.QP, s.PSN)
	if s.ib != (e.LID != 0) {
		s.T.Fatalf("%s: endpoint %+v on a port with InfiniBand=%v", s.Dev.Name, e, s.ib)
	}
	b, err := e.MarshalBinary()
	if err != nil {
		s.T.Fatal(err)
	}
	var got uverbs.Endpoint
	if err := got.UnmarshalBinary(b); err != nil || got != e {
		s.T.Fatalf("%s: endpoint round trip %+v -> %+v: %v", s.Dev.Name, e, got, err)
	}
	return got
}

// Connect brings the QP to RTS against peer through uverbs.RCPort (path
// MTU, READ depths and the provider's ACK timeout, as the RDMA transport
// connects); uverbs picks the path by the port's link layer (GID and GRH on
// RoCE, LID on InfiniBand). tweak sets fields that override those.
func (s *Side) Connect(peer *Side, tweak func(*uverbs.ConnectConfig)) {
	s.T.Helper()
	var cfg uverbs.ConnectConfig
	if tweak != nil {
		tweak(&cfg)
	}
	if err := s.Port.Connect(s.QP, s.PSN, peer.Endpoint(), cfg); err != nil {
		s.T.Fatalf("%s: connect: %v", s.Dev.Name, err)
	}
}

// Buf is the MR's memory; Half its midpoint; Addr the address of Buf()[off].
func (s *Side) Buf() []byte         { return s.MR.Bytes() }
func (s *Side) Half() int           { return s.MR.Len() / 2 }
func (s *Side) Addr(off int) uint64 { return s.MR.Addr() + uint64(off) }

// Wait collects n completions (sleeping on the channel) within 30 s.
func (s *Side) Wait(n int) []uverbs.WC {
	s.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]uverbs.WC, 0, n)
	wc := make([]uverbs.WC, 16)
	for len(out) < n {
		m, err := s.CQ.Wait(ctx, wc[:min(len(wc), n-len(out))])
		if err != nil {
			s.T.Fatalf("%s: waiting for %d completions, got %d %+v: %v", s.Dev.Name, n, len(out), out, err)
		}
		out = append(out, wc[:m]...)
	}
	return out
}

// Wait1 waits for one completion and checks its ID and status.
func (s *Side) Wait1(id uint64, st uverbs.WCStatus) uverbs.WC {
	s.T.Helper()
	wc := s.Wait(1)[0]
	if wc.ID != id || wc.Status != st {
		s.T.Fatalf("%s: completion %+v (%s), want ID %d %s", s.Dev.Name, wc, wc.Status, id, st)
	}
	return wc
}

// Quiet checks that no completion arrives for a short while.
func (s *Side) Quiet() {
	s.T.Helper()
	var wc [4]uverbs.WC
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n, _ := s.CQ.Poll(wc[:]); n > 0 {
			s.T.Fatalf("%s: unexpected completion %+v", s.Dev.Name, wc[:n])
		}
		time.Sleep(time.Millisecond)
	}
}

// PollOne busy-polls (never arms the CQ) for one completion.
func (s *Side) PollOne() uverbs.WC {
	s.T.Helper()
	var wc [1]uverbs.WC
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		n, err := s.CQ.Poll(wc[:])
		if err != nil {
			s.T.Fatalf("%s: poll: %v", s.Dev.Name, err)
		}
		if n == 1 {
			return wc[0]
		}
	}
	s.T.Fatalf("%s: no completion", s.Dev.Name)
	return uverbs.WC{}
}

// PostRecv posts one receive.
func (s *Side) PostRecv(id uint64, sgl ...uverbs.SGE) {
	s.T.Helper()
	if n, err := s.QP.PostRecv([]uverbs.RecvWR{{ID: id, SGL: sgl}}); err != nil || n != 1 {
		s.T.Fatalf("%s: post_recv: %d %v", s.Dev.Name, n, err)
	}
}

// PostSend posts one send work request.
func (s *Side) PostSend(wr uverbs.SendWR) {
	s.T.Helper()
	if n, err := s.QP.PostSend([]uverbs.SendWR{wr}); err != nil || n != 1 {
		s.T.Fatalf("%s: post_send %s: %d %v", s.Dev.Name, wr.Opcode, n, err)
	}
}

// Pair builds a Side on tg.A and one on tg.B, each with a bufSize-byte MR,
// and connects them (tweak, if not nil, adjusts both ConnectConfigs).
func Pair(t testing.TB, tg Target, bufSize int, tweak func(*uverbs.ConnectConfig)) (*Side, *Side) {
	a := NewSide(t, tg, tg.A, SideConfig{BufSize: bufSize})
	b := NewSide(t, tg, tg.B, SideConfig{BufSize: bufSize})
	a.Connect(b, tweak)
	b.Connect(a, tweak)
	return a, b
}
