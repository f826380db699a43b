package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/segment"
)

func init() {
	register(command{
		name:    "bench",
		summary: "measure transfers to a segment (default: TCP over loopback to an in-process target)",
		run:     func(ctx context.Context, args []string) error { return runBench(ctx, args, os.Stdout, os.Stderr) },
	})
}

// benchResult is one measured configuration.
type benchResult struct {
	Operation  string          `json:"operation"`
	Protocol   string          `json:"protocol"`
	BlockSize  int64           `json:"block_size"`
	BatchSize  int             `json:"batch_size"`
	Threads    int             `json:"threads"`
	Segment    string          `json:"segment"`
	InProcess  bool            `json:"in_process_target"`
	Auth       bool            `json:"auth"` // a cluster secret was in use (never the secret)
	Seconds    float64         `json:"seconds"`
	Bytes      uint64          `json:"bytes"`
	Batches    uint64          `json:"batches"`
	Requests   uint64          `json:"requests"`
	GBps       float64         `json:"gb_per_s"`
	Rate       float64         `json:"rate"`
	Unit       string          `json:"unit"`
	OpsPerSec  float64         `json:"requests_per_s"`
	P50Micros  float64         `json:"batch_latency_p50_us"`
	P99Micros  float64         `json:"batch_latency_p99_us"`
	MaxMicros  float64         `json:"batch_latency_max_us"`
	Verified   *bool           `json:"verified,omitempty"`
	Baseline   *baselineResult `json:"baseline,omitempty"`
	VsBaseline float64         `json:"engine_over_baseline,omitempty"`
	// Memcpy is a single-thread copy of the same blocks, measured taking
	// turns with the engine (with shm); VsMemcpy is engine/memcpy.
	Memcpy   *memcpyResult `json:"memcpy,omitempty"`
	VsMemcpy float64       `json:"engine_over_memcpy,omitempty"`
	// VsTCP is this protocol's rate over tcp's, measured taking turns in
	// the same run.
	VsTCP float64 `json:"over_tcp,omitempty"`
	// Rails is what each RDMA rail of the initiator carried during the
	// measurement (rdma only).
	Rails       []rdma.RailStats `json:"rails,omitempty"`
	footprint   int64
	elapsedWall time.Duration
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseBench(args, stdout)
	if err != nil {
		return err
	}
	var rep *cli.Report[*benchResult]
	if c.JSON {
		rep = cli.NewReport[*benchResult](c.fs)
	}
	if c.secret, err = loadAuth(c.AuthFile); err != nil {
		return err
	}
	c.Auth = c.secret != nil
	var progress io.Writer = stderr
	if c.Quiet {
		progress = io.Discard
	}
	info := stdout // where the human-readable config goes
	if c.JSON {
		info = progress
	}

	maxBlock := c.BlockSize
	if c.Sweep {
		maxBlock = max(maxBlock, sweepBlocks[len(sweepBlocks)-1])
	}
	footprint := maxBlock * int64(c.BatchSize) * int64(c.Threads)
	bufSize := max(c.BufferSize, footprint)
	localSize := bufSize
	if c.Verify {
		localSize = max(localSize, 2*footprint) // the read-back lands after the pattern
	}
	env, err := setupBench(ctx, c, bufSize, localSize)
	if err != nil {
		return err
	}
	defer env.Close()
	defer serveLanes(env.laneLabels)() // for te trace
	var bt *benchTrace
	if c.Trace {
		bt = startBenchTrace(env, stderr)
		defer bt.Close()
	}
	where := env.segment
	if env.target != nil {
		where += " (in-process target)"
	}
	fmt.Fprintf(info, "te bench: %s over %s to %s, metadata %s\n", opsLabel(c), strings.Join(env.protos, " and "), where, c.Metadata)
	fmt.Fprintf(info, "te bench: block %s, batch %d, threads %d, %v per run, buffer %s\n",
		blocksLabel(c), c.BatchSize, c.Threads, c.Duration, c.size(bufSize))

	var results []*benchResult
	blocks, ops := []int64{c.BlockSize}, []string{c.Operation}
	if c.Sweep {
		blocks, ops = sweepBlocks, sweepOps
	}
	for _, block := range blocks {
		for _, op := range ops {
			rs, err := env.run(ctx, op, block, progress)
			if err != nil {
				return fmt.Errorf("%s %s: %w", op, c.size(block), err)
			}
			for _, r := range rs {
				if c.Verify {
					ok, err := env.verify(ctx, block, r.Protocol)
					if err != nil {
						return fmt.Errorf("verify %s over %s: %w", c.size(block), r.Protocol, err)
					}
					r.Verified = &ok
					if !ok {
						return fmt.Errorf("verify %s over %s: data read back differs from what was written", c.size(block), r.Protocol)
					}
				}
				if !c.JSON && !c.Sweep {
					printResult(stdout, c, r)
				}
			}
			results = append(results, rs...)
		}
	}
	if bt != nil {
		w := stdout
		if c.JSON {
			w = stderr
		}
		if err := bt.print(w); err != nil {
			return fmt.Errorf("--trace: %w", err)
		}
	}
	switch {
	case c.JSON:
		rep.Results = results
		return rep.Write(stdout)
	case c.Sweep && len(env.protos) > 1:
		printCompareTable(stdout, c, env.protos, results)
	case c.Sweep:
		printTable(stdout, c, results)
	}
	return nil
}

