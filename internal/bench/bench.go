// Package bench is what te bench measures: initiator threads that each
// loop allocate, submit, wait, free over an engine (the loop of Mooncake's
// transfer_engine_bench), several protocols taking turns so that the load
// of a shared machine hits each alike, and the ceilings measured beside
// them (a raw TCP stream, a single-thread memcpy). It prints nothing;
// te bench wires the engines and prints what Run reports.
package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rdmago/te/engine"
)

// Env is what a bench runs against: an initiator engine with registered
// memory and an opened target segment.
type Env struct {
	Engine *engine.Engine
	// Local is registered memory of Engine: request i of thread t uses
	// Local[block×(i×threads+t):][:block], the same offset as on the
	// target. Verify needs twice the footprint.
	Local   []byte
	Segment engine.SegmentID
	// Remote is the target address the footprint starts at.
	Remote uint64
	// TargetMem is the target's memory at Remote when the target runs in
	// this process: memcpy copies there, Verify compares it too. Nil for
	// a target elsewhere.
	TargetMem []byte
	// Rails reads the initiator's RDMA rail counters (nil: no rails).
	Rails func() []Rail
	// Target is the target's engine when it runs in this process: with
	// Config.Notify, the time from submit to its notification is
	// measured there. Nil for a target elsewhere.
	Target *engine.Engine
	// Echoes: the target elsewhere sends each te bench notification
	// back to Engine (Echo; te serve does): with Config.Notify, the
	// time from submit to the notification's arrival there is measured
	// by the two processes' clocks (one host's, or synchronized ones).
	Echoes bool
}

// Rail is what one RDMA rail of the initiator carried.
type Rail struct {
	Device string `json:"device"`
	Up     bool   `json:"up"`
	Bytes  uint64 `json:"bytes"`
	Slices uint64 `json:"slices"`
	Errors uint64 `json:"errors"`
}

// Config is one configuration to measure.
type Config struct {
	Op      engine.Op
	Block   int64
	Batch   int
	Threads int
	// Duration bounds the measured phase: the protocols and ceilings
	// share it, taking turns.
	Duration time.Duration
	// Protocols are measured taking turns; one entry "" lets the engine
	// choose.
	Protocols []string
	// Memcpy measures a single-thread copy of the same blocks beside the
	// engine; Baseline a raw TCP stream over one loopback connection.
	Memcpy, Baseline bool
	// Latency measures single requests: Batch must be 1, and each
	// result's Latency gives the quantiles of one request's time from
	// Submit to the end of Wait.
	Latency bool
	// Turn is the length of one contender's turn (default 250 ms).
	Turn time.Duration
	// Progress, when set, is called once a second while a single
	// contender measures, and after every round of turns.
	Progress func(Progress)
	// Stage, when set, is told what the setup is doing (warming up), and
	// "measuring" when the measured phase begins.
	Stage func(what string)
	// Notify sends every batch with a notification (engine.SubmitNotify):
	// the batch latency then includes the target accepting it, and with
	// Env.Target the latency from submit to the target's application
	// receiving it is measured too.
	Notify bool
}

// Progress is a report while measuring.
type Progress struct {
	Round, Rounds int           // Rounds > 1: after each round of turns
	Elapsed       time.Duration // single round: time since measuring began
	Rates         []Rate        // bytes per second of each contender since the last report
	ReqPerSec     float64       // single round: requests per second since the last report
	// Batches is how many batches completed since the last report (single
	// round): none means every thread's batch is still in flight.
	Batches uint64
}

// Rate is one contender's throughput.
type Rate struct {
	Name        string
	BytesPerSec float64
}

// Footprint is the bytes one configuration touches on each side.
func (c *Config) Footprint() int64 { return c.Block * int64(c.Batch) * int64(c.Threads) }

// Contenders is how many take turns: the protocols and the ceilings.
func (c *Config) Contenders() int {
	n := len(c.Protocols)
	if c.Memcpy {
		n++
	}
	if c.Baseline {
		n++
	}
	return n
}

// Rounds is how many rounds of turns Run takes and how long each
// contender's turn is.
func (c *Config) Rounds() (int, time.Duration) {
	turn := c.Turn
	if turn <= 0 {
		turn = 250 * time.Millisecond
	}
	n := c.Contenders()
	each := c.Duration / time.Duration(n)
	if n == 1 {
		return 1, each
	}
	rounds := min(max(int(each/turn), 1), 40)
	return rounds, each / time.Duration(rounds)
}

func (c *Config) check(env *Env) error {
	switch {
	case c.Block <= 0 || c.Batch <= 0 || c.Threads <= 0 || c.Duration <= 0:
		return fmt.Errorf("bench: block %d, batch %d, threads %d, duration %v: want all positive", c.Block, c.Batch, c.Threads, c.Duration)
	case len(c.Protocols) == 0:
		return errors.New("bench: no protocol to measure")
	case c.Latency && c.Batch != 1:
		return fmt.Errorf("bench: latency is measured with batches of 1 request, not %d", c.Batch)
	case int64(len(env.Local)) < c.Footprint():
		return fmt.Errorf("bench: %d bytes of local memory for a footprint of %d", len(env.Local), c.Footprint())
	case c.Memcpy && env.TargetMem != nil && int64(len(env.TargetMem)) < c.Footprint():
		return fmt.Errorf("bench: %d bytes of target memory for a footprint of %d", len(env.TargetMem), c.Footprint())
	}
	return nil
}

