package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

func init() {
	register(command{
		name:    "perf",
		summary: "verbs benchmark like perftest: RDMA write/read/send bandwidth and latency between two devices",
		run:     runPerf,
	})
}

// perfParams are what both ends must agree on; the client sends them.
type perfParams struct {
	Op    string `json:"op"`   // write, read, send
	Test  string `json:"test"` // bw, lat
	Size  int    `json:"size"`
	Iters int    `json:"iters"`
	Depth int    `json:"depth"`  // outstanding work requests (bw)
	CQMod int    `json:"cq_mod"` // a completion every CQMod requests (bw)
	MTU   int    `json:"mtu"`    // path MTU in bytes, 0 = both ports' active MTU
	// CQ says how bandwidth tests wait for completions: "poll" busy-polls
	// (perftest's default), "event" sleeps on a completion channel after Spin
	// empty polls (perftest -e), "auto" (or empty) picks per end: event on
	// Soft-RoCE, whose "NIC" is the same CPUs a busy poller would take from
	// it, poll on hardware. Latency tests always busy-poll.
	CQ   string `json:"cq,omitempty"`
	Spin int    `json:"spin,omitempty"`
	// QPTimeout is the ACK timeout exponent (4.096 µs * 2^QPTimeout) of
	// both ends; 0 takes each end's provider default (uverbs.RCDefaults):
	// 14 (~67 ms, perftest's) on hardware, 18 (~1.07 s) on Soft-RoCE,
	// whose late-ACK retransmission races its completer.
	QPTimeout int `json:"qp_timeout,omitempty"`
	// Warmup is how many untimed requests a bandwidth test sends one at a
	// time before the measured Iters (the client sets it; a send test's
	// server receives them too).
	Warmup int `json:"warmup,omitempty"`
	// Inline: messages up to this many bytes are copied into the work
	// request instead of read through the local key; -1 (or absent): as
	// perftest, 220 bytes for write latency, 236 for send latency, else 0.
	Inline int `json:"inline,omitempty"`
}

// inlineSize is the resolved inline threshold of p.
func (p perfParams) inlineSize() int {
	switch {
	case p.Inline >= 0:
		return p.Inline
	case p.Test == "lat" && p.Op == "write":
		return 220
	case p.Test == "lat" && p.Op == "send":
		return 236
	}
	return 0
}

// perfWarmup is the bandwidth tests' warm-up: one message at a time, so the
// first traffic on a path (neighbour resolution, cold caches, on Soft-RoCE
// under qemu the first run of the kernel's protocol code) meets at most one
// request in flight. A retransmission there replays one WQE; in a 128-deep
// burst it is where rxe's retry races with its completer (the rxe
// provider's RCDefaults say more).
const perfWarmup = 16

// perfInfo is one end's connection data, exchanged over TCP as JSON lines.
type perfInfo struct {
	QPN  uint32     `json:"qpn"`
	PSN  uint32     `json:"psn"`
	GID  uverbs.GID `json:"gid"`
	MTU  uint8      `json:"mtu"`           // active MTU enum of the port
	LID  uint16     `json:"lid,omitempty"` // InfiniBand ports
	Addr uint64     `json:"addr"`
	RKey uint32     `json:"rkey"`
}

// perfResult is one run's measurement, as printed (and with -json, encoded).
type perfResult struct {
	Device  string  `json:"device"`
	Peer    string  `json:"peer"`
	Op      string  `json:"op"`
	Test    string  `json:"test"`
	Bytes   int     `json:"bytes"`
	Iters   int     `json:"iters"`
	MTU     int     `json:"mtu"`
	Seconds float64 `json:"seconds"`
	// bandwidth tests
	MBps float64 `json:"mb_per_s,omitempty"` // MiB/s, as perftest's MB/sec
	Mpps float64 `json:"mpps,omitempty"`
	// latency tests (µs; one-way for write and send: half the round trip)
	MinUS     float64 `json:"t_min_us,omitempty"`
	MaxUS     float64 `json:"t_max_us,omitempty"`
	TypicalUS float64 `json:"t_typical_us,omitempty"`
	AvgUS     float64 `json:"t_avg_us,omitempty"`
	StdevUS   float64 `json:"t_stdev_us,omitempty"`
	P99US     float64 `json:"t_p99_us,omitempty"`
	P999US    float64 `json:"t_p999_us,omitempty"`
	// PreemptPerS is how often per second the kernel switched one of the
	// process's threads out during the measured exchanges (involuntary
	// context switches; see threadPreempts), -1 where unknown.
	PreemptPerS float64 `json:"preempt_per_s,omitempty"`
}

