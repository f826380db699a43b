package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/admin"
	"github.com/rdmago/te/internal/bench"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/segment"
)

func init() {
	register(command{
		name:    "bench",
		summary: "measure transfers to a segment (default: TCP and shm to an in-process target)",
		run:     func(ctx context.Context, args []string) error { return runBench(ctx, args, os.Stdout, os.Stderr) },
	})
}

// benchResult is one measured configuration, as --json prints it.
type benchResult = bench.Result

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseBench(args, stdout)
	if err != nil {
		return err
	}
	if c.Mode == "target" {
		return runServe(ctx, c.serveArgs(), stdout, stderr)
	}
	var rep *cli.Report[*benchResult]
	if c.JSON {
		rep = cli.NewReport[*benchResult](c.fs)
	}
	if c.secret, err = loadAuth(c.AuthFile); err != nil {
		return err
	}
	c.Auth = c.secret != nil
	// Progress and the setup go to stderr, the headers to stdout (stderr
	// with --json); --quiet leaves only the results.
	var progress io.Writer = stderr
	if c.Quiet {
		progress = io.Discard
	}
	info := stdout
	if c.JSON || c.Quiet {
		info = progress
	}

	footprint := c.maxBlock() * int64(c.BatchSize) * int64(c.Threads)
	bufSize := max(c.BufferSize, footprint)
	localSize := bufSize
	if c.Verify {
		localSize = max(localSize, 2*footprint) // the read-back lands after the pattern
	}
	if bufSize > c.BufferSize {
		fmt.Fprintf(progress, "te bench: block × batch × threads = %s: the buffer is raised from --buffer-size %s to %s on each side\n",
			c.size(footprint), c.size(c.BufferSize), c.size(bufSize))
	}
	// What to lower when the buffers do not fit: the footprint raised
	// them, or --buffer-size is too large.
	lower := "lower --buffer-size"
	if bufSize > c.BufferSize || localSize > c.BufferSize {
		lower = "lower --threads, --batch-size or --block-size"
		if c.Verify {
			lower += " (--verify doubles the initiator's)"
		}
	}
	need, what := localSize, "the initiator's buffer"
	if c.Segment == "" {
		need, what = bufSize+localSize, "the initiator's and the in-process target's buffers"
	}
	if err := fitMemory(what, need, lower); err != nil {
		return err
	}
	stages := cli.NewStages(progress, "te bench", time.Second)
	env, err := setupBench(ctx, c, bufSize, localSize, stages.Stage)
	stages.End(err)
	if err != nil {
		return withAdvice(err, lower)
	}
	defer env.Close()
	for _, u := range env.unreached {
		// Always said (--quiet and --json too): the run measures less
		// than the segment offers.
		fmt.Fprintf(stderr, "te bench: %s does not reach %s (%s); measuring over %s\n",
			u.proto, cli.Printable(env.segment), cli.ErrorLine(u.err), strings.Join(env.protos, " and "))
	}
	defer serveLanes(env.laneLabels)() // for te trace
	if c.Admin != "" {
		srv, err := admin.Start(c.Admin, env.init.eng, stderrLogger())
		if err != nil {
			return err
		}
		defer srv.Close()
		fmt.Fprintf(progress, "te bench: admin on http://%s (/metrics, /debug/te, /debug/pprof/)\n", srv.Addr())
	}
	var bt *benchTrace
	if c.Trace {
		bt = startBenchTrace(env, stderr)
		defer bt.Close()
	}
	printHeader(info, c, env, bufSize)

	blocks, ops := []int64{c.BlockSize}, []string{c.Operation}
	if c.Sweep {
		blocks, ops = sweepBlocks, sweepOps
	}
	var table interface{ row([]*benchResult) }
	switch {
	case c.Sweep && !c.JSON && c.Latency:
		table = newLatencyTable(stdout, c, env)
	case c.Sweep && !c.JSON:
		table = newSweepTable(stdout, c, env)
	}
	var results []*benchResult
	for _, block := range blocks {
		for _, op := range ops {
			label := op + " " + c.size(block)
			bc := env.config(op, block)
			bc.Progress = func(p bench.Progress) { printProgress(progress, c, label, p) }
			warm := cli.NewStages(progress, "te bench: "+label, time.Second)
			bc.Stage = func(what string) {
				if what == "measuring" {
					warm.Done()
				} else {
					warm.Stage(what)
				}
			}
			rs, err := bench.Run(ctx, &env.Env, bc)
			warm.End(err)
			if err != nil {
				return midRun(fmt.Errorf("%s: %w", label, err))
			}
			warnOverrun(progress, c, &bc, label, rs)
			for _, r := range rs {
				r.Segment, r.InProcess, r.Auth = env.segment, env.target != nil, c.Auth
				if c.Verify {
					ok, err := bench.Verify(ctx, &env.Env, bc, r.Protocol)
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
			if table != nil {
				table.row(rs)
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
	if c.JSON {
		rep.Results = results
		return rep.Write(stdout)
	}
	return nil
}

// warnOverrun says when a configuration measured well past its share of
// --duration (a batch in flight ends each turn, late on a busy machine):
// each protocol that did, or, when none did alone, all of them together
// with the ceilings taken beside them.
func warnOverrun(w io.Writer, c *benchConfig, bc *bench.Config, label string, rs []*benchResult) {
	const advice = "lower --threads, --batch-size or --block-size for a shorter run"
	rounds, turn := bc.Rounds()
	share := (turn * time.Duration(rounds)).Seconds()
	overran := false
	for _, r := range rs {
		if r.Seconds > 2*share && r.Seconds-share > 1 {
			overran = true
			fmt.Fprintf(w, "te bench: %s over %s measured %.1fs, not its %.1fs: each turn ends when every thread's batch in flight (%s in all) is done; %s\n",
				label, r.Protocol, r.Seconds, share, c.size(bc.Footprint()), advice)
		}
	}
	var total float64
	var parts []string
	add := func(name string, sec float64) {
		total += sec
		parts = append(parts, fmt.Sprintf("%s %.1fs", name, sec))
	}
	var mc, base *bench.Ceiling
	for _, r := range rs {
		add(r.Protocol, r.Seconds)
		mc, base = cmp.Or(r.Memcpy, mc), cmp.Or(r.Baseline, base) // base: the same in each
	}
	if mc != nil {
		add("memcpy", mc.Seconds)
	}
	if base != nil {
		add("baseline", base.Seconds)
	}
	if want := c.Duration.Seconds(); !overran && total > 2*want && total-want > 1 {
		fmt.Fprintf(w, "te bench: %s measured %.1fs in all (%s), not its %v: each turn ends when every thread's batch in flight (%s in all) is done, late on a busy machine; %s\n",
			label, total, strings.Join(parts, ", "), c.Duration, c.size(bc.Footprint()), advice)
	}
}

// benchEnv is the initiator, the opened target segment and, without
// --segment, the in-process target.
type benchEnv struct {
	bench.Env
	cfg     *benchConfig
	init    *node
	target  *node // nil for a remote target
	segment string
	protos  []string // measured, taking turns
	// unreached are the transports a default run leaves out: the
	// segment offers them, but they failed to connect (a refusing
	// server, a full one).
	unreached []unreached
}

type unreached struct {
	proto string
	err   error
}

// config is the measurement of op on blocks of block bytes.
func (env *benchEnv) config(op string, block int64) bench.Config {
	c := env.cfg
	bc := bench.Config{Op: parseOp(op), Block: block, Batch: c.BatchSize, Threads: c.Threads,
		Duration: c.Duration, Protocols: env.protos, Baseline: c.Baseline, Latency: c.Latency, Notify: c.Notify}
	for _, p := range env.protos {
		bc.Memcpy = bc.Memcpy || (p == segment.ProtoSHM && !c.Latency)
	}
	return bc
}

func setupBench(ctx context.Context, c *benchConfig, bufSize, localSize int64, stage func(string)) (_ *benchEnv, err error) {
	env := &benchEnv{cfg: c, segment: c.Segment}
	defer func() {
		if err != nil {
			env.Close()
		}
	}()
	if stage == nil {
		stage = func(string) {}
	}
	if env.segment == "" {
		// The target is a second engine with its own embedded store and
		// listeners on loopback: the same code path as a remote one.
		// Stores that do not name segments after their owner (Consul) get
		// distinct names for the two engines.
		stage("starting the in-process target: " + c.size(bufSize))
		env.target, err = openNode(ctx, nodeConfig{metadata: c.Metadata, auth: c.secret, name: benchName("target"), protocols: c.Protocols, listen: "127.0.0.1:0", devices: c.Devices, bufSize: bufSize})
		if err != nil {
			return nil, fmt.Errorf("in-process target: %w", err)
		}
		env.segment = env.target.eng.Name()
	}
	stage("starting the initiator: " + c.size(localSize))
	// With --notify and a target elsewhere, te serve echoes each
	// notification back (bench.Echo): the initiator is then a segment
	// it can reach, listening like a target.
	echoes := c.Notify && env.target == nil
	env.init, err = openNode(ctx, nodeConfig{metadata: c.Metadata, auth: c.secret, name: benchName("initiator"), protocols: c.Protocols, devices: c.Devices, bufSize: localSize, initiator: !echoes,
		stuckAfter: stuckAfter(c.maxBlock() * int64(c.BatchSize) * int64(c.Threads))})
	if err != nil {
		return nil, fmt.Errorf("initiator: %w", err)
	}
	stage("opening segment " + cli.Printable(env.segment))
	env.Engine, env.Local, env.Echoes = env.init.eng, env.init.mem.Bytes(), echoes
	env.Segment, err = env.init.eng.OpenSegment(ctx, env.segment, nil)
	if err != nil {
		return nil, err
	}
	d, err := env.init.eng.SegmentDescriptor(env.Segment)
	if err != nil {
		return nil, err
	}
	env.protos = c.Protocols
	if !c.protoSet {
		// By default, every transport of the list that reaches the
		// target: a target on another host (or a te serve without shm)
		// is measured over tcp alone.
		usable, err := env.init.eng.SegmentTransports(env.Segment)
		if err != nil {
			return nil, err
		}
		env.protos = nil
		for _, p := range c.Protocols {
			if slices.Contains(usable, p) {
				env.protos = append(env.protos, p)
			}
		}
		if len(env.protos) == 0 {
			return nil, fmt.Errorf("segment %s offers %v; none of %v reaches it from here", cli.Printable(env.segment), protoNames(d), c.Protocols)
		}
	}
	env.Rails = env.init.railStats
	need := uint64(bufSize)
	if c.Segment != "" {
		// A remote target's buffer was sized by its owner; only the
		// footprint has to fit.
		need = uint64(c.maxBlock()) * uint64(c.BatchSize) * uint64(c.Threads)
	}
	var largest uint64
	for _, b := range d.Buffers {
		largest = max(largest, b.Length)
		if b.Length >= need {
			env.Remote = b.Addr
			if env.target != nil {
				tmem := env.target.mem.Bytes()
				env.TargetMem = tmem[b.Addr-engine.AddrOf(tmem):]
				env.Target = env.target.eng
			}
			if !c.protoSet && len(env.protos) > 1 {
				stage("connecting over " + strings.Join(env.protos, ", "))
				if err := env.probe(ctx, min(b.Length, 4096, uint64(len(env.Local)))); err != nil {
					return nil, err
				}
			}
			return env, nil
		}
	}
	return nil, fmt.Errorf("segment %s exposes no buffer of %s (block × batch × threads); its largest is %s: lower --block-size, --batch-size or --threads, or raise the target's --buffer-size",
		cli.Printable(env.segment), c.size(int64(need)), c.size(int64(largest)))
}

// probeTimeout bounds one transport's first connection in a default run.
const probeTimeout = 10 * time.Second

// probe connects each transport of a default run with one READ of n
// bytes from the target's buffer (into the start of the local one,
// before any pattern is written) and leaves out those that fail: the
// engine's own choice would fall back from them too. When none
// connects, the first one's error is the run's.
func (env *benchEnv) probe(ctx context.Context, n uint64) error {
	var reached []string
	var first error
	for _, p := range env.protos {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := env.Engine.Transfer(pctx, []engine.Request{{Op: engine.Read, Local: env.Local[:n], Target: env.Segment, TargetAddr: env.Remote, Transport: p}})
		cancel()
		switch {
		case err == nil:
			reached = append(reached, p)
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			env.unreached = append(env.unreached, unreached{p, err})
			if first == nil {
				first = err
			}
		}
	}
	if len(reached) == 0 {
		return fmt.Errorf("no transport reaches segment %s: %w", cli.Printable(env.segment), first)
	}
	env.protos = reached
	return nil
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
	return errors.Join(errs...)
}

func parseOp(op string) engine.Op {
	if op == "read" {
		return engine.Read
	}
	return engine.Write
}

func protoNames(d *segment.Descriptor) []string {
	var out []string
	for _, p := range d.Protocols {
		out = append(out, cli.Printable(p.Name))
	}
	return out
}

// metadataLabel is where the bench's metadata lives: the in-process
// target's store (its real address), else the store the initiator used.
func (env *benchEnv) metadataLabel() string {
	if env.target != nil {
		return env.target.metadataAddr()
	}
	return env.init.metadataAddr()
}

// opsLabel and blocksLabel describe what the run measures.
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

// stuckSlowRate is the rate, in bytes per second, at which te bench
// expects even a slow path to drain what its threads keep in flight.
const stuckSlowRate = 50e6

// stuckAfter is the initiator engine's Config.StuckAfter for a run that
// keeps footprint bytes in flight: the default, or longer when the
// footprint would take longer than that at stuckSlowRate. A task queued
// behind 1000 threads' batches (8000MiB at the defaults) waits its turn
// for minutes without being stuck; the engine's log of stuck tasks would
// fill the terminal during the warm-up.
func stuckAfter(footprint int64) time.Duration {
	return max(engine.DefaultStuckAfter, time.Duration(float64(footprint)/stuckSlowRate*float64(time.Second)))
}