// Result is one protocol's measurement of one configuration.
type Result struct {
	Operation string `json:"operation"`
	Protocol  string `json:"protocol"`
	BlockSize int64  `json:"block_size"`
	BatchSize int    `json:"batch_size"`
	Threads   int    `json:"threads"`
	// Segment is the target; InProcess says it ran in this process; Auth
	// that a cluster secret was in use (never the secret). The caller
	// sets them.
	Segment   string `json:"segment"`
	InProcess bool   `json:"in_process_target"`
	Auth      bool   `json:"auth"`
	// Seconds is the time this protocol measured (its share of the
	// turns); Bytes, Batches and Requests what completed in it.
	Seconds   float64 `json:"seconds"`
	Bytes     uint64  `json:"bytes"`
	Batches   uint64  `json:"batches"`
	Requests  uint64  `json:"requests"`
	GBps      float64 `json:"gb_per_s"` // 1e9 bytes per second
	OpsPerSec float64 `json:"requests_per_s"`
	// Batch latency, submit to all complete.
	P50Micros float64 `json:"batch_latency_p50_us"`
	P99Micros float64 `json:"batch_latency_p99_us"`
	MaxMicros float64 `json:"batch_latency_max_us"`
	// Notify: every batch carried a notification; NotifyP50Micros and
	// NotifyP99Micros are the time from submit to the target's
	// application receiving it (0 when the target ran elsewhere and
	// did not echo them: NotifyEchoed, Env.Echoes).
	Notify          bool    `json:"notify,omitempty"`
	Notified        uint64  `json:"notified,omitempty"`
	NotifyEchoed    bool    `json:"notify_echoed,omitempty"` // measured from the target's echoes (Env.Echoes)
	NotifyP50Micros float64 `json:"notify_latency_p50_us,omitempty"`
	NotifyP99Micros float64 `json:"notify_latency_p99_us,omitempty"`
	Verified        *bool   `json:"verified,omitempty"`
	// Latency is one request's latency (Config.Latency).
	Latency *Latency `json:"latency,omitempty"`
	// The ceilings measured taking turns with the engine, and this
	// protocol's rate over each; VsTCP is the rate over tcp's.
	Baseline   *Ceiling `json:"baseline,omitempty"`
	VsBaseline float64  `json:"over_baseline,omitempty"`
	Memcpy     *Ceiling `json:"memcpy,omitempty"`
	VsMemcpy   float64  `json:"over_memcpy,omitempty"`
	VsTCP      float64  `json:"over_tcp,omitempty"`
	// Rails is what each RDMA rail of the initiator carried (rdma and
	// mooncake-rdma only).
	Rails []Rail `json:"rails,omitempty"`
}

// Latency is the distribution of single requests' latency, Submit to
// the end of Wait, in microseconds.
type Latency struct {
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
}

func latencyOf(h *histogram) *Latency {
	l := &Latency{P50: micros(h.quantile(0.50)), P90: micros(h.quantile(0.90)), P99: micros(h.quantile(0.99)),
		P999: micros(h.quantile(0.999)), Max: micros(h.max)}
	if h.n > 0 {
		l.Mean = micros(h.sum / time.Duration(h.n))
	}
	return l
}

