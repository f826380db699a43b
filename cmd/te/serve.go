package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/internal/admin"
	"github.com/rdmago/te/internal/bench"
	"github.com/rdmago/te/internal/cli"
)

func init() {
	register(command{
		name:    "serve",
		summary: "expose a registered buffer as a segment (a bench target) until interrupted",
		run:     func(ctx context.Context, args []string) error { return runServe(ctx, args, os.Stdout, os.Stderr) },
	})
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var err0 error
	fs := cli.NewFlagSet("te serve", "te serve [flags]",
		"Registers a buffer, publishes it as a segment and serves transfers to it\n"+
			"until SIGINT or SIGTERM. Prints the segment name for te bench --segment.\n"+
			"To be reached from other hosts: --metadata 'p2p://0.0.0.0?ports=15000-17000'.", stdout)
	metadata := fs.String("metadata", defaultMetadata(), "metadata store: p2p[://host:port?ports=lo-hi] (embedded, no server) or consul://host:port[/prefix] ($TE_METADATA sets the default; p2p listens on 127.0.0.1)")
	protocol := &cli.List{V: []string{"tcp", "shm"}, OK: []string{"tcp", "shm", "rdma", "mooncake", "mooncake-rdma"}}
	fs.Var(protocol, "protocol", "the `transports` to serve: tcp, shm (same-host initiators), rdma, or a comma-separated list")
	bufSize := cli.NewSize(256 << 20)
	fs.Var(bufSize, "buffer-size", "`bytes` of memory to expose (mmap'd, touched lazily)")
	devices := &cli.List{}
	fs.Var(devices, "devices", "RDMA `devices` to serve on, one rail each (rxe0,rxe2); default: every device with an active port")
	listen := fs.String("listen", "", "the transport's data listener, host:port (default: the p2p store's host, else all interfaces, any port)")
	name := fs.String("name", "", "segment name for stores that do not assign one (default hostname/pid; p2p names the segment host:port)")
	authFile := authFlag(fs.FlagSet)
	lsn := fs.String("local-server-name", "", "Mooncake's `host[:port]` of this server: with p2p metadata the address the store listens on, else the segment name")
	mode := fs.String("mode", "target", "Mooncake's --mode: target (what te serve does); for initiator run te bench")
	adminAddr := fs.String("admin", "", "serve /metrics (Prometheus), /debug/te (the engine's snapshot as JSON) and /debug/pprof/ on `host:port` (127.0.0.1:9100; port 0 picks one)")
	printNotifies := fs.Bool("print-notifies", false, "print each completion notification that arrives, one line each: sender, its epoch, name, byte count, message")
	mc := fs.Bool("mooncake", false, "serve Mooncake's initiators (transfer_engine_bench, vLLM, SGLang): --protocol tcp (te's mooncake, the default) or rdma (mooncake-rdma), and p2p (P2PHANDSHAKE, the default) metadata is Mooncake's handshake socket; Mooncake's wire has no authentication")
	fs.Alias("metadata", "metadata_server")
	fs.Alias("devices", "device_name")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !strings.EqualFold(*mode, "target") {
		return fs.Usagef("--mode %s: te serve is the target; the initiator is te bench", cli.Printable(*mode))
	}
	if m := mooncakeMetadata(*metadata); m != "" {
		return fs.Usagef("--metadata %s: %s", cli.Printable(*metadata), m)
	}
	if *mc {
		p, ok := mooncakeProtocol(protocol.V, protocol.Given)
		if !ok {
			return fs.Usagef("--mooncake serves Mooncake's wires: --protocol tcp or rdma (Mooncake's spellings; te's: mooncake, mooncake-rdma), not %s", protocol)
		}
		protocol.V = []string{p}
	}
	*metadata = metadataURI(*metadata, mooncakeWire(protocol.V))
	if *lsn != "" {
		if *metadata, *name, err0 = localServerName(*metadata, *lsn, *name); err0 != nil {
			return fs.Usagef("--local-server-name %s: %v", cli.Printable(*lsn), err0)
		}
	}
	if fs.NArg() > 0 {
		return fs.Usagef("unexpected arguments %q (te serve takes only flags)", strings.Join(fs.Args(), " "))
	}
	if bufSize.N <= 0 {
		return fs.Usagef("--buffer-size must be positive")
	}
	const lower = "lower --buffer-size"
	if err := fitMemory("--buffer-size", bufSize.N, lower); err != nil {
		return err
	}
	secret, err := loadAuth(*authFile)
	if err != nil {
		return err
	}
	n, err := openNode(ctx, nodeConfig{
		metadata: *metadata, auth: secret, name: *name, protocols: protocol.V, listen: *listen, devices: devices.V, bufSize: bufSize.N,
	})
	if err != nil {
		return withAdvice(err, lower)
	}
	defer n.Close()
	defer serveLanes(n.laneLabels)() // for te trace
	if *adminAddr != "" {
		srv, err := admin.Start(*adminAddr, n.eng, stderrLogger())
		if err != nil {
			return err
		}
		defer srv.Close()
		fmt.Fprintf(stderr, "te serve: admin on http://%s (/metrics, /debug/te, /debug/pprof/)\n", srv.Addr())
	}
	d := n.eng.LocalDescriptor()
	fmt.Fprintf(stdout, "segment %s\n", d.Name)
	for _, p := range d.Protocols {
		fmt.Fprintf(stderr, "te serve: %s on %s\n", p.Name, p.Endpoint)
	}
	for _, b := range d.Buffers {
		fmt.Fprintf(stderr, "te serve: buffer %#x, %s (%s)\n", b.Addr, bufSize.Format(int64(b.Length)), b.Location)
	}
	authArg := ""
	if secret != nil {
		abs, err := filepath.Abs(*authFile)
		if err != nil {
			abs = *authFile
		}
		authArg = " --auth-file " + shellQuote(abs)
		fmt.Fprintf(stderr, "te serve: authentication on: initiators must hold the cluster secret in %s (--auth-file or $%s)\n", abs, auth.EnvFile)
	} else {
		fmt.Fprintf(stderr, "te serve: authentication off (no --auth-file or $%s)\n", auth.EnvFile)
	}
	fmt.Fprintf(stderr, "te serve: metadata %s; run: te bench --segment %s --protocol %s%s\n", n.metadataAddr(), d.Name, protocol, authArg)
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	// Notifications are always received, so senders never find the
	// queue full; printed when asked.
	notes := n.eng.Notifications()
	echo := startEchoes(ctx, n.eng, stderr)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case m, ok := <-notes:
			if !ok {
				done = true
				break
			}
			if msg, ok := bench.Echo(&m, time.Now()); ok {
				echo.send(m.From, msg)
			}
			if *printNotifies {
				printNotify(stdout, m)
			}
		}
	}
	echo.stop()
	fmt.Fprintf(stderr, "te serve: stopping\n")
	return n.Close()
}

