package main

import (
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/mooncake"
)

// benchConfig is te bench's flags after parsing.
type benchConfig struct {
	Operation  string
	Protocol   string
	Protocols  []string
	protoSet   bool
	BlockSize  int64
	BatchSize  int
	Threads    int
	Duration   time.Duration
	BufferSize int64
	Segment    string
	Metadata   string
	ReportUnit string
	Precision  int
	JSON       bool
	Baseline   bool
	Sweep      bool
	Latency    bool
	Verify     bool
	Notify     bool
	Mooncake   bool // --mooncake: Mooncake's wire and its P2PHANDSHAKE socket
	Quiet      bool
	AuthFile   string
	Auth       bool         // a cluster secret is in use (never the secret)
	secret     *auth.Secret // loaded from AuthFile
	Trace      bool
	Admin      string // --admin: the initiator's admin endpoint
	Devices    []string
	// Mooncake's transfer_engine_bench flags.
	Mode            string
	LocalServerName string
	// block prints sizes in the unit --block-size was given in.
	block   *cli.Size
	buf     *cli.Size
	fs      *cli.FlagSet
	resolve func()
}

// sweepBlocks and sweepOps are the table --sweep measures.
var (
	sweepBlocks = []int64{4 << 10, 64 << 10, 1 << 20}
	sweepOps    = []string{"write", "read"}
)

// maxThreads bounds --threads.
const maxThreads = 1024

func benchFlags(c *benchConfig, help io.Writer) *cli.FlagSet {
	fs := cli.NewFlagSet("te bench", "te bench [flags]",
		"Each thread loops: allocate a batch, submit batch-size requests of block-size\n"+
			"bytes (thread t's request i at offset block×(i×threads+t) on both sides),\n"+
			"wait for all, free the batch. GB/s counts 1e9 bytes; latency is per batch,\n"+
			"submit to all complete. With no --segment a target runs in this process\n"+
			"over loopback. Start a separate target with te serve.\n"+
			"Sizes: 4096, 64K or 64KiB, 1.5MiB, 1G or 1GiB (powers of 1024); 64KB, 1GB\n"+
			"(powers of 1000); any case.", help)
	op := cli.NewChoice("write", "read", "write")
	proto := &cli.List{V: []string{"tcp", "shm"}, OK: []string{"tcp", "shm", "rdma", "mooncake", "mooncake-rdma"}}
	unit := cli.NewChoice("GB", "GB", "GiB", "Gb", "MB", "MiB", "Mb", "KB", "KiB", "Kb")
	c.block = cli.NewSize(64 << 10)
	buf := cli.NewSize(256 << 20)
	c.buf = buf
	dur := &cli.Seconds{D: 5 * time.Second}
	fs.Var(op, "operation", "the `op`: read (target to local) or write (local to target)")
	fs.Var(proto, "protocol", "the `transports` to measure, taking turns: tcp, shm (same host), rdma, or a comma-separated list; with shm a single-thread memcpy of the same blocks is measured beside it")
	fs.Var(c.block, "block-size", "`bytes` per request")
	fs.IntVar(&c.BatchSize, "batch-size", 128, "requests per batch (1 with --latency)")
	fs.IntVar(&c.Threads, "threads", 1, "initiator goroutines, each with its own batches")
	fs.Var(dur, "duration", "`time` to measure each configuration (seconds, or 500ms, 2s, ...)")
	fs.Var(buf, "buffer-size", "`bytes` registered on each side (raised to block × batch × threads)")
	fs.StringVar(&c.Segment, "segment", "", "target segment to open (with p2p: the te serve's host:port); default: start a target in this process")
	fs.StringVar(&c.Metadata, "metadata", defaultMetadata(), "metadata store: p2p (embedded, no server) or consul://host:port[/prefix] ($TE_METADATA sets the default)")
	fs.Var(unit, "report-unit", "bandwidth `unit`: GB (1e9 bytes), GiB, Gb, MB, MiB, Mb, KB, KiB, Kb")
	fs.IntVar(&c.Precision, "report-precision", 2, "digits after the point in reported bandwidths")
	fs.BoolVar(&c.JSON, "json", false, "print the results as JSON on stdout (docs/cli.md)")
	fs.BoolVar(&c.Baseline, "baseline", false, "also measure raw TCP over one loopback connection at the same block size, taking turns with the engine (250 ms each), and print engine/baseline")
	fs.BoolVar(&c.Sweep, "sweep", false, "measure the table: 4KiB, 64KiB, 1MiB blocks × write, read (other flags apply)")
	fs.BoolVar(&c.Latency, "latency", false, "measure single requests (batch size 1): latency p50, p90, p99, p99.9 and max per request on each protocol, taking turns (with --sweep, the table)")
	fs.BoolVar(&c.Verify, "verify", false, "after each measurement, write a pattern, read it back and compare")
	fs.BoolVar(&c.Notify, "notify", false, "send every batch with a completion notification and print the time from submit to its notification (p50/p99) next to the batch latency; a te serve target echoes each back (so this process listens like a target), timed by the two processes' clocks: one host's, or synchronized ones")
	fs.StringVar(&c.Admin, "admin", "", "serve /metrics (Prometheus), /debug/te (the initiator engine's snapshot as JSON) and /debug/pprof/ on `host:port` (127.0.0.1:9100; port 0 picks one)")
	fs.BoolVar(&c.Quiet, "quiet", false, "print only the results: no headers, no progress")
	authFile := authFlag(fs.FlagSet)
	fs.BoolVar(&c.Trace, "trace", false, "trace the TCP lanes with eBPF (root) while measuring and print a per-lane table (untraced, from TCP_INFO, where eBPF is unavailable)")
	devices := &cli.List{}
	fs.Var(devices, "devices", "RDMA `devices` of the initiator (and of an in-process target), one rail each (rxe0,rxe2); default: every device with an active port")
	mode := cli.NewChoice("initiator", "initiator", "target")
	fs.Var(mode, "mode", "Mooncake's --mode: initiator (what te bench does) or target (runs te serve with the flags that apply)")
	fs.StringVar(&c.LocalServerName, "local-server-name", "", "Mooncake's `host[:port]`: with p2p metadata the host the stores listen on (with --mode target also the port), else the target's segment name")
	fs.BoolVar(&c.Mooncake, "mooncake", false, "speak Mooncake's wire, to reach Mooncake's transfer_engine_bench --mode=target: --protocol tcp (te's mooncake, the default) or rdma (mooncake-rdma), and p2p (P2PHANDSHAKE) metadata is Mooncake's handshake socket")
	fs.Alias("segment", "segment_id")
	fs.Alias("metadata", "metadata_server")
	fs.Alias("devices", "device_name")
	c.fs = fs
	// Resolved after Parse.
	c.resolve = func() {
		c.Operation, c.Protocol, c.Protocols, c.protoSet, c.ReportUnit = op.V, proto.String(), proto.V, proto.Given, unit.V
		c.Devices, c.AuthFile, c.Mode = devices.V, *authFile, mode.V
		c.BlockSize, c.BufferSize, c.Duration = c.block.N, buf.N, dur.D
	}
	return fs
}

