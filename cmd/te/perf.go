package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/perftest"
)

func init() {
	register(command{
		name:    "perf",
		summary: "verbs benchmark with perftest's flags: RDMA write/read/send bandwidth and latency; interoperates with ib_write_bw/ib_read_bw",
		run:     runPerf,
	})
}

const perfUsage = `usage:
  te perf -d DEV [flags]                 server: waits for one client (te perf or perftest)
  te perf -d DEV [flags] HOST            client: runs the test against HOST's server
  te perf -d DEV --peer DEV2 [flags]     both ends in this process

Measures RC verbs bandwidth (--op write|read|send) or latency (--lat) the way
perftest's ib_{write,read,send}_{bw,lat} do, over uverbs without libibverbs,
with perftest's flags. Against perftest's own ib_write_bw and ib_read_bw, in
either role, give both ends the same flags (--op read for ib_read_bw). A te
client tells a te server the test; a perftest client does not, so a server
takes its test from its own flags, as perftest's does.
MB/sec is MiB/s; write and send latency is half the measured round trip.

perftest's flags:
  -d, --ib-dev DEV          RDMA device (required), e.g. rxe0 or mlx5_0
  -i, --ib-port N           port of the device (default 1)
  -x, --gid-index N         GID index (default: the first RoCE v2 IPv4 GID; 0 on InfiniBand)
  -s, --size BYTES          message size (default 65536 for bandwidth, 8 for latency)
  -n, --iters N             iterations (default 5000 for bandwidth, 1000 for latency)
  -D, --duration SECONDS    bandwidth: run this long instead of -n iterations
  -a, --all                 every size from 2 bytes (latency: 8) to 8 MiB, one row each
  -p, --port N              TCP port of the out-of-band exchange (default 18515, as perftest)
  -t, --tx-depth N          outstanding work requests (bandwidth; default 128)
  -Q, --cq-mod N            request a completion every N work requests (bandwidth; default 100)
  -I, --inline_size BYTES   send messages up to this size inline (default: 220 write latency, 236 send latency, else 0)
  -m, --mtu BYTES           path MTU, 256..4096 (default: the ports' active MTU)
  -u, --qp-timeout N        ACK timeout exponent, 4.096 us * 2^N (default: 14 on hardware, 18 on Soft-RoCE)
  -e, --events              bandwidth: sleep on completion events (--cq event)
  -q, --qp N                queue pairs: te perf runs 1
  -F, --CPU-freq            accepted: te perf measures with the clock, not CPU cycles
      --report_gbits        bandwidth in Gb/s instead of MB/s
te's own flags:
      --op OP               write (default), read or send
      --lat                 latency instead of bandwidth
      --peer DEV            run the other end in this process on DEV; --peer-x its GID index
      --cq MODE             bandwidth: poll, event, or auto (default: event on Soft-RoCE, poll on hardware)
      --spin N              with --cq event: empty polls before sleeping
      --warmup N            bandwidth: untimed requests, one at a time, first (default 16)
      --json                one JSON line per result
      --timeout D           give up after this long (default 2m)
Not in te perf: -g (multicast), -R/-z (rdma_cm), -b (bidirectional), -c other than RC,
-c/-q beyond one RC QP, -l (post lists), -O (dual port).
`

const perfUse = "te perf -d DEV [flags] [HOST]"

type perfArgs struct {
	p                    perftest.Params
	dev, peer            perftest.Device
	host                 string
	port, seconds, qps   int
	all, events, cpuFreq bool
	gbits, lat, json     bool
	conn                 string
	timeout              time.Duration
}

