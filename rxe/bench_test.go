package rxe_test

import (
	"fmt"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// benchPair connects two sides for a benchmark (b.Cleanup closes them).
func benchPair(b *testing.B, tp topology) (*side, *side) {
	a := newBenchSide(b, tp.a)
	c := newBenchSide(b, tp.b)
	ea, ec := a.endpoint(), c.endpoint()
	a.connect(ec, nil)
	c.connect(ea, nil)
	return a, c
}

// BenchmarkRDMAWrite measures signaled RDMA WRITEs on the rxe device: size
// 8 B with one outstanding (latency) and 64 KiB with 4 outstanding
// (bandwidth), over veth and loopback. Run in the guest:
//
//	SR_TEST_ARGS='-test.run ^$ -test.bench RDMAWrite' test/softroce/run.sh ./rxe
func BenchmarkRDMAWrite(b *testing.B) {
	topo := srenv.Require(b)
	x, y := topo.Pair(0)
	for _, tp := range []topology{{"veth", x, y}, {"lo", topo.Lo, topo.Lo}} {
		for _, c := range []struct{ size, depth int }{{8, 1}, {64 << 10, 4}} {
			b.Run(fmt.Sprintf("%s/size=%d/depth=%d", tp.name, c.size, c.depth), func(b *testing.B) {
				a, z := benchPair(b, tp)
				wr := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled,
					SGL: []uverbs.SGE{a.mr.SGE(0, c.size)}, RemoteAddr: z.addr(0), RKey: z.mr.RKey()}}
				wc := make([]uverbs.WC, 16)
				b.SetBytes(int64(c.size))
				b.ReportAllocs()
				inflight, posted, done := 0, 0, 0
				for b.Loop() {
					for inflight < c.depth {
						wr[0].ID = uint64(posted)
						if _, err := a.qp.PostSend(wr); err != nil {
							b.Fatal(err)
						}
						posted++
						inflight++
					}
					for {
						n, err := a.cq.Poll(wc)
						if err != nil {
							b.Fatal(err)
						}
						for i := 0; i < n; i++ {
							if wc[i].Status != uverbs.WCSuccess {
								b.Fatalf("completion %+v", wc[i])
							}
						}
						inflight -= n
						done += n
						if n > 0 {
							break
						}
					}
				}
				for inflight > 0 { // drain before teardown
					n, _ := a.cq.Poll(wc)
					inflight -= n
				}
				_ = done
			})
		}
	}
}
