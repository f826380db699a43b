package perftest

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

// The write-latency ping-pong marks each message with its iteration number in
// the last four bytes; each side spins on its own buffer for the peer's mark.
func (e *end) markOff() int { return (e.p.Size - 4) &^ 3 }

func (e *end) waitMark(ctx context.Context, i uint32) error {
	buf, off := e.mr.Bytes(), e.markOff()
	for spins := 0; dma.LoadAcquire32(buf, off) != i; spins++ {
		if spins&0xfffff == 0xfffff && ctx.Err() != nil {
			return fmt.Errorf("%s: waiting for message %d: %w", e.name, i, ctx.Err())
		}
	}
	return nil
}

// latStep runs one exchange of the latency test; client says who starts.
func (e *end) latStep(ctx context.Context, i uint32, client bool, wr []uverbs.SendWR) error {
	src := e.mr.Bytes()[e.region:]
	switch e.p.Op {
	case OpRead: // the client reads, the server is passive
		if _, err := e.qp.PostSend(wr); err != nil {
			return err
		}
		_, err := e.poll(ctx)
		return err
	case OpWrite:
		if !client {
			if err := e.waitMark(ctx, i); err != nil {
				return err
			}
		}
		dma.StoreRelease32(src, e.markOff(), i)
		if _, err := e.qp.PostSend(wr); err != nil {
			return err
		}
		if _, err := e.poll(ctx); err != nil { // reclaim the send slot
			return err
		}
		if client {
			return e.waitMark(ctx, i)
		}
		return nil
	default: // send
		// This step needs our send's completion and the peer's message. The
		// server answers each message; a message that arrives while it still
		// waits for its previous send's completion is kept for the next step.
		need, answered := 2, false
		if client {
			if _, err := e.qp.PostSend(wr); err != nil {
				return err
			}
		} else if e.early > 0 {
			e.early--
			if _, err := e.qp.PostSend(wr); err != nil {
				return err
			}
			need, answered = 1, true
		}
		for need > 0 {
			wc, err := e.poll(ctx)
			if err != nil {
				return err
			}
			for _, w := range wc {
				if w.Opcode != uverbs.WCRecv {
					need--
					continue
				}
				if err := e.postRecvs(1); err != nil {
					return err
				}
				switch {
				case answered || (client && need == 0):
					e.early++
				case !client:
					if _, err := e.qp.PostSend(wr); err != nil {
						return err
					}
					answered = true
					need--
				default:
					answered = true
					need--
				}
			}
		}
		return nil
	}
}

// latYieldEvery is how often the latency loop yields: well under the
// runtime's 10 ms preemption slice, so sysmon never has to preempt it.
const latYieldEvery = 5 * time.Millisecond

// latRun runs Iters exchanges (plus a short warm-up) and returns the
// per-iteration times of the client.
func (e *end) latRun(ctx context.Context, peer Info, client bool) ([]time.Duration, error) {
	wr := []uverbs.SendWR{{ID: 2, Opcode: opcode(e.p.Op), Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{e.src()}, RemoteAddr: peer.Addr, RKey: uverbs.RKey(peer.RKey)}}
	if e.p.Op == OpWrite {
		// the mark lands in the last word of the peer's buffer [0,size)
		wr[0].SGL[0] = e.mr.SGE(e.region, e.markOff()+4)
	}
	if e.p.Size <= e.p.InlineSize() {
		wr[0].Flags |= uverbs.SendInline
	}
	if e.p.Op == OpSend {
		if err := e.postRecvs(2); err != nil {
			return nil, err
		}
	}
	if e.p.Op == OpRead && !client {
		return nil, nil
	}
	const warm = 16
	times := make([]time.Duration, e.p.Iters)
	var pre *threadPreempts
	lastYield := time.Now()
	for i := 0; i < warm+e.p.Iters; i++ {
		if i == warm {
			pre = startThreadPreempts()
			defer func() { e.preemptPerS = pre.stop() }()
		}
		t0 := time.Now()
		if err := e.latStep(ctx, uint32(i+1), client, wr); err != nil {
			return nil, fmt.Errorf("%s: exchange %d: %w", e.name, i+1, err)
		}
		end := time.Now()
		if i >= warm {
			times[i-warm] = end.Sub(t0)
		}
		// Yield between exchanges, outside the timed window: the Go
		// runtime preempts a goroutine that has run 10 ms without one,
		// by signal, in the middle of whatever round trip it is in.
		if end.Sub(lastYield) >= latYieldEvery {
			runtime.Gosched()
			lastYield = end
		}
	}
	return times, nil
}

// latResult measures one latency run of the client.
func (e *end) latResult(ctx context.Context, peer Info, peerName string) (Result, error) {
	r := e.result(peer, peerName)
	times, err := e.latRun(ctx, peer, true)
	if err != nil {
		return r, err
	}
	var total time.Duration
	for _, t := range times {
		total += t
	}
	r.Seconds = total.Seconds()
	div := 2.0 // one-way: half the round trip, as perftest reports it
	if e.p.Op == OpRead {
		div = 1
	}
	LatStats(&r, times, div)
	r.PreemptPerS = e.preemptPerS
	return r, nil
}

// LatStats fills r's latency fields from per-exchange times, each divided
// by div (2 for one-way latency from round trips).
func LatStats(r *Result, times []time.Duration, div float64) {
	if len(times) == 0 {
		return
	}
	us := make([]float64, len(times))
	for i, t := range times {
		us[i] = float64(t.Nanoseconds()) / 1e3 / div
	}
	slices.Sort(us)
	var sum, sq float64
	for _, v := range us {
		sum += v
	}
	avg := sum / float64(len(us))
	for _, v := range us {
		sq += (v - avg) * (v - avg)
	}
	pct := func(p float64) float64 { return us[max(0, min(len(us)-1, int(math.Ceil(p*float64(len(us))))-1))] }
	r.MinUS, r.MaxUS, r.TypicalUS, r.AvgUS = us[0], us[len(us)-1], us[len(us)/2], avg
	r.StdevUS = math.Sqrt(sq / float64(len(us)))
	r.P99US, r.P999US = pct(0.99), pct(0.999)
}

// serveSide runs the server's part of the test (nothing for one-sided bandwidth).
func (e *end) serveSide(ctx context.Context, peer Info) error {
	switch {
	case e.p.Test == TestBW && e.p.Op == OpSend:
		return e.bwSendServer(ctx)
	case e.p.Test == TestLat:
		_, err := e.latRun(ctx, peer, false)
		return err
	}
	return nil
}

// clientSide runs the client's part and measures it.
func (e *end) clientSide(ctx context.Context, peer Info, peerName string) (Result, error) {
	if e.p.Test == TestBW {
		return e.bwResult(ctx, peer, peerName)
	}
	return e.latResult(ctx, peer, peerName)
}
