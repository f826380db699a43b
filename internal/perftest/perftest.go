// Package perftest measures RC verbs bandwidth and latency the way
// rdma-core's perftest (ib_{write,read,send}_{bw,lat}) does, over uverbs
// without libibverbs: both ends in one process (Local), or a server and a
// client process that agree on the test over TCP (Serve, Connect). The
// TCP exchange speaks perftest's own out-of-band format first, so a te
// client runs against an ib_write_bw/ib_read_bw server and a te server
// serves their clients (PerftestPeer says what works across tools).
package perftest

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmago/te/uverbs"
)

// Ops and tests.
const (
	OpWrite = "write"
	OpRead  = "read"
	OpSend  = "send"

	TestBW  = "bw"
	TestLat = "lat"
)

// Params are what both ends must agree on; a te client sends them to a
// te server, a perftest peer takes the same values from its own flags.
type Params struct {
	Op    string `json:"op"`   // write, read, send
	Test  string `json:"test"` // bw, lat
	Size  int    `json:"size"`
	Iters int    `json:"iters"`
	// Duration, when set, runs a bandwidth test for this long instead of
	// Iters requests (perftest -D).
	Duration time.Duration `json:"duration,omitempty"`
	Depth    int           `json:"depth"`  // outstanding work requests (bw)
	CQMod    int           `json:"cq_mod"` // a completion every CQMod requests (bw)
	MTU      int           `json:"mtu"`    // path MTU in bytes, 0 = both ports' active MTU
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
	// Region is the size of each half of the memory region when larger
	// than Size: a perftest peer with -a, or one that cycles its remote
	// address through its page-sized cycle buffer, reaches that far.
	Region int `json:"region,omitempty"`
}

// DefaultWarmup is the bandwidth tests' warm-up: one message at a time, so
// the first traffic on a path (neighbour resolution, cold caches, on
// Soft-RoCE under qemu the first run of the kernel's protocol code) meets
// at most one request in flight. A retransmission there replays one WQE;
// in a 128-deep burst it is where rxe's retry races with its completer
// (the rxe provider's RCDefaults say more).
const DefaultWarmup = 16

// MaxAllSize is the largest size of perftest's -a sweep (2^23).
const MaxAllSize = 1 << 23

// AllSizes are the sizes perftest's -a runs: powers of two from 2 bytes
// (8 for latency tests, whose marks take the last four) to 8 MiB.
func AllSizes(test string) []int {
	var out []int
	s := 2
	if test == TestLat {
		s = 8
	}
	for ; s <= MaxAllSize; s *= 2 {
		out = append(out, s)
	}
	return out
}

// InlineSize is the resolved inline threshold of p.
func (p Params) InlineSize() int {
	switch {
	case p.Inline >= 0:
		return p.Inline
	case p.Test == TestLat && p.Op == OpWrite:
		return 220
	case p.Test == TestLat && p.Op == OpSend:
		return 236
	}
	return 0
}

// Defaults fills what is zero with perftest's defaults.
func (p *Params) Defaults() {
	if p.Size == 0 {
		p.Size = 65536
		if p.Test == TestLat {
			p.Size = 8
		}
	}
	if p.Iters == 0 {
		p.Iters = 5000
		if p.Test == TestLat {
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

// Check validates p, which may come from the network; messages name the
// te perf flag.
func (p Params) Check() error {
	minSize := 1
	if p.Test == TestLat {
		minSize = 8
	}
	switch {
	case p.Op != OpWrite && p.Op != OpRead && p.Op != OpSend:
		return fmt.Errorf("--op %q: want write, read or send", p.Op)
	case p.Test != TestBW && p.Test != TestLat:
		return fmt.Errorf("test %q: want bw or lat", p.Test)
	case p.Size < minSize || p.Size > 1<<30:
		return fmt.Errorf("-s %d: want %d bytes .. 1 GiB", p.Size, minSize)
	case p.Iters < 1 || p.Iters > 100_000_000:
		return fmt.Errorf("-n %d: want 1 .. 1e8", p.Iters)
	case p.Duration < 0 || p.Duration > 24*time.Hour:
		return fmt.Errorf("-D %v: want 1 s .. 24 h", p.Duration)
	case p.Duration > 0 && p.Test == TestLat:
		return errors.New("-D: te perf runs latency tests for -n iterations only")
	case p.Duration > 0 && p.Op == OpSend:
		return errors.New("-D: te perf's send server counts -n messages; give -n instead")
	case p.Depth < 1 || p.Depth > 4096:
		return fmt.Errorf("-t %d: want 1 .. 4096", p.Depth)
	case p.CQMod < 1:
		return fmt.Errorf("-Q %d: want at least 1", p.CQMod)
	case p.CQ != "" && p.CQ != "auto" && p.CQ != "poll" && p.CQ != "event":
		return fmt.Errorf("--cq %q: want auto, poll or event", p.CQ)
	case p.Inline < -1 || p.Inline > 4096:
		return fmt.Errorf("-I %d: want 0 .. 4096", p.Inline)
	case p.Inline >= 0 && p.Op == OpRead && p.Inline != 0:
		return fmt.Errorf("-I %d: RDMA READ has no inline data", p.Inline)
	case p.Warmup < 0 || p.Warmup > 1_000_000:
		return fmt.Errorf("--warmup %d: want 0 .. 1e6", p.Warmup)
	case p.QPTimeout < 0 || p.QPTimeout > 31:
		return fmt.Errorf("-u %d: want 1 .. 31 (0: default)", p.QPTimeout)
	case p.Spin < 0 || p.Spin > 1<<30:
		return fmt.Errorf("--spin %d: want 0 .. 2^30", p.Spin)
	case p.MTU != 0 && MTUEnum(p.MTU) == 0:
		return fmt.Errorf("-m %d: want 256, 512, 1024, 2048 or 4096", p.MTU)
	case p.Region < 0 || p.Region > 1<<30:
		return fmt.Errorf("region %d: want 0 .. 1 GiB", p.Region)
	}
	return nil
}

// MTUEnum is the verbs MTU of b bytes, or 0.
func MTUEnum(b int) uverbs.MTU {
	for m := uverbs.MTU256; m <= uverbs.MTU4096; m++ {
		if m.Bytes() == b {
			return m
		}
	}
	return 0
}

// Device is one end's RDMA device: perftest's -d, -i and -x.
type Device struct {
	Name     string
	Port     int // IB port, 1 when 0
	GIDIndex int // -1: the first RoCE v2 IPv4 GID of the port (index 0 on InfiniBand)
}

// Result is one run's measurement.
type Result struct {
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

// Gbps is the bandwidth in Gb/s (10^9 bits), as perftest --report_gbits.
func (r Result) Gbps() float64 { return r.MBps * (1 << 20) * 8 / 1e9 }

// ErrPeer marks errors that the peer caused or reported.
var ErrPeer = errors.New("peer")