var errPerfPeer = errors.New("peer")

func runPerf(ctx context.Context, args []string) error {
	fs := newFlags("perf")
	dev := fs.String("d", "", "local RDMA device (required), e.g. rxe0 or mlx5_0")
	gidx := fs.Int("g", -1, "local GID index (default: the first RoCE v2 IPv4 GID of port 1)")
	peerDev := fs.String("peer", "", "run both ends in this process: the other end on this device")
	peerGidx := fs.Int("peer-g", -1, "GID index on -peer's device (default as for -g)")
	server := fs.Bool("server", false, "wait for one client on -port, serve one test, exit")
	connect := fs.String("connect", "", "client: connect to a server at host[:port]")
	port := fs.Int("port", 18750, "TCP port of the out-of-band exchange")
	op := fs.String("op", "write", "operation: write, read or send")
	lat := fs.Bool("lat", false, "measure latency instead of bandwidth")
	size := fs.Int("s", 0, "message size in bytes (default 65536 for bandwidth, 8 for latency)")
	iters := fs.Int("n", 0, "iterations (default 5000 for bandwidth, 1000 for latency)")
	depth := fs.Int("t", 128, "outstanding work requests (bandwidth)")
	cqMod := fs.Int("Q", 100, "request a completion every this many work requests (bandwidth)")
	mtu := fs.Int("m", 0, "path MTU in bytes: 256..4096 (default: the ports' active MTU)")
	cqWait := fs.String("cq", "auto", "bandwidth: wait for completions by busy polling (poll), on a completion\nchannel (event), or auto: event on Soft-RoCE (rxe), poll on hardware")
	spin := fs.Int("spin", 0, "with -cq event: empty polls before sleeping")
	inline := fs.Int("I", -1, "send messages up to this size inline (default: 220 bytes for write latency, 236 for send latency, else 0)")
	warmup := fs.Int("w", perfWarmup, "bandwidth: untimed warm-up requests, one at a time, before the measured ones")
	qpTimeout := fs.Int("u", 0, "ACK timeout exponent: 4.096 us * 2^u (default: 14 on hardware, 18 on Soft-RoCE)")
	asJSON := fs.Bool("json", false, "print the result as one JSON line")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage:\n"+
			"  te perf -d DEV -peer DEV2 [flags]            both ends in this process\n"+
			"  te perf -d DEV -server [-port P]             server (one test, then exit)\n"+
			"  te perf -d DEV -connect HOST[:P] [flags]     client; it picks the test\n\n"+
			"Measures RC verbs bandwidth (-op write|read|send) or latency (-lat) the way\n"+
			"perftest's ib_{write,read,send}_{bw,lat} do, over uverbs without libibverbs.\n"+
			"MB/sec is MiB/s; write and send latency is half the measured round trip.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	p := perfParams{Op: *op, Test: "bw", Size: *size, Iters: *iters, Depth: *depth, CQMod: *cqMod, MTU: *mtu,
		CQ: *cqWait, Spin: *spin, QPTimeout: *qpTimeout, Inline: *inline}
	if *lat {
		p.Test = "lat"
	}
	p.defaults()
	if p.Test == "bw" {
		p.Warmup = min(*warmup, p.Iters)
	}
	roles := 0
	for _, b := range []bool{*peerDev != "", *server, *connect != ""} {
		if b {
			roles++
		}
	}
	if *dev == "" || roles != 1 || fs.NArg() != 0 {
		fmt.Fprintln(fs.Output(), "te perf: need -d and exactly one of -peer, -server, -connect")
		fs.Usage()
		return errUsage
	}
	if !*server { // the server learns the test from its client
		if err := p.check(); err != nil {
			fmt.Fprintln(fs.Output(), err)
			return errUsage
		}
	}
	// A missing device fails now, with the reason, not after a peer came.
	for _, d := range []string{*dev, *peerDev} {
		if d == "" {
			continue
		}
		if _, err := lookupDevice(d); err != nil {
			return err
		}
	}
	if *server {
		if err := probePerfDevice(*dev, *gidx); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var res perfResult
	var err error
	switch {
	case *peerDev != "":
		res, err = perfLocal(ctx, p, *dev, *gidx, *peerDev, *peerGidx)
	case *server:
		res, err = perfServe(ctx, *dev, *gidx, *port)
	default:
		addr := *connect
		if _, _, e := net.SplitHostPort(addr); e != nil {
			addr = net.JoinHostPort(addr, strconv.Itoa(*port))
		}
		res, err = perfConnect(ctx, p, *dev, *gidx, addr)
	}
	if err != nil {
		return err
	}
	if res.Iters == 0 { // server side of a test only the client measures
		return nil
	}
	return printPerf(os.Stdout, res, *asJSON)
}

