package rxe_test

import (
	"fmt"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// benchPair connects two sides for a benchmark (b.Cleanup closes them).
func benchPair(b *testing.B, tp topology) (*side, *side) { return pair(b, tp, 1<<20, nil) }

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
					SGL: []uverbs.SGE{a.MR.SGE(0, c.size)}, RemoteAddr: z.Addr(0), RKey: z.MR.RKey()}}
				wc := make([]uverbs.WC, 16)
				b.SetBytes(int64(c.size))
				b.ReportAllocs()
				b.ResetTimer()
				if err := streamWrites(a, wr, wc, c.depth, b.N); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// streamWrites keeps depth signaled WRs in flight until total have
// completed, then returns with nothing outstanding.
func streamWrites(a *side, wr []uverbs.SendWR, wc []uverbs.WC, depth, total int) error {
	posted, done, inflight := 0, 0, 0
	for done < total {
		for inflight < depth && posted < total {
			wr[0].ID = uint64(posted)
			if _, err := a.QP.PostSend(wr); err != nil {
				return err
			}
			posted++
			inflight++
		}
		n, err := a.CQ.Poll(wc)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := wc[i].Err(); err != nil {
				return err
			}
		}
		done += n
		inflight -= n
	}
	return nil
}