// Run measures c over each protocol in turn (and the ceilings asked
// for) and returns one result per protocol, in the order of c.Protocols.
func Run(ctx context.Context, env *Env, c Config) ([]*Result, error) {
	if err := c.check(env); err != nil {
		return nil, err
	}
	protos := c.Protocols
	footprint := c.Footprint()
	stats := make([][]workerStats, len(protos))
	loops := make([][]*Loop, len(protos))
	var nc *noteCollector // drains the warm-up's notes too
	switch {
	case c.Notify && env.Target != nil:
		nc = startNotes(env.Target, loops, false)
		defer nc.stop()
	case c.Notify && env.Echoes:
		nc = startNotes(env.Engine, loops, true)
		defer nc.stop()
	}
	for pi, proto := range protos {
		stats[pi] = make([]workerStats, c.Threads)
		loops[pi] = make([]*Loop, c.Threads)
		for t := range loops[pi] {
			loops[pi][t] = newLoop(env, &c, t, proto, &stats[pi][t])
			loops[pi][t].pi = pi
		}
		// One untimed batch per thread, all threads at once, connects
		// the transport and faults in the pages of both buffers.
		if c.Stage != nil {
			c.Stage(fmt.Sprintf("warming up %s: one batch per thread at once (%d × %d requests)", name(proto), c.Threads, c.Batch))
		}
		if err := runAll(ctx, loops[pi]); err != nil {
			return nil, fmt.Errorf("warm-up over %s: %w", name(proto), err)
		}
		for t := range stats[pi] {
			stats[pi][t] = workerStats{}
		}
	}
	var copyDst []byte
	if c.Memcpy {
		copyDst = env.TargetMem
		if copyDst == nil {
			m, err := engine.AllocShared(int(footprint))
			if err != nil {
				return nil, fmt.Errorf("memcpy: %w", err)
			}
			defer m.Close()
			copyDst = m.Bytes()
			copy(copyDst, env.Local[:footprint]) // fault it in before timing
		}
		copyDst = copyDst[:footprint]
	}
	var railsBefore []Rail
	if env.Rails != nil {
		railsBefore = env.Rails()
	}

	if c.Stage != nil {
		c.Stage("measuring")
	}
	if nc != nil {
		nc.measuring.Store(true)
	}
	rounds, slice := c.Rounds()
	var (
		elapsed   = make([]time.Duration, len(protos))
		lastBytes = make([]uint64, len(protos))
		base, mc  *Ceiling
	)
	for round := range rounds {
		var tick func(Progress)
		if rounds == 1 {
			tick = c.Progress
		}
		p := Progress{Round: round + 1, Rounds: rounds}
		for pi, proto := range protos {
			el, err := measure(ctx, loops[pi], stats[pi], slice, c.Batch, proto, tick)
			if err != nil {
				return nil, fmt.Errorf("over %s: %w", name(proto), err)
			}
			elapsed[pi] += el
			var bytes uint64
			for t := range stats[pi] {
				bytes += stats[pi][t].bytes.Load()
			}
			p.Rates = append(p.Rates, Rate{name(proto), float64(bytes-lastBytes[pi]) / el.Seconds()})
			lastBytes[pi] = bytes
		}
		if c.Memcpy {
			m, err := Memcpy(ctx, copyDst, env.Local[:footprint], int(c.Block), slice)
			if err != nil {
				return nil, err
			}
			if mc == nil {
				mc = &Ceiling{}
			}
			mc.add(m)
			p.Rates = append(p.Rates, Rate{"memcpy", m.GBps * 1e9})
		}
		if c.Baseline {
			b, err := Baseline(ctx, int(c.Block), int(footprint), slice)
			if err != nil {
				return nil, err
			}
			if base == nil {
				base = &Ceiling{}
			}
			base.add(b)
			p.Rates = append(p.Rates, Rate{"baseline", b.GBps * 1e9})
		}
		if rounds > 1 && c.Progress != nil {
			c.Progress(p)
		}
	}

	if nc != nil {
		nc.stop()
	}
	rs := make([]*Result, len(protos))
	for pi, proto := range protos {
		r := &Result{
			Operation: opName(c.Op), Protocol: name(proto), BlockSize: c.Block, BatchSize: c.Batch, Threads: c.Threads,
			Seconds: elapsed[pi].Seconds(),
		}
		var h histogram
		for t := range stats[pi] {
			r.Bytes += stats[pi][t].bytes.Load()
			r.Batches += stats[pi][t].batches.Load()
			h.merge(&stats[pi][t].hist)
		}
		r.Requests = r.Batches * uint64(c.Batch)
		r.GBps = float64(r.Bytes) / elapsed[pi].Seconds() / 1e9
		r.OpsPerSec = float64(r.Requests) / elapsed[pi].Seconds()
		r.P50Micros = micros(h.quantile(0.50))
		r.P99Micros = micros(h.quantile(0.99))
		r.MaxMicros = micros(h.max)
		if c.Latency {
			r.Latency = latencyOf(&h)
		}
		r.Notify = c.Notify
		r.NotifyEchoed = c.Notify && env.Target == nil && env.Echoes
		if nc != nil {
			nh := &nc.hists[pi]
			r.Notified = nh.n
			r.NotifyP50Micros = micros(nh.quantile(0.50))
			r.NotifyP99Micros = micros(nh.quantile(0.99))
		}
		if base != nil && base.GBps > 0 {
			r.Baseline, r.VsBaseline = base, r.GBps/base.GBps
		}
		if mc != nil && mc.GBps > 0 && proto == "shm" {
			r.Memcpy, r.VsMemcpy = mc, r.GBps/mc.GBps
		}
		// rdma, and Mooncake's RDMA wire on the same transport.
		if (proto == "rdma" || proto == "mooncake-rdma") && env.Rails != nil {
			r.Rails = railDelta(railsBefore, env.Rails())
		}
		rs[pi] = r
	}
	if ti := slices.Index(protos, "tcp"); ti >= 0 && rs[ti].GBps > 0 {
		for pi := range rs {
			if pi != ti {
				rs[pi].VsTCP = rs[pi].GBps / rs[ti].GBps
			}
		}
	}
	return rs, nil
}

func name(proto string) string {
	if proto == "" {
		return "auto"
	}
	return proto
}

func opName(op engine.Op) string {
	if op == engine.Read {
		return "read"
	}
	return "write"
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// railDelta is what each rail carried between two snapshots.
func railDelta(before, after []Rail) []Rail {
	if len(before) != len(after) {
		return after
	}
	out := slices.Clone(after)
	for i := range out {
		out[i].Bytes -= before[i].Bytes
		out[i].Slices -= before[i].Slices
		out[i].Errors -= before[i].Errors
	}
	return out
}