func (p *perfParams) defaults() {
	if p.Size == 0 {
		p.Size = 65536
		if p.Test == "lat" {
			p.Size = 8
		}
	}
	if p.Iters == 0 {
		p.Iters = 5000
		if p.Test == "lat" {
			p.Iters = 1000
		}
	}
	if p.Depth == 0 {
		p.Depth = 128
	}
	if p.CQMod == 0 {
		p.CQMod = 100
	}
}

func (p perfParams) check() error {
	switch {
	case p.Op != "write" && p.Op != "read" && p.Op != "send":
		return fmt.Errorf("-op %q: want write, read or send", p.Op)
	case p.Test != "bw" && p.Test != "lat":
		return fmt.Errorf("test %q: want bw or lat", p.Test)
	case p.Size < 8 || p.Size > 1<<30:
		return fmt.Errorf("-s %d: want 8 bytes .. 1 GiB", p.Size)
	case p.Iters < 1 || p.Iters > 100_000_000:
		return fmt.Errorf("-n %d: want 1 .. 1e8", p.Iters)
	case p.Depth < 1 || p.Depth > 4096:
		return fmt.Errorf("-t %d: want 1 .. 4096", p.Depth)
	case p.CQMod < 1:
		return fmt.Errorf("-Q %d: want at least 1", p.CQMod)
	case p.CQ != "" && p.CQ != "auto" && p.CQ != "poll" && p.CQ != "event":
		return fmt.Errorf("-cq %q: want auto, poll or event", p.CQ)
	case p.Inline < -1 || p.Inline > 4096:
		return fmt.Errorf("-I %d: want 0 .. 4096", p.Inline)
	case p.Inline >= 0 && p.Op == "read" && p.Inline != 0:
		return fmt.Errorf("-I %d: RDMA READ has no inline data", p.Inline)
	case p.Warmup < 0 || p.Warmup > 1_000_000:
		return fmt.Errorf("-w %d: want 0 .. 1e6", p.Warmup)
	case p.QPTimeout < 0 || p.QPTimeout > 31:
		return fmt.Errorf("-u %d: want 1 .. 31 (0: default)", p.QPTimeout)
	case p.Spin < 0 || p.Spin > 1<<30:
		return fmt.Errorf("-spin %d: want 0 .. 2^30", p.Spin)
	case p.MTU != 0 && mtuEnum(p.MTU) == 0:
		return fmt.Errorf("-m %d: want 256, 512, 1024, 2048 or 4096", p.MTU)
	}
	return nil
}

