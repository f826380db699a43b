package perftest

import (
	"context"
	"fmt"
	"time"

	"github.com/rdmago/te/uverbs"
)

// bwClient keeps Depth work requests in flight until Iters completed, or
// until Duration passed. Only every CQMod-th request (and the last) asks
// for a completion, as perftest does: a send queue completes in order, so
// a completion with ID k says requests 1..k are done. It returns the
// requests completed and the time they took.
func (e *end) bwClient(ctx context.Context, peer Info) (int, time.Duration, error) {
	mod := max(1, min(e.p.CQMod, e.p.Depth))
	wrs := make([]uverbs.SendWR, e.p.Depth)
	for i := range wrs {
		wrs[i] = uverbs.SendWR{Opcode: opcode(e.p.Op), SGL: []uverbs.SGE{e.src()},
			RemoteAddr: peer.Addr, RKey: uverbs.RKey(peer.RKey)}
	}
	var inline uverbs.SendFlags
	if e.p.Size <= e.p.InlineSize() {
		inline = uverbs.SendInline
	}
	// warm-up: one signaled request at a time, untimed
	for i := 0; i < e.p.Warmup; i++ {
		wrs[0].ID, wrs[0].Flags = 0, uverbs.SendSignaled|inline
		if _, err := e.qp.PostSend(wrs[:1]); err != nil {
			return 0, 0, fmt.Errorf("%s: post_send (warm-up): %w", e.name, err)
		}
		if _, err := e.poll(ctx); err != nil {
			return 0, 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	iters := e.p.Iters
	var deadline time.Time
	if e.p.Duration > 0 {
		iters = 1 << 62 // until the deadline: then the last posted is signaled
	}
	posted, done := 0, 0
	start := time.Now()
	if e.p.Duration > 0 {
		deadline = start.Add(e.p.Duration)
	}
	for done < iters {
		if !deadline.IsZero() && iters == 1<<62 && time.Now().After(deadline) {
			// stop posting; the last posted request ends the test
			iters = posted
			if done >= iters {
				break
			}
			if posted%mod != 0 { // its completion was not asked for: ask with one more
				iters++
			}
		}
		if n := min(e.p.Depth-(posted-done), iters-posted); n > 0 {
			for i := range wrs[:n] {
				seq := posted + i + 1
				wrs[i].ID, wrs[i].Flags = uint64(seq), inline
				if seq%mod == 0 || seq == iters {
					wrs[i].Flags |= uverbs.SendSignaled
				}
			}
			m, err := e.qp.PostSend(wrs[:n])
			posted += m
			if err != nil {
				return 0, 0, fmt.Errorf("%s: post_send: %w", e.name, err)
			}
		}
		wc, err := e.poll(ctx)
		if err != nil {
			return 0, 0, err
		}
		for _, w := range wc {
			done = max(done, int(w.ID))
		}
	}
	return done, time.Since(start), nil
}

// bwSendServer receives Warmup+Iters sends, keeping Depth receives posted.
func (e *end) bwSendServer(ctx context.Context) error {
	total := e.p.Warmup + e.p.Iters
	posted := min(e.recvDepth, total)
	if err := e.postRecvs(posted); err != nil {
		return err
	}
	for got := 0; got < total; {
		wc, err := e.poll(ctx)
		if err != nil {
			return err
		}
		got += len(wc)
		if more := min(len(wc), total-posted); more > 0 {
			if err := e.postRecvs(more); err != nil {
				return err
			}
			posted += more
		}
	}
	return nil
}

// bwResult measures one bandwidth run of the client.
func (e *end) bwResult(ctx context.Context, peer Info, peerName string) (Result, error) {
	r := e.result(peer, peerName)
	n, d, err := e.bwClient(ctx, peer)
	if err != nil {
		return r, err
	}
	r.Iters, r.Seconds = n, d.Seconds()
	r.MBps = float64(e.p.Size) * float64(n) / d.Seconds() / (1 << 20)
	r.Mpps = float64(n) / d.Seconds() / 1e6
	return r, nil
}

func (e *end) result(peer Info, peerName string) Result {
	return Result{Device: e.name, Peer: peerName, Op: e.p.Op, Test: e.p.Test, Bytes: e.p.Size,
		Iters: e.p.Iters, MTU: e.pathMTU(peer)}
}