func opsLabel(c *benchConfig) string {
	if c.Sweep {
		return strings.Join(sweepOps, "+")
	}
	return c.Operation
}

func blocksLabel(c *benchConfig) string {
	if !c.Sweep {
		return c.size(c.BlockSize)
	}
	var s []string
	for _, b := range sweepBlocks {
		s = append(s, c.size(b))
	}
	return strings.Join(s, ", ")
}

// benchEnv is the initiator, the opened target segment and, without
// --segment, the in-process target.
type benchEnv struct {
	cfg        *benchConfig
	init       *node
	target     *node // nil for a remote target
	segment    string
	seg        engine.SegmentID
	remoteBase uint64 // first byte of the target buffer the bench uses
	remoteLen  uint64
	protos     []string // measured, taking turns
	// copyDst is where the memcpy comparison copies to: the target's
	// buffer when it runs in this process, else memory of our own.
	copyDst *engine.Memory
}

func setupBench(ctx context.Context, c *benchConfig, bufSize, localSize int64) (_ *benchEnv, err error) {
	env := &benchEnv{cfg: c, segment: c.Segment}
	defer func() {
		if err != nil {
			env.Close()
		}
	}()
	if env.segment == "" {
		// The target is a second engine with its own embedded store and
		// listeners on loopback: the same code path as a remote one.
		// Stores that do not name segments after their owner (Consul) get
		// distinct names for the two engines.
		env.target, err = openNode(ctx, nodeConfig{metadata: c.Metadata, auth: c.secret, name: benchName("target"), protocols: c.Protocols, listen: "127.0.0.1:0", devices: c.Devices, bufSize: bufSize})
		if err != nil {
			return nil, fmt.Errorf("in-process target: %w", err)
		}
		env.segment = env.target.eng.Name()
	}
	env.init, err = openNode(ctx, nodeConfig{metadata: c.Metadata, auth: c.secret, name: benchName("initiator"), protocols: c.Protocols, devices: c.Devices, bufSize: localSize})
	if err != nil {
		return nil, fmt.Errorf("initiator: %w", err)
	}
	env.seg, err = env.init.eng.OpenSegment(ctx, env.segment, nil)
	if err != nil {
		return nil, err
	}
	d, err := env.init.eng.SegmentDescriptor(env.seg)
	if err != nil {
		return nil, err
	}
	env.protos = c.Protocols
	if !c.protoSet {
		// By default, every transport of the list that reaches the
		// target: a target on another host (or a te serve without shm)
		// is measured over tcp alone.
		env.protos = nil
		for i, p := range c.Protocols {
			_, offered := d.Protocol(p)
			if r, ok := env.init.trs[i].(driver.Reacher); offered && (!ok || r.Reaches(d)) {
				env.protos = append(env.protos, p)
			}
		}
		if len(env.protos) == 0 {
			return nil, fmt.Errorf("segment %s offers %v; none of %v reaches it from here", env.segment, protoNames(d), c.Protocols)
		}
	}
	need := uint64(bufSize)
	if c.Segment != "" {
		// A remote target's buffer was sized by its owner; only the
		// footprint has to fit.
		maxBlock := c.BlockSize
		if c.Sweep {
			maxBlock = max(maxBlock, sweepBlocks[len(sweepBlocks)-1])
		}
		need = uint64(maxBlock) * uint64(c.BatchSize) * uint64(c.Threads)
	}
	var largest uint64
	for _, b := range d.Buffers {
		largest = max(largest, b.Length)
		if b.Length >= need {
			env.remoteBase, env.remoteLen = b.Addr, b.Length
			return env, nil
		}
	}
	return nil, fmt.Errorf("segment %s exposes no buffer of %s (block × batch × threads); its largest is %s: lower --block-size, --batch-size or --threads, or raise the target's --buffer-size",
		env.segment, c.size(int64(need)), c.size(int64(largest)))
}