func mtuEnum(b int) uverbs.MTU {
	for m := uverbs.MTU256; m <= uverbs.MTU4096; m++ {
		if m.Bytes() == b {
			return m
		}
	}
	return 0
}

// perfEnd is one side: its own context on its own device.
type perfEnd struct {
	name      string
	ctx       *uverbs.Context
	pd        *uverbs.PD
	ch        *uverbs.CompChannel // bandwidth tests that wait on completion events
	cq        *uverbs.CQ
	qp        *uverbs.QP
	mr        *uverbs.MR    // [0,size): the peer writes/reads here; [size,2size): local source/sink
	port      uverbs.RCPort // GID, MTU, READ depths, provider defaults
	psn       uverbs.PSN
	p         perfParams
	wc        []uverbs.WC
	recvDepth int // receive queue size
	// early counts peer messages of the send-latency test that arrived
	// before this side finished the previous exchange.
	early int
	// preemptPerS: the process's thread preemptions per second during
	// the latency loop.
	preemptPerS float64
}

func openPerfEnd(dev string, gidx int, p perfParams) (_ *perfEnd, err error) {
	e := &perfEnd{name: dev, p: p, psn: uverbs.PSN(rand.Uint32() & 0xffffff), wc: make([]uverbs.WC, 64)}
	if e.ctx, err = uverbs.Open(dev, verbsOptions); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	// The port as the RDMA transport prepares it: GID (-g, or the first
	// RoCE v2 IPv4 one), as many RDMA READs in flight as the device takes
	// (perftest does the same), the provider's ACK timeout.
	if e.port, err = e.ctx.RCPort(1, gidx); err != nil {
		return nil, err
	}
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return nil, err
	}
	soft := e.ctx.Device().DriverID == uverbs.DriverRXE
	depth := p.Depth
	e.recvDepth = depth
	if p.Op == "send" {
		// receives run out before sends do: keep plenty posted, or the sender
		// stalls on receiver-not-ready NAKs
		e.recvDepth = max(512, 2*depth)
	}
	if p.Test == "lat" {
		depth, e.recvDepth = 4, 4
	}
	cqc := uverbs.CQConfig{Entries: depth + e.recvDepth + 16}
	if p.Test == "bw" && (p.CQ == "event" || (p.CQ == "auto" || p.CQ == "") && soft) {
		if e.ch, err = e.ctx.CreateCompChannel(); err != nil {
			return nil, err
		}
		cqc.Channel, cqc.SpinPolls = e.ch, p.Spin
	}
	if e.cq, err = e.ctx.CreateCQ(cqc); err != nil {
		return nil, err
	}
	access := uverbs.AccessLocalWrite | uverbs.AccessRemoteWrite | uverbs.AccessRemoteRead
	if e.mr, err = e.pd.AllocMR(2*p.Size, access); err != nil {
		return nil, err
	}
	if e.qp, err = e.pd.CreateQP(uverbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq,
		Caps: uverbs.QPCaps{MaxSendWR: uint32(depth), MaxRecvWR: uint32(e.recvDepth), MaxSendSGE: 1, MaxRecvSGE: 1,
			MaxInlineData: uint32(p.inlineSize())}}); err != nil {
		return nil, err
	}
	if err := e.qp.ToInit(1, access); err != nil {
		return nil, err
	}
	return e, nil
}

// probePerfDevice opens dev and its port's GID the way a test will, so a
// server fails before it waits for a client.
func probePerfDevice(dev string, gidx int) error {
	c, err := uverbs.Open(dev, verbsOptions)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.RCPort(1, gidx)
	return err
}

func (e *perfEnd) info() perfInfo {
	ep := e.port.Endpoint(e.qp, e.psn)
	return perfInfo{QPN: uint32(ep.QPN), PSN: uint32(ep.PSN), GID: ep.GID, MTU: uint8(ep.MTU), LID: ep.LID,
		Addr: e.mr.Addr(), RKey: uint32(e.mr.RKey())}
}

