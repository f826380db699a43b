package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/engine"
)

// workerStats is one thread's counters: the progress reports read the
// atomics, the histogram is merged after the thread ends.
type workerStats struct {
	bytes   atomic.Uint64
	batches atomic.Uint64
	hist    histogram
}

// Loop is one initiator thread: its requests are built once and reused
// for every batch.
type Loop struct {
	e     *engine.Engine
	reqs  []engine.Request
	stats *workerStats
	// With Config.Notify: the note's message (protocol, thread,
	// sequence number, submit time) and when each recent batch was
	// submitted.
	notify  bool
	pi, tid int
	seq     uint64
	msg     [noteLen]byte
	sent    [noteRing]atomic.Int64
}

// NewLoop builds thread tid's requests over proto.
func NewLoop(env *Env, c *Config, tid int, proto string) *Loop {
	return newLoop(env, c, tid, proto, new(workerStats))
}

func newLoop(env *Env, c *Config, tid int, proto string, st *workerStats) *Loop {
	l := &Loop{e: env.Engine, reqs: make([]engine.Request, c.Batch), stats: st, notify: c.Notify, tid: tid}
	block := c.Block
	for i := range l.reqs {
		off := block * int64(i*c.Threads+tid)
		l.reqs[i] = engine.Request{
			Op:         c.Op,
			Local:      env.Local[off : off+block : off+block],
			Target:     env.Segment,
			TargetAddr: env.Remote + uint64(off),
			Transport:  proto,
		}
	}
	return l
}

// Step runs one batch: allocate, submit, wait, free. It records the batch
// latency and the bytes the tasks report, and allocates nothing when the
// engine does not.
func (l *Loop) Step(ctx context.Context) error {
	b, err := l.e.AllocateBatch(len(l.reqs))
	if err != nil {
		return err
	}
	start := time.Now()
	if l.notify {
		err = l.submitNotify(b, start)
	} else {
		err = l.e.Submit(b, l.reqs)
	}
	if err != nil {
		l.e.FreeBatch(b)
		return err
	}
	werr := l.e.Wait(ctx, b)
	lat := time.Since(start)
	if werr != nil {
		if ctx.Err() != nil {
			// Tasks may still be in flight: give them a moment so the
			// batch can be freed; the engine's Close fails the rest.
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			l.e.Wait(wctx, b)
			cancel()
		}
		l.e.FreeBatch(b)
		return werr
	}
	st, err := l.e.BatchStatus(b)
	if err != nil {
		l.e.FreeBatch(b)
		return err
	}
	if err := l.e.FreeBatch(b); err != nil {
		return err
	}
	l.stats.hist.record(lat)
	l.stats.bytes.Add(st.Transferred)
	l.stats.batches.Add(1)
	return nil
}

// runAll runs one step of every loop at once.
func runAll(ctx context.Context, loops []*Loop) error {
	errs := make([]error, len(loops))
	var wg sync.WaitGroup
	for t := range loops {
		wg.Go(func() { errs[t] = loops[t].Step(ctx) })
	}
	wg.Wait()
	return threadsErr(errs)
}

// threadsErr is the first thread's error and how many others failed: one
// line, where the errors of 1000 threads joined were 1000 chains on it.
func threadsErr(errs []error) error {
	var first error
	n := 0
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if n <= 1 {
		return first
	}
	return fmt.Errorf("%w (and %d more of the %d threads)", first, n-1, len(errs))
}

// measure runs every thread's loop for d (or until one fails or ctx ends)
// and returns the time it took; the counters accumulate in stats. With
// tick it reports progress once a second.
func measure(ctx context.Context, loops []*Loop, stats []workerStats, d time.Duration, batch int, proto string, tick func(Progress)) (time.Duration, error) {
	var (
		stop     atomic.Bool
		errs     = make([]error, len(loops))
		wg       sync.WaitGroup
		failed   = make(chan struct{}) // closed by the first thread that fails
		failOnce sync.Once
	)
	start := time.Now()
	for t := range loops {
		wg.Go(func() {
			for !stop.Load() {
				if err := loops[t].Step(ctx); err != nil {
					errs[t] = err
					stop.Store(true)
					failOnce.Do(func() { close(failed) })
					return
				}
			}
		})
	}
	done := make(chan struct{})
	var pwg sync.WaitGroup
	if tick != nil {
		pwg.Go(func() { report(tick, stats, batch, proto, start, done) })
	}
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
	case <-failed:
	}
	timer.Stop()
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	close(done)
	pwg.Wait()
	if err := threadsErr(errs); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return elapsed, nil
}

// report calls tick once a second until done.
func report(tick func(Progress), stats []workerStats, batch int, proto string, start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var lastBytes, lastBatches uint64
	last := start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			var bytes, batches uint64
			for i := range stats {
				bytes += stats[i].bytes.Load()
				batches += stats[i].batches.Load()
			}
			dt := now.Sub(last).Seconds()
			tick(Progress{Round: 1, Rounds: 1, Elapsed: now.Sub(start),
				Rates:     []Rate{{name(proto), float64(bytes-lastBytes) / dt}},
				ReqPerSec: float64(batches-lastBatches) * float64(batch) / dt, Batches: batches - lastBatches})
			lastBytes, lastBatches, last = bytes, batches, now
		}
	}
}