// parsePerf reads perftest's flags (short or long, one dash or two,
// before or after the host) and te's own; -h prints perfUsage on help.
func parsePerf(args []string, help io.Writer) (*perfArgs, *cli.FlagSet, error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" || a == "-help" {
			fmt.Fprint(help, perfUsage)
			return nil, nil, cli.ErrHelp
		}
	}
	fs := cli.NewFlagSet("te perf", perfUse, "", help)
	a := &perfArgs{p: perftest.Params{Op: perftest.OpWrite, Test: perftest.TestBW}}
	// perftest's long names are the flags, its letters the aliases
	short := map[string]string{}
	str := func(p *string, v, name, letter string) {
		fs.StringVar(p, name, v, "")
		short[name] = letter
	}
	num := func(p *int, v int, name, letter string) {
		fs.IntVar(p, name, v, "")
		short[name] = letter
	}
	boolean := func(p *bool, name, letter string) {
		fs.BoolVar(p, name, false, "")
		short[name] = letter
	}
	str(&a.dev.Name, "", "ib-dev", "d")
	num(&a.dev.Port, 1, "ib-port", "i")
	num(&a.dev.GIDIndex, -1, "gid-index", "x")
	num(&a.p.Size, 0, "size", "s")
	num(&a.p.Iters, 0, "iters", "n")
	num(&a.seconds, 0, "duration", "D")
	boolean(&a.all, "all", "a")
	num(&a.port, 18515, "port", "p")
	num(&a.p.Depth, 128, "tx-depth", "t")
	num(&a.p.CQMod, 100, "cq-mod", "Q")
	num(&a.p.Inline, -1, "inline-size", "I")
	num(&a.p.MTU, 0, "mtu", "m")
	num(&a.p.QPTimeout, 0, "qp-timeout", "u")
	boolean(&a.events, "events", "e")
	num(&a.qps, 1, "qp", "q")
	boolean(&a.cpuFreq, "CPU-freq", "F")
	boolean(&a.gbits, "report-gbits", "")
	str(&a.conn, "RC", "connection", "c")
	// te perf's earlier spellings of the roles: perftest's positional
	// host replaced them.
	fs.Var(&refusedFlag{name: "server"}, "server", "")
	fs.Var(&refusedFlag{name: "connect"}, "connect", "")
	for name, letter := range map[string]string{"mcg": "g", "rdma_cm": "R", "com_rdma_cm": "z", "bidirectional": "b"} {
		fs.Var(&refusedFlag{name: letter}, name, "")
		short[name] = letter
	}
	str(&a.p.Op, perftest.OpWrite, "op", "")
	boolean(&a.lat, "lat", "")
	str(&a.peer.Name, "", "peer", "")
	num(&a.peer.GIDIndex, -1, "peer-x", "")
	str(&a.p.CQ, "auto", "cq", "")
	num(&a.p.Spin, 0, "spin", "")
	num(&a.p.Warmup, perftest.DefaultWarmup, "warmup", "")
	boolean(&a.json, "json", "")
	fs.DurationVar(&a.timeout, "timeout", 2*time.Minute, "")
	for name, letter := range short {
		if letter != "" {
			fs.Alias(name, letter)
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	fail := func(format string, v ...any) (*perfArgs, *cli.FlagSet, error) {
		return nil, nil, fs.Usagef(format, v...)
	}
	var refused []string
	fs.Visit(func(fl *flag.Flag) {
		if r, ok := fl.Value.(*refusedFlag); ok && r.set {
			refused = append(refused, r.why())
		}
	})
	pos := fs.Args()
	switch {
	case len(refused) > 0:
		return fail("%s", strings.Join(refused, "; "))
	case a.dev.Name == "":
		return fail("-d DEV is required (te devices lists them)")
	case len(pos) > 1:
		return fail("one server host, got %q", pos)
	case len(pos) == 1 && a.peer.Name != "":
		return fail("--peer runs both ends here; it takes no server host (got %q)", pos[0])
	case a.qps != 1:
		return fail("-q %d: te perf runs one queue pair", a.qps)
	case !strings.EqualFold(a.conn, "RC"):
		return fail("-c %s: te perf runs RC only", a.conn)
	case a.port < 1 || a.port > 65535:
		return fail("-p %d: want a TCP port, 1..65535", a.port)
	case a.dev.Port < 1 || a.dev.Port > 255:
		return fail("-i %d: want a port number, 1..255", a.dev.Port)
	case a.seconds < 0 || a.seconds > 86400:
		return fail("-D %d: want seconds, 1..86400", a.seconds)
	case a.all && a.p.Size != 0:
		return fail("-a runs every size; leave out -s")
	}
	if len(pos) == 1 {
		a.host = pos[0]
	}
	a.peer.Port = a.dev.Port
	if a.lat {
		a.p.Test = perftest.TestLat
	}
	if a.events {
		a.p.CQ = "event"
	}
	a.p.Duration = time.Duration(a.seconds) * time.Second
	a.p.Defaults()
	if a.p.Test == perftest.TestBW {
		a.p.Warmup = min(a.p.Warmup, a.p.Iters)
	} else {
		a.p.Warmup = 0
	}
	if err := a.p.Check(); err != nil {
		return fail("%v", err)
	}
	return a, fs, nil
}

// refusedFlag is a perftest flag te perf does not implement: setting it
// fails with what te perf offers instead.
type refusedFlag struct {
	name string
	set  bool
}

func (r *refusedFlag) String() string   { return "" }
func (r *refusedFlag) IsBoolFlag() bool { return true }
func (r *refusedFlag) Set(string) error { r.set = true; return nil }
func (r *refusedFlag) Get() any         { return r.set }
func (r *refusedFlag) why() string {
	switch r.name {
	case "g":
		return "-g is perftest's multicast; te perf has none (the GID index is -x)"
	case "b":
		return "-b: te perf measures one direction"
	case "server":
		return "--server: te perf without a HOST is the server, as perftest"
	case "connect":
		return "--connect: give the server host as the argument: te perf -d DEV HOST, as perftest"
	}
	return "-" + r.name + ": te perf exchanges QPs over TCP, not rdma_cm"
}

func runPerf(ctx context.Context, args []string) error {
	a, fs, err := parsePerf(args, os.Stdout)
	if err != nil {
		return err
	}
	var rep *cli.Report[perftest.Result]
	if a.json {
		rep = cli.NewReport[perftest.Result](fs)
	}
	// A missing device fails now, with the reason, not after a peer came.
	for _, d := range []string{a.dev.Name, a.peer.Name} {
		if d == "" {
			continue
		}
		if _, err := lookupDevice(d); err != nil {
			return err
		}
	}
	var sizes []int
	if a.all {
		sizes = perftest.AllSizes(a.p.Test)
	}
	o := perftest.Options{Verbs: verbsOptions, Log: os.Stderr, ReportGbits: a.gbits}
	if !a.json { // rows as they come; JSON is one report at the end
		o.OnResult = (&perfPrinter{w: os.Stdout, gbits: a.gbits}).print
	}
	var res []perftest.Result
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	switch {
	case a.peer.Name != "":
		res, err = perftest.Local(ctx, a.dev, a.peer, a.p, sizes, o)
	case a.host != "":
		addr := a.host
		if _, _, e := net.SplitHostPort(addr); e != nil {
			addr = net.JoinHostPort(addr, strconv.Itoa(a.port))
		}
		res, err = perftest.Connect(ctx, addr, a.dev, a.p, sizes, o)
	default:
		if err := perftest.Probe(a.dev, verbsOptions); err != nil {
			return err
		}
		ln, lerr := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(a.port)))
		if lerr != nil {
			return fmt.Errorf("%w (another te perf or perftest server on -p %d?)", lerr, a.port)
		}
		defer ln.Close()
		res, err = perftest.Serve(ctx, ln, a.dev, a.p, sizes, o)
	}
	if err != nil {
		return err
	}
	if rep != nil {
		rep.Results = res
		return rep.Write(os.Stdout)
	}
	return nil
}
