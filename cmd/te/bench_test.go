package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/bench"
	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/test/consul/consulagent"
)

func benchCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestBenchInProcess(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := runBench(benchCtx(t), []string{"--operation", op, "--duration", "300ms", "--block-size", "4KiB",
				"--batch-size", "16", "--threads", "2", "--verify", "--baseline", "--buffer-size", "1MiB"}, &out, &errb)
			if err != nil {
				t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
			}
			t.Logf("stdout:\n%s", out.String())
			for _, want := range []string{"in-process target", "block 4KiB, batch 16, threads 2", "result: " + op + " 4KiB over tcp:", "result: " + op + " 4KiB over shm:", "req/s", "p50", "p99", "moved in", "verify: true", "engine/baseline"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if strings.Contains(out.String(), " 0.00 GB moved") {
				t.Error("no bytes moved")
			}
		})
	}
}

func TestBenchJSON(t *testing.T) {
	var out, errb bytes.Buffer
	err := runBench(benchCtx(t), []string{"--json", "--protocol", "shm", "--duration", "1", "--block-size", "64KiB", "--batch-size", "8", "--verify", "--report-unit", "MiB", "--operation", "read"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
	}
	rs := decodeReport[benchResult](t, "bench", out.Bytes())
	if len(rs) != 1 {
		t.Fatalf("%d results, want 1:\n%s", len(rs), out.String())
	}
	r := rs[0]
	if r.Operation != "read" || r.BlockSize != 64<<10 || r.BatchSize != 8 || !r.InProcess {
		t.Errorf("config echoed wrongly: %+v", r)
	}
	if r.Bytes == 0 || r.Batches == 0 || r.Requests != r.Batches*8 || r.Bytes != r.Requests*(64<<10) {
		t.Errorf("counts disagree: %d bytes, %d batches, %d requests", r.Bytes, r.Batches, r.Requests)
	}
	if r.GBps <= 0 || r.OpsPerSec <= 0 || r.P50Micros <= 0 || r.P99Micros < r.P50Micros || r.MaxMicros < r.P99Micros {
		t.Errorf("implausible numbers: %+v", r)
	}
	if r.Verified == nil || !*r.Verified {
		t.Errorf("verified = %v", r.Verified)
	}
	// JSON mode keeps stdout clean: the config and progress go to stderr.
	if !strings.Contains(errb.String(), "te bench:") {
		t.Errorf("stderr lacks the config/progress lines:\n%s", errb.String())
	}
}

func TestBenchSweep(t *testing.T) {
	var out, errb bytes.Buffer
	err := runBench(benchCtx(t), []string{"--sweep", "--protocol", "tcp", "--baseline", "--json", "--quiet", "--duration", "150ms", "--batch-size", "4"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
	}
	rs := decodeReport[benchResult](t, "bench", out.Bytes())
	var got []string
	for _, r := range rs {
		got = append(got, r.Operation+" "+cli.FormatSize(r.BlockSize))
		if r.Bytes == 0 || r.Baseline == nil || r.Baseline.Bytes == 0 || r.VsBaseline <= 0 {
			t.Errorf("%s %d: %+v", r.Operation, r.BlockSize, r)
		}
	}
	want := []string{"write 4KiB", "read 4KiB", "write 64KiB", "read 64KiB", "write 1MiB", "read 1MiB"}
	if !slices.Equal(got, want) {
		t.Fatalf("sweep measured %v, want %v", got, want)
	}
	// And the Markdown table the README takes.
	out.Reset()
	if err := runBench(benchCtx(t), []string{"--sweep", "--quiet", "--duration", "100ms", "--batch-size", "2"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n| "); n != 7 {
		t.Fatalf("table has %d rows, want header + 6:\n%s", n, out.String())
	}
	t.Logf("\n%s", out.String())
}

// TestBenchLatency: --latency measures one request at a time on tcp and
// shm, taking turns: JSON carries each protocol's latency quantiles in
// order, and --sweep prints the table.
func TestBenchLatency(t *testing.T) {
	var out, errb bytes.Buffer
	err := runBench(benchCtx(t), []string{"--latency", "--json", "--quiet", "--duration", "300ms", "--block-size", "4KiB"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
	}
	rs := decodeReport[benchResult](t, "bench", out.Bytes())
	var got []string
	for _, r := range rs {
		got = append(got, r.Protocol)
		l := r.Latency
		if r.BatchSize != 1 || l == nil || r.Requests == 0 || !(0 < l.P50 && l.P50 <= l.P99 && l.P99 <= l.Max) || r.Memcpy != nil {
			t.Errorf("%s: batch %d, %d requests, latency %+v, memcpy %v", r.Protocol, r.BatchSize, r.Requests, l, r.Memcpy)
		}
	}
	if !slices.Equal(got, []string{"tcp", "shm"}) {
		t.Fatalf("measured %v, want tcp and shm", got)
	}
	out.Reset()
	if err := runBench(benchCtx(t), []string{"--latency", "--sweep", "--quiet", "--duration", "100ms"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n| "); n != 7 || !strings.Contains(out.String(), "shm p99") {
		t.Fatalf("table has %d rows, want header + 6, with shm p99:\n%s", n, out.String())
	}
	t.Logf("\n%s", out.String())
}

func TestBenchCancel(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var out, errb bytes.Buffer
	start := time.Now()
	err := runBench(ctx, []string{"--duration", "1m", "--quiet", "--batch-size", "8"}, &out, &errb)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("bench = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("cancel took %v", d)
	}
}

// The per-batch loop adds no allocations of its own over te bench's real
// transports: what one batch costs is what the engine and transport cost.
func TestBenchLoopAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ctx := benchCtx(t)
	c := &benchConfig{Protocol: "tcp,shm", Protocols: []string{"tcp", "shm"}, protoSet: true, BlockSize: 4096, BatchSize: 32, Threads: 1, Metadata: "p2p://127.0.0.1:0"}
	env, err := setupBench(ctx, c, 1<<20, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, proto := range c.Protocols {
		bc := env.config("write", 4096)
		l := bench.NewLoop(&env.Env, &bc, 0, proto)
		for range 10 {
			if err := l.Step(ctx); err != nil {
				t.Fatal(err)
			}
		}
		allocs := enginetest.AllocsPerRun(200, func() {
			if err := l.Step(ctx); err != nil {
				t.Fatal(err)
			}
		})
		t.Logf("allocations per batch of %d requests (engine + %s + loop): %.2f", c.BatchSize, proto, allocs)
		if allocs > 0 {
			t.Errorf("one batch over %s allocates %.2f times; the loop itself allocates nothing, so engine or %s does", proto, allocs, proto)
		}
	}
}

// TestBenchSideBySide: with no protocol flag, te bench measures tcp and
// shm taking turns, and a single-thread memcpy beside shm, and prints the
// ratios.
func TestBenchSideBySide(t *testing.T) {
	var out, errb bytes.Buffer
	err := runBench(benchCtx(t), []string{"--duration", "2", "--batch-size", "8", "--verify"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
	}
	t.Logf("stdout:\n%s", out.String())
	for _, want := range []string{"over tcp and shm", "result: write 64KiB over tcp:", "result: write 64KiB over shm:", "compare: shm/tcp", "memcpy: one thread", "shm/memcpy", "verify: true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !strings.Contains(errb.String(), "round 2/2") { // 2s shared by tcp, shm and memcpy: two rounds of 333ms turns
		t.Errorf("the protocols did not take turns in rounds:\n%s", errb.String())
	}
	out.Reset()
	if err := runBench(benchCtx(t), []string{"--sweep", "--quiet", "--duration", "100ms", "--batch-size", "2"}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n| "); n != 7 || !strings.Contains(out.String(), "| shm/memcpy") {
		t.Fatalf("table has %d rows, want header + 6, with shm/memcpy:\n%s", n, out.String())
	}
	t.Logf("\n%s", out.String())
}

// The tests below run the real binary (cli_test.go builds it).

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"bench", "--block-size", "0"}, "--block-size 0B: want 1 byte to 1GiB"},
		{[]string{"bench", "--block-size", "lots"}, "--block-size lots: not a size"},
		{[]string{"bench", "--operation", "copy"}, `--operation copy: not one of read, write`},
		{[]string{"bench", "--protocol", "udp"}, "--protocol udp: udp is not one of tcp, shm, rdma"},
		{[]string{"bench", "--threads", "-1"}, "--threads -1"},
		{[]string{"bench", "--batch-size", "0"}, "--batch-size 0"},
		{[]string{"bench", "--latency", "--batch-size", "8"}, "--latency measures single requests: leave out --batch-size 8"},
		{[]string{"bench", "--duration", "soon"}, "--duration soon: not a duration"},
		{[]string{"bench", "--report-unit", "furlong"}, "--report-unit furlong: not one of GB"},
		{[]string{"bench", "--bogus"}, "unknown flag --bogus"},
		{[]string{"bench", "extra"}, `unexpected arguments "extra"`},
		{[]string{"serve", "--buffer-size", "0"}, "--buffer-size must be positive"},
		{[]string{"serve", "--protocol", "carrier-pigeon"}, "is not one of tcp, shm, rdma"},
		{[]string{"bench", "--duration", "NaN"}, "want a positive number of seconds"},
		{[]string{"bench", "--duration", "-3"}, "want a positive number of seconds"},
		{[]string{"bench", "--duration", "Inf"}, "want a positive number of seconds"},
		{[]string{"segments", "--timeout", "-1s", "127.0.0.1:1"}, "--timeout -1s: want a positive duration"},
		{[]string{"segments", "--timeout", "0s", "127.0.0.1:1"}, "--timeout 0s: want a positive duration"},
		{[]string{"segments", "--metadata", "p2p"}, "the p2p store has no server to list: name the peers"},
		{[]string{"segments", "--bogus"}, "unknown flag --bogus"},
	} {
		_, stderr, code := runTE(t, c.args...)
		if code != 2 || !strings.Contains(stderr, c.msg) {
			t.Errorf("te %v: exit %d, stderr:\n%s\nwant exit 2 and %q", c.args, code, stderr, c.msg)
		}
	}
}

// TestBadListenAddress: a p2p address that cannot be listened on is a
// clear error naming the cause, exit 1, never a panic.
func TestBadListenAddress(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct{ metadata, want string }{
		{"p2p://" + busy.Addr().String(), "address already in use"},
		{"p2p://garbage", "garbage"},
		{"p2p://127.0.0.1:99999", "invalid port"},
		{"p2p://192.0.2.1:0", "cannot assign requested address"}, // TEST-NET-1: not on this host
	} {
		for _, cmd := range []string{"serve", "bench"} {
			args := []string{cmd, "--metadata", c.metadata}
			if cmd == "bench" {
				args = append(args, "--duration", "1")
			}
			_, stderr, code := runTE(t, args...)
			if code != 1 || !strings.Contains(stderr, c.want) || strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine") {
				t.Errorf("te %v: exit %d, stderr:\n%s\nwant exit 1 with %q and no panic", args, code, stderr, c.want)
			}
		}
	}
}

func TestBenchUnreachableSegment(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	_, stderr, code := runTE(t, "bench", "--segment", dead, "--duration", "1")
	if code != 1 || !strings.Contains(stderr, "unavailable") || !strings.Contains(stderr, dead) {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 naming the unreachable segment", code, stderr)
	}
}

// serveProcess starts te serve and returns its segment name.
func serveProcess(t *testing.T, args ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(teBinary(t), append([]string{"serve"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case line, ok := <-lines:
		name, found := strings.CutPrefix(line, "segment ")
		if !ok || !found {
			t.Fatalf("te serve printed %q; stderr:\n%s", line, stderr.String())
		}
		return cmd, name, &stderr
	case <-time.After(30 * time.Second):
		t.Fatalf("te serve printed no segment name; stderr:\n%s", stderr.String())
	}
	return nil, "", nil
}

func TestServeAndBench(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "64MiB")
	t.Logf("te serve: segment %s", name)
	for _, op := range []string{"write", "read"} {
		stdout, stderr, code := runTE(t, "bench", "--segment", name, "--operation", op, "--duration", "1",
			"--batch-size", "32", "--threads", "2", "--verify", "--json")
		if code != 0 {
			t.Fatalf("te bench %s: exit %d\n%s", op, code, stderr)
		}
		// te serve runs on this host: tcp and shm, taking turns.
		rs := decodeReport[benchResult](t, "bench", []byte(stdout))
		if len(rs) != 2 || rs[0].Protocol != "tcp" || rs[1].Protocol != "shm" {
			t.Fatalf("%s against te serve measured %d results, want tcp and shm:\n%s", op, len(rs), stdout)
		}
		for _, r := range rs {
			if r.InProcess || r.Segment != name || r.Bytes == 0 || r.Verified == nil || !*r.Verified {
				t.Fatalf("%s over %s against te serve: %+v", op, r.Protocol, r)
			}
			t.Logf("%s over %s: %.2f GB/s, %d bytes", op, r.Protocol, r.GBps, r.Bytes)
		}
		if rs[1].Memcpy == nil || rs[1].VsTCP <= 0 {
			t.Fatalf("shm result lacks the memcpy and tcp comparisons: %+v", rs[1])
		}
	}
	// Too small a target is a clear error, not a crash.
	_, stderr, code := runTE(t, "bench", "--segment", name, "--block-size", "1MiB", "--batch-size", "128", "--duration", "1")
	if code != 1 || !strings.Contains(stderr, "exposes no buffer") {
		t.Fatalf("oversized bench: exit %d\n%s", code, stderr)
	}
	// SIGTERM stops te serve cleanly.
	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("te serve after SIGTERM: %v\n%s", err, srvErr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("te serve did not stop after SIGTERM\n%s", srvErr.String())
	}
	if !strings.Contains(srvErr.String(), "stopping") {
		t.Errorf("te serve stderr:\n%s", srvErr.String())
	}
}

// With Consul metadata and no --segment, both in-process engines publish to
// and resolve through the real agent under distinct names.
func TestBenchInProcessConsul(t *testing.T) {
	a := consulagent.Start(t)
	var out, errb bytes.Buffer
	err := runBench(benchCtx(t), []string{"--metadata", a.URI("te-bench-test"), "--duration", "300ms",
		"--batch-size", "8", "--verify", "--json", "--quiet"}, &out, &errb)
	if err != nil {
		t.Fatalf("bench: %v\nstderr:\n%s", err, errb.String())
	}
	rs := decodeReport[benchResult](t, "bench", out.Bytes())
	if len(rs) != 2 {
		t.Fatalf("%d results, want tcp and shm:\n%s", len(rs), out.String())
	}
	for _, r := range rs {
		if !strings.HasPrefix(r.Segment, "te-bench/") || !strings.HasSuffix(r.Segment, "/target") || r.Bytes == 0 || r.Verified == nil || !*r.Verified {
			t.Fatalf("result %+v", r)
		}
	}
}

// A target stopped (SIGTERM) or killed mid-run fails the bench promptly
// with one line that says the target stopped, over tcp and over shm: not
// an out-of-range or a bare connection error. The target is stopped once
// the bench has printed its header (its segment open, measuring).
func TestBenchTargetDies(t *testing.T) {
	for _, proto := range []string{"tcp", "shm"} {
		for _, sig := range []os.Signal{syscall.SIGTERM, os.Kill} {
			srv, name, _ := serveProcess(t, "--buffer-size", "16MiB", "--protocol", proto)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			bench := exec.CommandContext(ctx, teBinary(t), "bench", "--segment", name, "--protocol", proto, "--duration", "30", "--batch-size", "16")
			stdout, err := bench.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			bench.Stderr = &stderr
			if err := bench.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(stdout)
			for sc.Scan() && !strings.HasPrefix(sc.Text(), "te bench: block ") {
			}
			start := time.Now()
			srv.Process.Signal(sig)
			io.Copy(io.Discard, stdout)
			bench.Wait()
			cancel()
			code := bench.ProcessState.ExitCode()
			msg := strings.TrimSpace(stderr.String())
			if code != 1 || !strings.HasPrefix(msg, "te bench: ") || strings.Contains(msg, "\n") ||
				!strings.HasSuffix(msg, "(the target stopped or restarted)") || strings.Contains(msg, "outside exposed buffers") {
				t.Errorf("%s, target sent %v: exit %d, stderr:\n%s\nwant exit 1 and one line saying the target stopped", proto, sig, code, msg)
			}
			if d := time.Since(start); d > 25*time.Second {
				t.Errorf("%s, target sent %v: bench took %v to notice", proto, sig, d)
			}
			t.Logf("%s, %v, after %v: %s", proto, sig, time.Since(start).Round(time.Millisecond), msg)
			srv.Wait()
		}
	}
}

// Every command reads --metadata through the same two functions: the
// default comes from $TE_METADATA, and Mooncake's spellings of the
// embedded store all mean a store on loopback: te's p2p, or Mooncake's
// handshake socket when te speaks Mooncake's wire only.
func TestMetadataFlag(t *testing.T) {
	for _, v := range []string{"", "p2p", "P2P", "p2phandshake", "P2PHANDSHAKE", "p2p://"} {
		if got := metadataURI(v, false); got != "p2p://127.0.0.1:0" {
			t.Errorf("metadataURI(%q) = %q", v, got)
		}
		if got := metadataURI(v, true); got != "p2phandshake://127.0.0.1:0" {
			t.Errorf("metadataURI(%q, mooncake) = %q", v, got)
		}
	}
	for _, v := range []string{"consul://127.0.0.1:8500/te", "p2p://0.0.0.0?ports=15000-17000", "http://127.0.0.1:8080/metadata"} {
		if got := metadataURI(v, true); got != v {
			t.Errorf("metadataURI(%q) = %q, want it unchanged", v, got)
		}
	}
	t.Setenv("TE_METADATA", "")
	if got := defaultMetadata(); got != "p2p" {
		t.Errorf("default without $TE_METADATA = %q", got)
	}
	t.Setenv("TE_METADATA", "consul://h:1/x")
	if got := defaultMetadata(); got != "consul://h:1/x" {
		t.Errorf("default with $TE_METADATA = %q", got)
	}
}

// TestBenchStuckAfter: te bench's initiator reports a task stuck after the
// engine's 30 s, or after its whole footprint in flight would take at a
// slow 50 MB/s when that is longer (--threads 1000 at the defaults keeps
// 8000MiB in flight: a task waits its turn for minutes in the warm-up).
func TestBenchStuckAfter(t *testing.T) {
	for _, c := range []struct {
		footprint int64
		min, max  time.Duration
	}{
		{64 << 10 * 128, engine.DefaultStuckAfter, engine.DefaultStuckAfter},
		{1000 * 128 * 64 << 10, 160 * time.Second, 180 * time.Second},
	} {
		if got := stuckAfter(c.footprint); got < c.min || got > c.max {
			t.Errorf("stuckAfter(%d) = %v, want %v to %v", c.footprint, got, c.min, c.max)
		}
	}
}

// TestWarnOverrun: a configuration that measured well past --duration
// says so, whether one protocol overran its share or each part overran a
// little (tcp 0.9 s, shm 0.6 s and memcpy 0.7 s of a 1 s duration, as a
// run at load measured, once went unsaid); one within bounds says
// nothing.
func TestWarnOverrun(t *testing.T) {
	c, err := parseBench([]string{"--threads", "1000", "--duration", "1s", "--block-size", "4KiB", "--batch-size", "4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	bc := bench.Config{Op: parseOp("write"), Block: 4096, Batch: 4, Threads: 1000, Duration: time.Second, Protocols: []string{"tcp", "shm"}, Memcpy: true}
	res := func(tcp, shm, memcpy float64) []*benchResult {
		return []*benchResult{{Protocol: "tcp", Seconds: tcp}, {Protocol: "shm", Seconds: shm, Memcpy: &bench.Ceiling{Seconds: memcpy}}}
	}
	for _, tc := range []struct {
		name string
		rs   []*benchResult
		want []string // lines' substrings, in order; none: silent
	}{
		{"within", res(0.4, 0.4, 0.35), nil},
		{"parts", res(0.9, 0.6, 0.68), []string{"write 4KiB measured 2.2s in all (tcp 0.9s, shm 0.6s, memcpy 0.7s), not its 1s"}},
		{"one", res(1.5, 0.4, 0.35), []string{"write 4KiB over tcp measured 1.5s, not its 0.3s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w bytes.Buffer
			warnOverrun(&w, c, &bc, "write 4KiB", tc.rs)
			lines := strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
			if w.Len() == 0 {
				lines = nil
			}
			if len(lines) != len(tc.want) {
				t.Fatalf("said %q, want %d lines like %q", w.String(), len(tc.want), tc.want)
			}
			for i, l := range lines {
				if !strings.Contains(l, tc.want[i]) || !strings.HasSuffix(l, "lower --threads, --batch-size or --block-size for a shorter run") {
					t.Errorf("line %q, want %q and the advice", l, tc.want[i])
				}
			}
		})
	}
}