func (e *perfEnd) connect(peer perfInfo) error {
	remote := uverbs.Endpoint{QPN: uverbs.QPN(peer.QPN), PSN: uverbs.PSN(peer.PSN), GID: peer.GID, MTU: uverbs.MTU(peer.MTU), LID: peer.LID}
	return e.port.Connect(e.qp, e.psn, remote, uverbs.ConnectConfig{MTU: mtuEnum(e.p.MTU), Timeout: uint8(e.p.QPTimeout)})
}

func (e *perfEnd) pathMTU(peer perfInfo) int {
	if e.p.MTU != 0 {
		return e.p.MTU
	}
	return min(e.port.Attr.ActiveMTU, uverbs.MTU(peer.MTU)).Bytes()
}

// Close releases everything; safe on a partly opened end.
func (e *perfEnd) Close() error {
	if e == nil || e.ctx == nil {
		return nil
	}
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
	}
	if e.ch != nil {
		errs = append(errs, e.ch.Close())
	}
	if e.mr != nil {
		errs = append(errs, e.mr.Close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	errs = append(errs, e.ctx.Close())
	return errors.Join(errs...)
}

// poll returns at least one completion, busy-polling (what perftest does) or,
// with a completion channel, sleeping on it; it fails on an error completion
// or when ctx ends.
func (e *perfEnd) poll(ctx context.Context) ([]uverbs.WC, error) {
	for spins := 0; ; spins++ {
		var n int
		var err error
		if e.ch != nil {
			n, err = e.cq.Wait(ctx, e.wc)
		} else {
			n, err = e.cq.Poll(e.wc)
		}
		if err != nil {
			return nil, err
		}
		if n > 0 {
			for i := range e.wc[:n] {
				if err := e.wc[i].Err(); err != nil {
					return nil, fmt.Errorf("%s: %w", e.name, err)
				}
			}
			return e.wc[:n], nil
		}
		if spins&0xffff == 0xffff && ctx.Err() != nil {
			return nil, fmt.Errorf("%s: waiting for completions: %w", e.name, ctx.Err())
		}
	}
}

func (e *perfEnd) postRecvs(n int) error {
	wr := []uverbs.RecvWR{{ID: 1, SGL: []uverbs.SGE{e.mr.SGE(0, e.p.Size)}}}
	for i := 0; i < n; i++ {
		if _, err := e.qp.PostRecv(wr); err != nil {
			return fmt.Errorf("%s: post_recv: %w", e.name, err)
		}
	}
	return nil
}

// ---- bandwidth --------------------------------------------------------------

// bwClient keeps Depth work requests in flight until Iters completed. Only
// every CQMod-th request (and the last) asks for a completion, as perftest
// does: a send queue completes in order, so a completion with ID k says
// requests 1..k are done.
func (e *perfEnd) bwClient(ctx context.Context, peer perfInfo) (time.Duration, error) {
	opc := map[string]uverbs.WROpcode{"write": uverbs.WRRDMAWrite, "read": uverbs.WRRDMARead, "send": uverbs.WRSend}[e.p.Op]
	mod := max(1, min(e.p.CQMod, e.p.Depth))
	wrs := make([]uverbs.SendWR, e.p.Depth)
	for i := range wrs {
		wrs[i] = uverbs.SendWR{Opcode: opc, SGL: []uverbs.SGE{e.mr.SGE(e.p.Size, e.p.Size)},
			RemoteAddr: peer.Addr, RKey: uverbs.RKey(peer.RKey)}
	}
	var inline uverbs.SendFlags
	if e.p.Size <= e.p.inlineSize() {
		inline = uverbs.SendInline
	}
	// warm-up: one signaled request at a time, untimed
	for i := 0; i < e.p.Warmup; i++ {
		wrs[0].ID, wrs[0].Flags = 0, uverbs.SendSignaled|inline
		if _, err := e.qp.PostSend(wrs[:1]); err != nil {
			return 0, fmt.Errorf("%s: post_send (warm-up): %w", e.name, err)
		}
		if _, err := e.poll(ctx); err != nil {
			return 0, fmt.Errorf("warm-up: %w", err)
		}
	}
	posted, done := 0, 0
	start := time.Now()
	for done < e.p.Iters {
		if n := min(e.p.Depth-(posted-done), e.p.Iters-posted); n > 0 {
			for i := range wrs[:n] {
				seq := posted + i + 1
				wrs[i].ID, wrs[i].Flags = uint64(seq), inline
				if seq%mod == 0 || seq == e.p.Iters {
					wrs[i].Flags |= uverbs.SendSignaled
				}
			}
			m, err := e.qp.PostSend(wrs[:n])
			posted += m
			if err != nil {
				return 0, fmt.Errorf("%s: post_send: %w", e.name, err)
			}
		}
		wc, err := e.poll(ctx)
		if err != nil {
			return 0, err
		}
		for _, w := range wc {
			done = max(done, int(w.ID))
		}
	}
	return time.Since(start), nil
}

// bwSendServer receives Warmup+Iters sends, keeping Depth receives posted.
func (e *perfEnd) bwSendServer(ctx context.Context) error {
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

// ---- latency ------------------------------------------------------------------

// The write-latency ping-pong marks each message with its iteration number in
// the last four bytes; each side spins on its own buffer for the peer's mark.
func (e *perfEnd) markOff() int { return (e.p.Size - 4) &^ 3 }

func (e *perfEnd) waitMark(ctx context.Context, i uint32) error {
	buf, off := e.mr.Bytes(), e.markOff()
	for spins := 0; dma.LoadAcquire32(buf, off) != i; spins++ {
		if spins&0xfffff == 0xfffff && ctx.Err() != nil {
			return fmt.Errorf("%s: waiting for message %d: %w", e.name, i, ctx.Err())
		}
	}
	return nil
}

// latStep runs one exchange of the latency test; client says who starts.
func (e *perfEnd) latStep(ctx context.Context, peer perfInfo, i uint32, client bool, wr []uverbs.SendWR) error {
	src := e.mr.Bytes()[e.p.Size:]
	switch e.p.Op {
	case "read": // the client reads, the server is passive
		if _, err := e.qp.PostSend(wr); err != nil {
			return err
		}
		_, err := e.poll(ctx)
		return err
	case "write":
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
func (e *perfEnd) latRun(ctx context.Context, peer perfInfo, client bool) ([]time.Duration, error) {
	opc := map[string]uverbs.WROpcode{"write": uverbs.WRRDMAWrite, "read": uverbs.WRRDMARead, "send": uverbs.WRSend}[e.p.Op]
	wr := []uverbs.SendWR{{ID: 2, Opcode: opc, Flags: uverbs.SendSignaled,
		SGL: []uverbs.SGE{e.mr.SGE(e.p.Size, e.p.Size)}, RemoteAddr: peer.Addr, RKey: uverbs.RKey(peer.RKey)}}
	if e.p.Op == "write" {
		// the mark lands in the last word of the peer's buffer [0,size)
		wr[0].SGL[0] = e.mr.SGE(e.p.Size, e.markOff()+4)
	}
	if e.p.Size <= e.p.inlineSize() {
		wr[0].Flags |= uverbs.SendInline
	}
	if e.p.Op == "send" {
		if err := e.postRecvs(2); err != nil {
			return nil, err
		}
	}
	if e.p.Op == "read" && !client {
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
		if err := e.latStep(ctx, peer, uint32(i+1), client, wr); err != nil {
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

// ---- roles ----------------------------------------------------------------------

// serveSide runs the server's part of the test (nothing for one-sided bandwidth).
func (e *perfEnd) serveSide(ctx context.Context, peer perfInfo) error {
	switch {
	case e.p.Test == "bw" && e.p.Op == "send":
		return e.bwSendServer(ctx)
	case e.p.Test == "lat":
		_, err := e.latRun(ctx, peer, false)
		return err
	}
	return nil
}

func (e *perfEnd) clientSide(ctx context.Context, peer perfInfo, peerName string) (perfResult, error) {
	r := perfResult{Device: e.name, Peer: peerName, Op: e.p.Op, Test: e.p.Test, Bytes: e.p.Size,
		Iters: e.p.Iters, MTU: e.pathMTU(peer)}
	if e.p.Test == "bw" {
		d, err := e.bwClient(ctx, peer)
		if err != nil {
			return r, err
		}
		r.Seconds = d.Seconds()
		r.MBps = float64(e.p.Size) * float64(e.p.Iters) / d.Seconds() / (1 << 20)
		r.Mpps = float64(e.p.Iters) / d.Seconds() / 1e6
		return r, nil
	}
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
	if e.p.Op == "read" {
		div = 1
	}
	latStats(&r, times, div)
	r.PreemptPerS = e.preemptPerS
	return r, nil
}

func latStats(r *perfResult, times []time.Duration, div float64) {
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
	pct := func(p float64) float64 { return us[min(len(us)-1, int(math.Ceil(p*float64(len(us))))-1)] }
	r.MinUS, r.MaxUS, r.TypicalUS, r.AvgUS = us[0], us[len(us)-1], us[len(us)/2], avg
	r.StdevUS = math.Sqrt(sq / float64(len(us)))
	r.P99US, r.P999US = pct(0.99), pct(0.999)
}

// perfLocal runs both ends in this process: the client on dev, the server on peer.
func perfLocal(ctx context.Context, p perfParams, dev string, gidx int, peerDev string, peerGidx int) (perfResult, error) {
	cli, err := openPerfEnd(dev, gidx, p)
	if err != nil {
		return perfResult{}, err
	}
	defer cli.Close()
	srv, err := openPerfEnd(peerDev, peerGidx, p)
	if err != nil {
		return perfResult{}, err
	}
	defer srv.Close()
	ci, si := cli.info(), srv.info()
	if err := srv.connect(ci); err != nil {
		return perfResult{}, err
	}
	if err := cli.connect(si); err != nil {
		return perfResult{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srvErr := make(chan error, 1)
	go func() {
		err := srv.serveSide(ctx, ci)
		if err != nil {
			cancel() // unblock the client
		}
		srvErr <- err
	}()
	res, err := cli.clientSide(ctx, si, peerDev)
	if err != nil {
		cancel()
		if e := <-srvErr; e != nil {
			return res, errors.Join(err, e)
		}
		return res, err
	}
	return res, <-srvErr
}

type perfHello struct {
	Params perfParams `json:"params"`
	Info   perfInfo   `json:"info"`
	Device string     `json:"device"`
}

type perfReply struct {
	Info   perfInfo `json:"info"`
	Device string   `json:"device"`
	Error  string   `json:"error,omitempty"`
}

func perfServe(ctx context.Context, dev string, gidx, port int) (perfResult, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return perfResult{}, err
	}
	defer ln.Close()
	go func() { <-ctx.Done(); ln.Close() }()
	fmt.Fprintf(os.Stderr, "te perf: %s waiting on %s\n", dev, ln.Addr())
	conn, err := ln.Accept()
	if err != nil {
		return perfResult{}, fmt.Errorf("accept: %w", err)
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	rd := bufio.NewReader(conn)
	var hello perfHello
	if err := readJSONLine(rd, &hello); err != nil {
		return perfResult{}, err
	}
	p := hello.Params
	if err := p.check(); err != nil { // bytes from the network: check before use
		json.NewEncoder(conn).Encode(perfReply{Error: err.Error()})
		return perfResult{}, err
	}
	e, err := openPerfEnd(dev, gidx, p)
	if err == nil {
		err = e.connect(hello.Info)
	}
	if err != nil {
		json.NewEncoder(conn).Encode(perfReply{Error: err.Error()})
		e.Close()
		return perfResult{}, err
	}
	defer e.Close()
	if err := json.NewEncoder(conn).Encode(perfReply{Info: e.info(), Device: dev}); err != nil {
		return perfResult{}, err
	}
	if err := e.serveSide(ctx, hello.Info); err != nil {
		return perfResult{}, err
	}
	// the client says when it is done with our memory
	var done perfReply
	if err := readJSONLine(rd, &done); err != nil {
		return perfResult{}, err
	}
	if done.Error != "" {
		return perfResult{}, fmt.Errorf("%w %s: %s", errPerfPeer, hello.Device, done.Error)
	}
	fmt.Fprintf(os.Stderr, "te perf: served %s %s from %s\n", p.Op, p.Test, hello.Device)
	return perfResult{}, nil
}

func perfConnect(ctx context.Context, p perfParams, dev string, gidx int, addr string) (perfResult, error) {
	e, err := openPerfEnd(dev, gidx, p)
	if err != nil {
		return perfResult{}, err
	}
	defer e.Close()
	var d net.Dialer
	var conn net.Conn
	for { // the server may still be starting
		if conn, err = d.DialContext(ctx, "tcp", addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return perfResult{}, fmt.Errorf("connect %s: %w", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	if err := json.NewEncoder(conn).Encode(perfHello{Params: p, Info: e.info(), Device: dev}); err != nil {
		return perfResult{}, err
	}
	var rep perfReply
	if err := readJSONLine(bufio.NewReader(conn), &rep); err != nil {
		return perfResult{}, err
	}
	if rep.Error != "" {
		return perfResult{}, fmt.Errorf("%w at %s: %s", errPerfPeer, addr, rep.Error)
	}
	if err := e.connect(rep.Info); err != nil {
		return perfResult{}, err
	}
	res, err := e.clientSide(ctx, rep.Info, rep.Device)
	var fin perfReply
	if err != nil {
		fin.Error = err.Error()
	}
	json.NewEncoder(conn).Encode(fin)
	return res, err
}

// readJSONLine decodes one newline-terminated JSON value of at most 64 KiB.
func readJSONLine(rd *bufio.Reader, v any) error {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("%w sent an over-long message", errPerfPeer)
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w closed the connection", errPerfPeer)
		}
		return err
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("%w sent a malformed message: %v", errPerfPeer, err)
	}
	return nil
}

func printPerf(w io.Writer, r perfResult, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	name := map[string]string{"write": "RDMA Write", "read": "RDMA Read", "send": "Send"}[r.Op]
	kind := map[string]string{"bw": "BW", "lat": "Latency"}[r.Test]
	fmt.Fprintf(w, "te perf: %s %s test, %s -> %s, path MTU %d\n", name, kind, r.Device, r.Peer, r.MTU)
	if r.Test == "bw" {
		fmt.Fprintf(w, " %-10s %-12s %-20s %s\n", "#bytes", "#iterations", "BW average[MB/sec]", "MsgRate[Mpps]")
		fmt.Fprintf(w, " %-10d %-12d %-20.2f %.6f\n", r.Bytes, r.Iters, r.MBps, r.Mpps)
		return nil
	}
	fmt.Fprintf(w, " %-8s %-12s %-12s %-12s %-16s %-12s %-14s %-16s %s\n", "#bytes", "#iterations", "t_min[usec]",
		"t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile", "99.9% percentile")
	fmt.Fprintf(w, " %-8d %-12d %-12.2f %-12.2f %-16.2f %-12.2f %-14.2f %-16.2f %.2f\n", r.Bytes, r.Iters,
		r.MinUS, r.MaxUS, r.TypicalUS, r.AvgUS, r.StdevUS, r.P99US, r.P999US)
	if r.PreemptPerS > 0 {
		fmt.Fprintf(w, " threads preempted %.0f times/s (involuntary context switches)\n", r.PreemptPerS)
	}
	return nil
}
