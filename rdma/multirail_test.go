package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/test/softroce/srenv"
)

// railMbit is the rate each rail's veth is limited to in the scaling test:
// low enough that even a TCG guest on a busy host fills the link, so the
// link, not the guest's CPUs, bounds each rail.
const railMbit = 8

// shape limits dev's egress to mbit Mbit/s with a token bucket whose queue
// (limit) is far larger than what rxe keeps in flight, so packets wait
// rather than drop. replace: a second call changes the rate.
func shape(t testing.TB, dev string, mbit int) {
	t.Helper()
	out, err := exec.Command("tc", "qdisc", "replace", "dev", dev, "root", "tbf",
		"rate", fmt.Sprintf("%dmbit", mbit), "burst", "16kb", "limit", "16mb").CombinedOutput()
	if err != nil {
		t.Fatalf("tc qdisc replace dev %s root tbf rate %dmbit: %v: %s", dev, mbit, err, out)
	}
}

// shapeRail limits rail r (0-based) to mbit in both directions; the first
// call for a rail removes its qdiscs when the test ends.
func shapeRail(t testing.TB, topo srenv.Topo, r, mbit int, first bool) {
	t.Helper()
	a, b := topo.Pair(r)
	for _, dev := range []string{a.Netdev, b.Netdev} {
		shape(t, dev, mbit)
		if first {
			t.Cleanup(func() {
				if out, err := exec.Command("tc", "qdisc", "del", "dev", dev, "root").CombinedOutput(); err != nil {
					t.Errorf("tc qdisc del dev %s root: %v: %s", dev, err, out)
				}
			})
		}
	}
}

// counters are rxe's retransmission counters summed over the rail devices:
// requester retries (after an ACK timeout or a sequence NAK), sequence
// NAKs received, duplicate requests seen by responders.
type counters struct{ retries, seqNAKs, dups uint64 }

func rxeCounters(t testing.TB, topo srenv.Topo) (c counters) {
	t.Helper()
	for _, d := range topo.Devs {
		for _, f := range []struct {
			name string
			v    *uint64
		}{{"completer_retry_err", &c.retries}, {"rcvd_seq_err", &c.seqNAKs}, {"duplicate_request", &c.dups}} {
			b, err := os.ReadFile("/sys/class/infiniband/" + d.Name + "/ports/1/hw_counters/" + f.name)
			if err != nil {
				t.Fatal(err)
			}
			n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatalf("%s %s: %v", d.Name, f.name, err)
			}
			*f.v += n
		}
	}
	return c
}

func (c counters) sub(o counters) counters {
	return counters{c.retries - o.retries, c.seqNAKs - o.seqNAKs, c.dups - o.dups}
}

func (c counters) String() string {
	return fmt.Sprintf("requester retries %d, sequence NAKs %d, duplicate requests %d", c.retries, c.seqNAKs, c.dups)
}

// railBytes returns the initiator's per-rail byte counters.
func railBytes(p *pair) []uint64 {
	st := p.it.Stats()
	out := make([]uint64, len(st))
	for i, r := range st {
		out[i] = r.Bytes
	}
	return out
}

// timedWrite runs one WRITE batch and returns its bytes per second and
// the bytes each rail carried; the target's memory is verified.
func timedWrite(t *testing.T, p *pair, tasks, blk int) (float64, []uint64) {
	t.Helper()
	rand.Read(p.ini.Mem.Bytes()[:tasks*blk])
	before := railBytes(p)
	start := time.Now()
	p.run(t, p.requests(engine.Write, tasks, blk), nil)
	el := time.Since(start)
	if !bytes.Equal(p.ini.Mem.Bytes()[:tasks*blk], p.tgt.Mem.Bytes()[:tasks*blk]) {
		t.Fatal("target memory differs after the WRITE batch")
	}
	after := railBytes(p)
	for i := range after {
		after[i] -= before[i]
	}
	return float64(tasks*blk) / el.Seconds(), after
}

// streamWrite keeps subs submitters busy, each with batches of per
// WRITEs of blk bytes to its own part of the buffer, until total bytes
// moved; it returns the bytes each rail carried.
func streamWrite(t *testing.T, p *pair, subs, per, blk, total int) []uint64 {
	t.Helper()
	before := railBytes(p)
	rounds := total / (subs * per * blk)
	var wg sync.WaitGroup
	errs := make(chan error, subs)
	for s := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := p.requests(engine.Write, subs*per, blk)[s*per : (s+1)*per]
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				err := p.ini.Engine.Transfer(ctx, reqs)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := railBytes(p)
	for i := range after {
		after[i] -= before[i]
	}
	return after
}

