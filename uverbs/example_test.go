package uverbs_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/uverbs"
)

// Example_loopbackWrite connects two RC QPs on one rxe device (rxe on lo)
// and performs one RDMA WRITE. It runs in the Soft-RoCE guest tier.
func Example_loopbackWrite() {
	ctx, err := uverbs.Open("rxelo", &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctx.Close()
	gid, err := ctx.FindRoCEv2GID(1, netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	pd, _ := ctx.AllocPD()
	defer pd.Close()
	mr, _ := pd.AllocMR(1<<20, uverbs.AccessLocalWrite|uverbs.AccessRemoteWrite)
	defer mr.Close()
	ch, _ := ctx.CreateCompChannel()
	defer ch.Close()
	cq, _ := ctx.CreateCQ(uverbs.CQConfig{Entries: 64, Channel: ch})
	defer cq.Close()
	caps := uverbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, _ := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: caps})
	defer a.Close()
	b, _ := pd.CreateQP(uverbs.QPConfig{SendCQ: cq, RecvCQ: cq, Caps: caps})
	defer b.Close()

	// Exchange endpoints (here: in memory), then connect both sides.
	ea := uverbs.Endpoint{QPN: a.QPN(), PSN: 100, GID: gid.GID}
	eb := uverbs.Endpoint{QPN: b.QPN(), PSN: 200, GID: gid.GID}
	if err := a.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(gid.Index), LocalPSN: ea.PSN, Remote: eb}); err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Connect(uverbs.ConnectConfig{SGIDIndex: uint8(gid.Index), LocalPSN: eb.PSN, Remote: ea}); err != nil {
		fmt.Println(err)
		return
	}

	copy(mr.Bytes(), "hello")
	_, err = a.PostSend([]uverbs.SendWR{{
		ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
		SGL:        []uverbs.SGE{mr.SGE(0, 5)},
		RemoteAddr: mr.Addr() + 4096, RKey: mr.RKey(),
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	wait, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]uverbs.WC, 1)
	if _, err := cq.Wait(wait, wc); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(wc[0].Status, string(mr.Bytes()[4096:4101]))
	// Output: success hello
}

// ExampleFindGID selects the RoCE v2 GID of an IPv4 address by value.
func ExampleFindGID() {
	table := []uverbs.GIDEntry{
		{Index: 0, GID: uverbs.GIDFromAddr(netip.MustParseAddr("fe80::1")), Type: uverbs.GIDTypeRoCEv2},
		{Index: 2, GID: uverbs.GIDFromAddr(netip.MustParseAddr("10.0.1.1")), Type: uverbs.GIDTypeRoCEv1},
		{Index: 3, GID: uverbs.GIDFromAddr(netip.MustParseAddr("10.0.1.1")), Type: uverbs.GIDTypeRoCEv2},
	}
	g, err := uverbs.FindGID(table, netip.MustParseAddr("10.0.1.1"), uverbs.GIDTypeRoCEv2)
	fmt.Println(g.Index, g.GID, err)
	// Output: 3 ::ffff:10.0.1.1 <nil>
}

// ExampleEndpoint_MarshalBinary shows the form two peers exchange out of
// band before Connect: 26 bytes on RoCE, 28 with an InfiniBand LID.
func ExampleEndpoint_MarshalBinary() {
	e := uverbs.Endpoint{QPN: 0x11, PSN: 0x123456, GID: uverbs.GIDFromAddr(netip.MustParseAddr("10.0.1.2")), MTU: uverbs.MTU1024}
	b, _ := e.MarshalBinary()
	fmt.Printf("%d bytes: % x\n", len(b), b)
	var peer uverbs.Endpoint
	fmt.Println(peer.UnmarshalBinary(b), peer == e)
	// Output:
	// 26 bytes: 01 00 00 00 11 00 12 34 56 00 00 00 00 00 00 00 00 00 00 ff ff 0a 00 01 02 03
	// <nil> true
}
