package rxe_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/verbstest"
)

// udSide is one UD endpoint: its own context, PD, CQ, QP and buffer.
type udSide struct {
	*side
	ud *uverbs.QP
}

const testQKey = 0x11223344

func newUDSide(t *testing.T, dev srenv.Dev) *udSide {
	s := newSide(t, dev, verbstest.SideConfig{}) // reuse context, PD, CQ, MR (its RC QP stays idle)
	qp, err := s.PD.CreateQP(uverbs.QPConfig{Type: uverbs.QPTypeUD, SendCQ: s.CQ, RecvCQ: s.CQ,
		Caps: uverbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInlineData: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := qp.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := qp.ActivateUD(1, testQKey, uverbs.PSN(rand.Uint32())); err != nil {
		t.Fatal(err)
	}
	if a, err := qp.Query(); err != nil || a.State != uverbs.QPStateRTS || a.QKey != testQKey {
		t.Fatalf("UD QP after activation: %+v %v", a, err)
	}
	return &udSide{side: s, ud: qp}
}

// TestUD sends datagrams (plain, with immediate, inline) through an address
// handle and checks payload, GRH placement, source QPN and flags.
func TestUD(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			a, b := newUDSide(t, tp.a), newUDSide(t, tp.b)
			ah, err := a.PD.CreateAH(uverbs.AddressVector{DGID: b.GID, SGIDIndex: uint8(a.Dev.GIDIndex), HopLimit: 64, IsGlobal: true, Port: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := ah.Close(); err != nil {
					t.Error(err)
				}
			}()
			if err := a.PD.Close(); err == nil {
				t.Fatal("PD closed with live children")
			}
			for i, c := range []struct {
				n     int
				flags uverbs.SendFlags
				imm   bool
			}{{1, 0, false}, {256, 0, true}, {512, 0, false}, {40, uverbs.SendInline, false}} {
				fill(a.Buf()[:c.n], uint64(i+1))
				clear(b.Buf()[:uverbs.GRHSize+c.n])
				if _, err := b.ud.PostRecv([]uverbs.RecvWR{{ID: uint64(100 + i), SGL: []uverbs.SGE{b.MR.SGE(0, uverbs.GRHSize+c.n)}}}); err != nil {
					t.Fatal(err)
				}
				wr := uverbs.SendWR{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled | c.flags,
					SGL: []uverbs.SGE{a.MR.SGE(0, c.n)}, AH: ah, RemoteQPN: b.ud.QPN(), RemoteQKey: testQKey}
				if c.imm {
					wr.Opcode, wr.Imm = uverbs.WRSendWithImm, 0xabcd0000|uint32(i)
				}
				if _, err := a.ud.PostSend([]uverbs.SendWR{wr}); err != nil {
					t.Fatal(err)
				}
				a.Wait1(uint64(i), uverbs.WCSuccess)
				rc := b.Wait1(uint64(100+i), uverbs.WCSuccess)
				if rc.Opcode != uverbs.WCRecv || rc.ByteLen != uint32(uverbs.GRHSize+c.n) || rc.SrcQP != a.ud.QPN() ||
					rc.QPN != b.ud.QPN() || rc.Flags&uverbs.WCFlagGRH == 0 || (c.imm != (rc.Flags&uverbs.WCFlagWithImm != 0)) || (c.imm && rc.Imm != wr.Imm) {
					t.Errorf("datagram %d: completion %+v", i, rc)
				}
				if !bytes.Equal(a.Buf()[:c.n], b.Buf()[uverbs.GRHSize:uverbs.GRHSize+c.n]) {
					t.Fatalf("datagram %d (%d bytes): payload differs", i, c.n)
				}
			}
			// UD cannot do RDMA, and a UD send needs an AH.
			for _, wr := range []uverbs.SendWR{
				{Opcode: uverbs.WRRDMAWrite, AH: ah, SGL: []uverbs.SGE{a.MR.SGE(0, 8)}},
				{Opcode: uverbs.WRSend, SGL: []uverbs.SGE{a.MR.SGE(0, 8)}},
			} {
				if _, err := a.ud.PostSend([]uverbs.SendWR{wr}); err == nil {
					t.Errorf("UD post of %s without a valid AH/opcode accepted", wr.Opcode)
				}
			}
		})
	}
}
