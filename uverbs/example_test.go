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
// and performs one RDMA WRITE.
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
}