func parseBench(args []string, help io.Writer) (*benchConfig, error) {
	c := &benchConfig{}
	fs := benchFlags(c, help)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fs.Usagef("unexpected arguments %q (te bench takes only flags)", strings.Join(fs.Args(), " "))
	}
	c.resolve()
	if m := mooncakeMetadata(c.Metadata); m != "" {
		return nil, fs.Usagef("--metadata %s: %s", cli.Printable(c.Metadata), m)
	}
	if c.Mooncake {
		p, ok := mooncakeProtocol(c.Protocols, c.protoSet)
		if !ok {
			return nil, fs.Usagef("--mooncake speaks Mooncake's wires: --protocol tcp or rdma (Mooncake's spellings; te's: mooncake, mooncake-rdma), not %s", c.Protocol)
		}
		c.Protocol, c.Protocols = p, []string{p}
	}
	c.Metadata = metadataURI(c.Metadata, mooncakeWire(c.Protocols))
	if scheme, ok := embedded(c.Metadata); ok && c.LocalServerName != "" && c.Mode != "target" {
		// The initiator's store listens on that host; the port stays
		// free (an in-process target needs one of its own).
		host, _, err := net.SplitHostPort(c.LocalServerName)
		if err != nil {
			host = c.LocalServerName
		}
		c.Metadata = scheme + net.JoinHostPort(host, "0")
	}
	if err := checkSegment(fs, c.Metadata, c.Segment); err != nil {
		return nil, err
	}
	if c.Latency {
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "batch-size" })
		if given && c.BatchSize != 1 {
			return nil, fs.Usagef("--latency measures single requests: leave out --batch-size %d (it is 1)", c.BatchSize)
		}
		c.BatchSize = 1
	}
	switch {
	case c.BlockSize <= 0 || c.BlockSize > 1<<30:
		return nil, fs.Usagef("--block-size %s: want 1 byte to 1GiB", c.block)
	case c.BatchSize <= 0 || c.BatchSize > engine.MaxBatchCapacity:
		return nil, fs.Usagef("--batch-size %d: want 1 to %d", c.BatchSize, engine.MaxBatchCapacity)
	case c.Threads <= 0 || c.Threads > maxThreads:
		return nil, fs.Usagef("--threads %d: want 1 to %d", c.Threads, maxThreads)
	case c.BufferSize <= 0:
		return nil, fs.Usagef("--buffer-size must be positive")
	case c.Precision < 0 || c.Precision > 9:
		return nil, fs.Usagef("--report-precision %d: want 0 to 9", c.Precision)
	}
	if fp := c.maxBlock() * int64(c.BatchSize) * int64(c.Threads); fp > 64<<30 {
		return nil, fs.Usagef("block × batch × threads = %s: over 64GiB", c.size(fp))
	}
	return c, nil
}