// TestMultiRailScaling limits each rail's link with tc so that the links,
// not the guest's CPUs, are the bottleneck: one WRITE batch over two equal
// rails moves at least 1.6x the bytes per second of the same batch over one,
// and with rail 2 at half rail 1's rate a stream of WRITEs splits its
// bytes about 2:1 and one batch submitted at once splits as the rates the
// engine measured. All are ratios of rates measured side by side against
// limits the test sets, not performance figures.
func TestMultiRailScaling(t *testing.T) {
	topo := srenv.Require(t)
	if len(topo.HostA) < 2 {
		t.Fatalf("%d rails, want 2", len(topo.HostA))
	}
	const tasks, blk = 48, 64 << 10 // 3 MiB: ~3 s on one 8 Mbit/s rail
	shapeRail(t, topo, 0, railMbit, true)
	shapeRail(t, topo, 1, railMbit, true)
	a, b := names(topo.HostA), names(topo.HostB)

	one := newPair(t, tasks*blk, a[:1], b[:1], rdma.Config{})
	two := newPair(t, tasks*blk, a, b, rdma.Config{})
	for _, p := range []*pair{one, two} {
		p.run(t, p.requests(engine.Write, 8, 4096), nil) // handshakes, untimed
	}
	// Best of three, taking turns: a stall of the emulated guest (an rxe
	// ACK timeout after a late ACK costs ~1 s) only ever lowers a rate.
	var r1, r2 float64
	c0 := rxeCounters(t, topo)
	for range 3 {
		x1, _ := timedWrite(t, one, tasks, blk)
		x2, split := timedWrite(t, two, tasks, blk)
		r1, r2 = max(r1, x1), max(r2, x2)
		t.Logf("one rail %.0f B/s, two rails %.0f B/s, split %v", x1, x2, split)
	}
	t.Logf("best: one rail %.0f B/s, two rails %.0f B/s: %.2fx; rxe %s", r1, r2, r2/r1, rxeCounters(t, topo).sub(c0))
	if r2 < 1.6*r1 {
		t.Errorf("two rails moved %.0f B/s, one rail %.0f B/s: %.2fx, want >= 1.6x", r2, r1, r2/r1)
	}

	// A stream: 16 submitters, each with one 64 KiB WRITE in flight.
	shapeRail(t, topo, 1, railMbit/2, false)
	c0 = rxeCounters(t, topo)
	split := streamWrite(t, two, 16, 1, blk, 128*blk)
	x := float64(split[0]) / float64(split[1])
	t.Logf("rail 2 at half rail 1's rate: rail 1 %d bytes, rail 2 %d (%.2f:1); rxe %s", split[0], split[1], x, rxeCounters(t, topo).sub(c0))
	// 2:1 when the links bind; a CPU-starved guest brings both rails'
	// rates closer (1.46:1 seen at load 31 on 2 cores), so the bound asks
	// only that the slower rail clearly carries less.
	if x < 1.3 || x > 3 {
		t.Errorf("rail 1 carried %d bytes, rail 2 (half the rate) %d: %.2f:1, want about 2:1 (1.3 to 3)", split[0], split[1], x)
	}
	// One batch submitted at once: rail choice weighs bytes outstanding by
	// each rail's measured rate (learnt above), so the batch splits as the
	// rates it was given (1.00:1 before rates were weighed). The split is
	// compared with those rates, not with 2:1: on a loaded host the
	// guest's CPU, not the shaped link, can set a rail's rate (1.4:1 seen
	// at load 19 on 2 cores), and the rail choice must follow what it
	// measured either way. Two batches must; up to four run, since a
	// starved guest can stall a rail's completions while a batch is
	// being submitted (1.29:1 against 1.93:1 measured once in CI, the
	// next batch 2.00:1 against 1.97:1).
	good, bad := 0, []string(nil)
	for i := 0; i < 4 && good < 2; i++ {
		before := two.it.Stats()
		_, split := timedWrite(t, two, tasks, blk)
		x := float64(split[0]) / float64(split[1])
		want := float64(before[0].Rate) / float64(max(before[1].Rate, 1))
		t.Logf("one batch, rail 2 at half rate: %v (%.2f:1); rates before it %d, %d B/s (%.2f:1)", split, x, before[0].Rate, before[1].Rate, want)
		switch {
		case want < 1.25:
			bad = append(bad, fmt.Sprintf("batch %d: measured rates %d and %d B/s (%.2f:1) although rail 2 is shaped to half rail 1's rate: the rate estimate missed the shaping", i, before[0].Rate, before[1].Rate, want))
		case x < 0.75*want || x > 1.33*want:
			bad = append(bad, fmt.Sprintf("batch %d: rail 1 carried %d bytes, rail 2 %d: %.2f:1, want about the measured rates' %.2f:1 (0.75x to 1.33x)", i, split[0], split[1], x, want))
		default:
			good++
		}
	}
	if good < 2 {
		t.Errorf("%d of the batches split as the measured rates, want 2:\n%s", good, strings.Join(bad, "\n"))
	}
}