// benchName names a bench engine in stores that need a name:
// te-bench/<host>/<pid>/<role>.
func benchName(role string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("te-bench/%s/%d/%s", host, os.Getpid(), role)
}

func (env *benchEnv) Close() error {
	var errs []error
	if env.init != nil {
		errs = append(errs, env.init.Close())
	}
	if env.target != nil {
		errs = append(errs, env.target.Close())
	}
	errs = append(errs, env.copyDst.Close())
	return errors.Join(errs...)
}

func parseOp(op string) engine.Op {
	if op == "read" {
		return engine.Read
	}
	return engine.Write
}

// workerStats is one thread's counters; the progress printer reads the
// atomics, the histogram is merged after the thread ends.
type workerStats struct {
	bytes   atomic.Uint64
	batches atomic.Uint64
	hist    histogram
}

// loop is one initiator thread's state: its request slice is built once
// and reused for every batch.
type loop struct {
	e     *engine.Engine
	reqs  []engine.Request
	stats *workerStats
}

func newLoop(env *benchEnv, op engine.Op, block int64, tid int, stats *workerStats, proto string) *loop {
	c := env.cfg
	mem := env.init.mem.Bytes()
	l := &loop{e: env.init.eng, reqs: make([]engine.Request, c.BatchSize), stats: stats}
	for i := range l.reqs {
		off := block * int64(i*c.Threads+tid)
		l.reqs[i] = engine.Request{
			Op:         op,
			Local:      mem[off : off+block : off+block],
			Target:     env.seg,
			TargetAddr: env.remoteBase + uint64(off),
			Transport:  proto,
		}
	}
	return l
}