// serveArgs are te serve's flags for Mooncake's --mode=target: the ones
// that apply to a target, as given.
func (c *benchConfig) serveArgs() []string {
	var out []string
	c.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "metadata", "protocol", "buffer-size", "devices", "auth-file", "local-server-name", "mooncake", "admin":
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return out
}

// maxBlock is the largest block the run measures.
func (c *benchConfig) maxBlock() int64 {
	if c.Sweep {
		return max(c.BlockSize, sweepBlocks[len(sweepBlocks)-1])
	}
	return c.BlockSize
}

// size writes n bytes in the unit --block-size was given in.
func (c *benchConfig) size(n int64) string {
	if c.block == nil {
		return cli.FormatSize(n)
	}
	return c.block.Format(n)
}

// reportUnits are Mooncake's --report_unit choices: bytes (or bits, for
// the lower-case b) per second in that unit.
var reportUnits = map[string]float64{
	"GB": 1e9, "GiB": 1 << 30, "Gb": 1e9 / 8,
	"MB": 1e6, "MiB": 1 << 20, "Mb": 1e6 / 8,
	"KB": 1e3, "KiB": 1 << 10, "Kb": 1e3 / 8,
}

// defaultMetadata is the --metadata default of every command: $TE_METADATA,
// else the embedded store.
func defaultMetadata() string {
	if v := os.Getenv("TE_METADATA"); v != "" {
		return v
	}
	return "p2p"
}

// localServerName applies Mooncake's --local_server_name host[:port]:
// with p2p metadata the store listens there, else it names the segment.
func localServerName(metadata, lsn, name string) (string, string, error) {
	scheme, ok := embedded(metadata)
	if !ok {
		if name == "" {
			name = lsn
		}
		return metadata, name, nil
	}
	host, port, err := net.SplitHostPort(lsn)
	if err != nil {
		host, port = lsn, "0"
	}
	if host == "" || strings.ContainsAny(host, "/?#@") {
		return "", "", errors.New("want host or host:port")
	}
	u := scheme + net.JoinHostPort(host, port)
	if _, q, ok := strings.Cut(metadata, "?"); ok {
		u += "?" + q
	}
	return u, name, nil
}

// metadataURI maps Mooncake's spellings of the embedded store to ours:
// te's p2p store, or Mooncake's handshake socket when te speaks only
// Mooncake's wire (its peers are Mooncake processes).
func metadataURI(v string, mooncakeWire bool) string {
	switch strings.ToLower(v) {
	case "", "p2p", "p2phandshake", "p2p://":
		if mooncakeWire {
			return "p2phandshake://127.0.0.1:0"
		}
		return "p2p://127.0.0.1:0"
	}
	return v
}

// mooncakeProtocol maps --protocol to the te transport of Mooncake's wire
// for --mooncake: Mooncake's spelling (tcp, rdma) or te's (mooncake,
// mooncake-rdma); not given, Mooncake's TCP. ok is false for anything
// else.
func mooncakeProtocol(v []string, given bool) (p string, ok bool) {
	if !given {
		return mooncake.TEProtoTCP, true
	}
	if len(v) != 1 {
		return "", false
	}
	switch v[0] {
	case "tcp", mooncake.TEProtoTCP:
		return mooncake.TEProtoTCP, true
	case "rdma", mooncake.TEProtoRDMA:
		return mooncake.TEProtoRDMA, true
	}
	return "", false
}

// mooncakeWire reports whether the protocols are one of Mooncake's wires
// alone: the peers are Mooncake processes, and p2p metadata is Mooncake's
// handshake socket.
func mooncakeWire(v []string) bool {
	return len(v) == 1 && (v[0] == mooncake.TEProtoTCP || v[0] == mooncake.TEProtoRDMA)
}

// embedded returns the scheme prefix of an embedded store's URI (te's
// p2p:// or Mooncake's p2phandshake://), whose segments are named by the
// store's host:port.
func embedded(metadata string) (string, bool) {
	for _, s := range []string{"p2p://", "p2phandshake://"} {
		if strings.HasPrefix(metadata, s) {
			return s, true
		}
	}
	return "", false
}

// authFlag adds --auth-file to fs: the cluster secret's file, default
// $TE_AUTH_FILE (blank means unset, as in auth.FromEnv). A blank
// --auth-file is an error: leaving the flag out turns authentication off.
func authFlag(fs *flag.FlagSet) *string {
	p := auth.EnvPath()
	fs.Var(authFileFlag{&p}, "auth-file", "`file` holding the cluster secret (mode 0600, at least 16 bytes): peers must prove they hold it (default $"+auth.EnvFile+"; unset: no authentication)")
	return &p
}

// authFileFlag refuses a blank file name, which would otherwise silently
// mean no authentication.
type authFileFlag struct{ p *string }

func (f authFileFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("blank file name: name the secret file, or leave the flag out to run without authentication")
	}
	*f.p = v
	return nil
}

func (f authFileFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}