// echoes sends te bench's notifications back to their senders
// (bench.Echo), so te bench --notify times them with this process as its
// target. One goroutine sends them: the loop receiving notifications
// never waits on a sender; beyond maxEchoes waiting, echoes are dropped.
type echoes struct {
	e    *engine.Engine
	ch   chan echo
	done chan struct{}
}

type echo struct {
	to  string
	msg []byte
}

const (
	maxEchoes    = 1024
	maxEchoPeers = 64 // senders whose segments stay open
	echoTimeout  = 5 * time.Second
)

func startEchoes(ctx context.Context, e *engine.Engine, stderr io.Writer) *echoes {
	x := &echoes{e: e, ch: make(chan echo, maxEchoes), done: make(chan struct{})}
	go func() {
		defer close(x.done)
		segs := map[string]engine.SegmentID{}
		failed := map[string]bool{}
		for ec := range x.ch {
			seg, ok := segs[ec.to]
			if !ok {
				if failed[ec.to] {
					continue
				}
				if len(segs) >= maxEchoPeers {
					for name, s := range segs {
						e.CloseSegment(s)
						delete(segs, name)
					}
				}
				octx, cancel := context.WithTimeout(ctx, echoTimeout)
				s, err := e.OpenSegment(octx, ec.to, nil)
				cancel()
				if err != nil {
					if len(failed) < maxEchoPeers {
						failed[ec.to] = true
					}
					fmt.Fprintf(stderr, "te serve: cannot echo te bench's notifications to %s: %s\n", cli.Printable(ec.to), cli.ErrorLine(err))
					continue
				}
				seg, segs[ec.to] = s, s
			}
			nctx, cancel := context.WithTimeout(ctx, echoTimeout)
			e.Notify(nctx, seg, engine.Notify{Name: bench.EchoName, Msg: ec.msg})
			cancel()
		}
	}()
	return x
}

func (x *echoes) send(to string, msg []byte) {
	select {
	case x.ch <- echo{to, msg}:
	default:
	}
}

func (x *echoes) stop() {
	close(x.ch)
	<-x.done
}

// printNotify prints one notification; what the sender chose is quoted
// and cut to a line's worth.
func printNotify(w io.Writer, m engine.Notification) {
	msg := m.Msg
	cut := ""
	if len(msg) > 64 {
		msg, cut = msg[:64], fmt.Sprintf("... (%d bytes)", len(m.Msg))
	}
	fmt.Fprintf(w, "notify from %s epoch %#x name %q bytes %d msg %q%s\n", cli.Printable(m.From), m.FromEpoch, m.Name, m.Bytes, msg, cut)
	if f, ok := w.(*os.File); ok {
		f.Sync()
	}
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+,:@=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