// step runs one batch: allocate, submit, wait, free. It records the batch
// latency (submit to all complete) and the bytes the tasks report. It does
// not allocate when the engine does not.
func (l *loop) step(ctx context.Context) error {
	b, err := l.e.AllocateBatch(len(l.reqs))
	if err != nil {
		return err
	}
	start := time.Now()
	if err := l.e.Submit(b, l.reqs); err != nil {
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

// turn is how long one contender runs before the next takes over.
const turn = 250 * time.Millisecond

// run measures one configuration for the configured duration, over each
// protocol in turn (and, with shm, a single-thread memcpy of the same
// blocks), and returns one result per protocol.
func (env *benchEnv) run(ctx context.Context, op string, block int64, progress io.Writer) ([]*benchResult, error) {
	c := env.cfg
	label := fmt.Sprintf("%s %s", op, c.size(block))
	footprint := block * int64(c.BatchSize) * int64(c.Threads)
	protos := env.protos
	stats := make([][]workerStats, len(protos))
	loops := make([][]*loop, len(protos))
	for pi, proto := range protos {
		stats[pi] = make([]workerStats, c.Threads)
		loops[pi] = make([]*loop, c.Threads)
		for t := range loops[pi] {
			loops[pi][t] = newLoop(env, parseOp(op), block, t, &stats[pi][t], proto)
			// One untimed batch per thread connects the transport and
			// faults in the pages of both buffers.
			if err := loops[pi][t].step(ctx); err != nil {
				return nil, fmt.Errorf("warm-up over %s: %w", proto, err)
			}
		}
		for t := range stats[pi] {
			stats[pi][t] = workerStats{}
		}
	}
	withMemcpy := slices.Contains(protos, "shm")
	railsBefore := env.railStats()

	// The protocols (and the raw baselines) take turns of about 250 ms
	// each, so all see the same load on a shared machine and the ratios
	// mean something: load that comes in bursts of seconds hits every
	// contender about equally.
	rounds := 1
	if c.Baseline || withMemcpy || len(protos) > 1 {
		rounds = min(max(int(c.Duration/turn), 1), 40)
	}
	slice := c.Duration / time.Duration(rounds)
	var (
		elapsed   = make([]time.Duration, len(protos))
		lastBytes = make([]uint64, len(protos))
		base      *baselineResult
		mc        *memcpyResult
	)
	for round := range rounds {
		w := progress
		if rounds > 1 {
			w = io.Discard // one line per round instead
		}
		line := fmt.Sprintf("te bench: round %d/%d  %-12s", round+1, rounds, label)
		for pi, proto := range protos {
			el, err := env.measure(ctx, loops[pi], stats[pi], slice, w, label+" "+proto)
			if err != nil {
				return nil, fmt.Errorf("over %s: %w", proto, err)
			}
			elapsed[pi] += el
			var bytes uint64
			for t := range stats[pi] {
				bytes += stats[pi][t].bytes.Load()
			}
			line += fmt.Sprintf("  %s %s", proto, rate(float64(bytes-lastBytes[pi])/el.Seconds(), c))
			lastBytes[pi] = bytes
		}
		if withMemcpy {
			m, err := env.runMemcpy(ctx, int(block), int(footprint), slice)
			if err != nil {
				return nil, err
			}
			if mc == nil {
				mc = &memcpyResult{BlockSize: int(block)}
			}
			mc.Bytes += m.Bytes
			mc.Seconds += m.Seconds
			line += fmt.Sprintf("  memcpy %s", rate(float64(m.Bytes)/m.Seconds, c))
		}
		if c.Baseline {
			b, err := runBaseline(ctx, int(block), int(footprint), slice)
			if err != nil {
				return nil, err
			}
			if base == nil {
				base = &baselineResult{BlockSize: b.BlockSize}
			}
			base.Bytes += b.Bytes
			base.Seconds += b.Seconds
			line += fmt.Sprintf("  baseline %s", rate(float64(b.Bytes)/b.Seconds, c))
		}
		if rounds > 1 {
			fmt.Fprintln(progress, line)
		}
	}
	if base != nil && base.Seconds > 0 {
		base.GBps = float64(base.Bytes) / base.Seconds / 1e9
	}
	if mc != nil && mc.Seconds > 0 {
		mc.GBps = float64(mc.Bytes) / mc.Seconds / 1e9
	}

	rs := make([]*benchResult, len(protos))
	for pi, proto := range protos {
		r := &benchResult{
			Operation: op, Protocol: proto, BlockSize: block, BatchSize: c.BatchSize, Threads: c.Threads,
			Segment: env.segment, InProcess: env.target != nil, Auth: c.Auth, Seconds: elapsed[pi].Seconds(),
			Unit: c.ReportUnit, footprint: footprint, elapsedWall: elapsed[pi],
		}
		var h histogram
		for t := range stats[pi] {
			r.Bytes += stats[pi][t].bytes.Load()
			r.Batches += stats[pi][t].batches.Load()
			h.merge(&stats[pi][t].hist)
		}
		r.Requests = r.Batches * uint64(c.BatchSize)
		r.GBps = float64(r.Bytes) / elapsed[pi].Seconds() / 1e9
		r.Rate = float64(r.Bytes) / elapsed[pi].Seconds() / reportUnits[c.ReportUnit]
		r.OpsPerSec = float64(r.Requests) / elapsed[pi].Seconds()
		r.P50Micros = micros(h.quantile(0.50))
		r.P99Micros = micros(h.quantile(0.99))
		r.MaxMicros = micros(h.max)
		if base != nil && base.GBps > 0 {
			r.Baseline = base
			r.VsBaseline = r.GBps / base.GBps
		}
		if mc != nil && mc.GBps > 0 && proto == "shm" {
			r.Memcpy = mc
			r.VsMemcpy = r.GBps / mc.GBps
		}
		if proto == "rdma" {
			r.Rails = railDelta(railsBefore, env.railStats())
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

// measure runs every thread's loop for d (or until one fails or ctx ends)
// and returns the time it took; the counters accumulate in stats.
func (env *benchEnv) measure(ctx context.Context, loops []*loop, stats []workerStats, d time.Duration, progress io.Writer, label string) (time.Duration, error) {
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
				if err := loops[t].step(ctx); err != nil {
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
	pwg.Go(func() { printProgress(progress, env.cfg, label, stats, start, done) })
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
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return elapsed, nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// printProgress writes one line a second until done.
func printProgress(w io.Writer, c *benchConfig, label string, stats []workerStats, start time.Time, done <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastBytes, lastBatches uint64
	last := start
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			var bytes, batches uint64
			for t := range stats {
				bytes += stats[t].bytes.Load()
				batches += stats[t].batches.Load()
			}
			dt := now.Sub(last).Seconds()
			fmt.Fprintf(w, "te bench: %5.0fs  %-12s %s  %s req/s\n", now.Sub(start).Seconds(), label,
				rate(float64(bytes-lastBytes)/dt, c), si(float64(batches-lastBatches)*float64(c.BatchSize)/dt))
			lastBytes, lastBatches, last = bytes, batches, now
		}
	}
}

// rate formats bytes per second in the report unit.
func rate(bytesPerSec float64, c *benchConfig) string {
	return strconv.FormatFloat(bytesPerSec/reportUnits[c.ReportUnit], 'f', c.Precision, 64) + " " + c.ReportUnit + "/s"
}

// si writes a count with a k or M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func latency(us float64) string {
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

func printResult(w io.Writer, c *benchConfig, r *benchResult) {
	fmt.Fprintf(w, "result: %s %s over %s: %s  %s req/s  batch latency p50 %s  p99 %s  max %s  %s moved in %.2f s\n",
		r.Operation, c.size(r.BlockSize), r.Protocol, rate(r.GBps*1e9, c), si(r.OpsPerSec),
		latency(r.P50Micros), latency(r.P99Micros), latency(r.MaxMicros),
		strconv.FormatFloat(float64(r.Bytes)/1e9, 'f', 2, 64)+" GB", r.Seconds)
	if r.Verified != nil {
		fmt.Fprintf(w, "verify: %v (pattern written, read back and compared)\n", *r.Verified)
	}
	if r.VsTCP > 0 {
		fmt.Fprintf(w, "compare: %s/tcp %.2f (taking turns in this run)\n", r.Protocol, r.VsTCP)
	}
	if len(r.Rails) > 0 {
		var total uint64
		for _, rs := range r.Rails {
			total += rs.Bytes
		}
		line := "rails:"
		for _, rs := range r.Rails {
			share := 0.0
			if total > 0 {
				share = 100 * float64(rs.Bytes) / float64(total)
			}
			down := ""
			if !rs.Up {
				down = ", down"
			}
			line += fmt.Sprintf("  %s %s GB (%.0f%%%s)", rs.Device, strconv.FormatFloat(float64(rs.Bytes)/1e9, 'f', 2, 64), share, down)
		}
		fmt.Fprintln(w, line)
	}
	if m := r.Memcpy; m != nil {
		fmt.Fprintf(w, "memcpy: one thread copying the same %s blocks: %s  %s/memcpy %.2f\n",
			c.size(int64(m.BlockSize)), rate(m.GBps*1e9, c), r.Protocol, r.VsMemcpy)
	}
	if b := r.Baseline; b != nil {
		fmt.Fprintf(w, "baseline: raw TCP, one loopback connection, %s writes: %s  engine/baseline %.2f\n",
			c.size(int64(b.BlockSize)), rate(b.GBps*1e9, c), r.VsBaseline)
	}
}

// printTable writes the sweep as a Markdown table.
func printTable(w io.Writer, c *benchConfig, rs []*benchResult) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 1, ' ', tabwriter.Debug)
	hdr := "| op\t block\t " + c.ReportUnit + "/s\t req/s\t p50 batch\t p99 batch\t"
	sep := "|---\t---\t---\t---\t---\t---\t"
	if c.Baseline {
		hdr += " baseline " + c.ReportUnit + "/s\t engine/baseline\t"
		sep += "---\t---\t"
	}
	fmt.Fprintln(tw, hdr)
	fmt.Fprintln(tw, sep)
	for _, r := range rs {
		row := fmt.Sprintf("| %s\t %s\t %s\t %s\t %s\t %s\t", r.Operation, c.size(r.BlockSize),
			strconv.FormatFloat(r.Rate, 'f', c.Precision, 64), si(r.OpsPerSec), latency(r.P50Micros), latency(r.P99Micros))
		if b := r.Baseline; b != nil {
			row += fmt.Sprintf(" %s\t %.2f\t", strconv.FormatFloat(b.GBps*1e9/reportUnits[c.ReportUnit], 'f', c.Precision, 64), r.VsBaseline)
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
	// tabwriter.Debug draws '|' between cells; the rows already start with one.
	out := strings.ReplaceAll(buf.String(), "\t", "")
	fmt.Fprintf(w, "\n%s/%s, batch %d, threads %d, %v per cell, target %s\n\n", rs[0].Protocol, "loopback", c.BatchSize, c.Threads, c.Duration, rs[0].Segment)
	io.WriteString(w, out)
}

// verify writes a fresh pattern to the target with one batch covering the
// footprint, reads it back into the second half of the local buffer and
// compares.
func (env *benchEnv) verify(ctx context.Context, block int64, proto string) (bool, error) {
	c := env.cfg
	n := int64(c.BatchSize) * int64(c.Threads)
	fp := block * n
	mem := env.init.mem.Bytes()
	src, dst := mem[:fp], mem[fp:2*fp]
	seed := uint64(time.Now().UnixNano())
	fill(src, seed)
	clear(dst)
	e := env.init.eng
	reqs := make([]engine.Request, n)
	for _, op := range []engine.Op{engine.Write, engine.Read} {
		for i := range reqs {
			off := block * int64(i)
			local := src
			if op == engine.Read {
				local = dst
			}
			reqs[i] = engine.Request{Op: op, Local: local[off : off+block], Target: env.seg, TargetAddr: env.remoteBase + uint64(off), Transport: proto}
		}
		b, err := e.AllocateBatch(len(reqs))
		if err != nil {
			return false, err
		}
		if err := e.Submit(b, reqs); err != nil {
			e.FreeBatch(b)
			return false, err
		}
		err = e.Wait(ctx, b)
		e.FreeBatch(b)
		if err != nil {
			return false, err
		}
	}
	if !bytes.Equal(src, dst) {
		return false, nil
	}
	if env.target != nil {
		// With the target in this process, look at its memory directly too.
		tmem := env.target.mem.Bytes()
		off := env.remoteBase - env.target.eng.LocalDescriptor().Buffers[0].Addr
		return bytes.Equal(src, tmem[off:off+uint64(fp)]), nil
	}
	return true, nil
}

// printCompareTable writes a sweep over several protocols as one Markdown
// table: a row per operation and block, a column per protocol, the
// single-thread memcpy and the ratios, all measured taking turns.
func printCompareTable(w io.Writer, c *benchConfig, protos []string, rs []*benchResult) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 1, ' ', tabwriter.Debug)
	u := c.ReportUnit + "/s"
	hdr, sep := "| op\t block\t", "|---\t---\t"
	for _, p := range protos {
		hdr += fmt.Sprintf(" %s %s\t", p, u)
		sep += "---\t"
	}
	withMemcpy := slices.Contains(protos, "shm")
	if withMemcpy {
		hdr += fmt.Sprintf(" memcpy %s\t", u)
		sep += "---\t"
	}
	for _, p := range protos {
		if p != "tcp" && slices.Contains(protos, "tcp") {
			hdr += fmt.Sprintf(" %s/tcp\t", p)
			sep += "---\t"
		}
	}
	if withMemcpy {
		hdr += " shm/memcpy\t"
		sep += "---\t"
	}
	if c.Baseline {
		hdr += fmt.Sprintf(" baseline %s\t %s/baseline\t", u, protos[0])
		sep += "---\t---\t"
	}
	fmt.Fprintln(tw, hdr)
	fmt.Fprintln(tw, sep)
	num := func(r float64) string { return strconv.FormatFloat(r, 'f', c.Precision, 64) }
	for i := 0; i+len(protos) <= len(rs); i += len(protos) {
		row := rs[i : i+len(protos)]
		line := fmt.Sprintf("| %s\t %s\t", row[0].Operation, c.size(row[0].BlockSize))
		var shm *benchResult
		for _, r := range row {
			line += fmt.Sprintf(" %s\t", num(r.Rate))
			if r.Protocol == "shm" {
				shm = r
			}
		}
		if withMemcpy {
			line += fmt.Sprintf(" %s\t", num(shm.Memcpy.GBps*1e9/reportUnits[c.ReportUnit]))
		}
		for _, r := range row {
			if r.Protocol != "tcp" && slices.Contains(protos, "tcp") {
				line += fmt.Sprintf(" %.2f\t", r.VsTCP)
			}
		}
		if withMemcpy {
			line += fmt.Sprintf(" %.2f\t", shm.VsMemcpy)
		}
		if b := row[0].Baseline; c.Baseline && b != nil {
			line += fmt.Sprintf(" %s\t %.2f\t", num(b.GBps*1e9/reportUnits[c.ReportUnit]), row[0].VsBaseline)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	out := strings.ReplaceAll(buf.String(), "\t", "")
	fmt.Fprintf(w, "\n%s, loopback, batch %d, threads %d, %v per cell taking turns, target %s\n\n",
		strings.Join(protos, " vs "), c.BatchSize, c.Threads, c.Duration, rs[0].Segment)
	io.WriteString(w, out)
}

func protoNames(d *segment.Descriptor) []string {
	var out []string
	for _, p := range d.Protocols {
		out = append(out, p.Name)
	}
	return out
}

// railStats is the initiator's RDMA rail counters (nil without rdma).
func (env *benchEnv) railStats() []rdma.RailStats {
	for _, tr := range env.init.trs {
		if rt, ok := tr.(*rdma.Transport); ok {
			return rt.Stats()
		}
	}
	return nil
}

// railDelta is what each rail carried between two snapshots.
func railDelta(before, after []rdma.RailStats) []rdma.RailStats {
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
