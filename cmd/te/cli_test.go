package main

// The CLI suite: te's conventions checked against the built binary, the
// way a user meets them (exit codes, -h, typos, sizes, the JSON envelope
// of every mode, bounds and progress of te bench, connection hints,
// Mooncake's spellings). TestMain builds the binary once.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/segment"
)

var (
	binPath  string
	buildErr error
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(shmHoldEnv); spec != "" {
		holdSHM(spec)
	}
	dir, err := os.MkdirTemp("", "te-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "te")
	cmd := exec.Command("go", "build", "-o", binPath, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		buildErr = errors.New(err.Error() + ": " + string(out))
	}
	if b := os.Getenv("TE_TEST_BINARY"); b != "" {
		// Run the suite against another build (an older te, to see
		// which cases it fails).
		binPath, buildErr = b, nil
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// teBinary is the te built by TestMain.
func teBinary(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("go build: %v", buildErr)
	}
	return binPath
}

func runTE(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runTEFor(t, time.Minute, args...)
}

// TestCLIHelp: -h, --help and te help CMD print the command's help, with
// every flag spelled --flag, on stdout and exit 0.
func TestCLIHelp(t *testing.T) {
	for _, cmd := range []string{"bench", "serve", "segments", "trace"} {
		var outs []string
		for _, args := range [][]string{{cmd, "-h"}, {cmd, "--help"}, {"help", cmd}, {cmd, "x", "-h"}} {
			stdout, stderr, code := runTE(t, args...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: te "+cmd) {
				t.Errorf("te %v: exit %d, stdout:\n%s\nstderr:\n%s", args, code, stdout, stderr)
			}
			if regexp.MustCompile(`(?m)^\s+-[a-z]`).MatchString(stdout) {
				t.Errorf("te %v: a flag spelled with one dash:\n%s", args, stdout)
			}
			outs = append(outs, stdout)
		}
		if outs[0] != outs[2] {
			t.Errorf("te help %s differs from te %s -h", cmd, cmd)
		}
	}
	// The other commands follow the same conventions.
	for _, cmd := range []string{"perf", "devices", "rxe", "metadata", "diagnose"} {
		for _, args := range [][]string{{cmd, "-h"}, {"help", cmd}} {
			stdout, _, code := runTE(t, args...)
			if code != 0 || !strings.HasPrefix(stdout, "usage:") || !strings.Contains(stdout, "te "+cmd) {
				t.Errorf("te %v: exit %d\n%s", args, code, stdout)
			}
		}
		if _, stderr, code := runTE(t, cmd, "--bogus-flag"); code != 2 || strings.Count(stderr, "\n") > 2 {
			t.Errorf("te %s --bogus-flag: exit %d, %d lines:\n%s", cmd, code, strings.Count(stderr, "\n"), stderr)
		}
	}
	// te devices keeps ibv_devinfo's -d and -v, listed as spellings of
	// its --flags, not as flags named --d and --v.
	stdout, _, _ := runTE(t, "devices", "-h")
	if !strings.Contains(stdout, "  --device NAME\n") || !strings.Contains(stdout, "  --verbose\n") || !strings.Contains(stdout, "-d (--device), -v (--verbose)") || strings.Contains(stdout, "--d ") {
		t.Errorf("te devices -h:\n%s", stdout)
	}
	if _, stderr, code := runTE(t, "devices", "-d"); code != 2 || !strings.HasPrefix(stderr, "te devices: --device needs a value") {
		t.Errorf("te devices -d: exit %d\n%s", code, stderr)
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		if stdout, _, code := runTE(t, args...); code != 0 || !strings.Contains(stdout, "bench") || !strings.Contains(stdout, "version") {
			t.Errorf("te %v: exit %d\n%s", args, code, stdout)
		}
	}
	if _, stderr, code := runTE(t); code != 2 || !strings.Contains(stderr, "usage: te <command>") {
		t.Errorf("te: exit %d\n%s", code, stderr)
	}
}

// TestCLIMistakes: a mistake prints two lines (what, and the usage line),
// names flags as --flag, suggests the nearest flag or command, and exits 2.
func TestCLIMistakes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--blok-size", "4K"}, "te bench: unknown flag --blok-size; did you mean --block-size?"},
		{[]string{"bench", "--thread", "2"}, "did you mean --threads?"},
		{[]string{"segments", "--jsn", "h:1"}, "te segments: unknown flag --jsn; did you mean --json?"},
		{[]string{"serve", "--bufer-size", "1M"}, "did you mean --buffer-size?"},
		{[]string{"trace", "--pdi", "1"}, "did you mean --pid?"},
		{[]string{"bench", "--threads", "0"}, "te bench: --threads 0: want 1 to 1024"},
		{[]string{"bench", "--block-size"}, "--block-size needs a value"},
		{[]string{"bench", "--json=maybe"}, "--json maybe: want true or false"},
		{[]string{"bench", "--batch-size", "x"}, "--batch-size x: not a whole number"},
		{[]string{"bench", "--segment", "127.0.0.1"}, "--segment 127.0.0.1: with p2p metadata a segment is the host:port"},
		{[]string{"bench", "--metadata_server=127.0.0.1:2379"}, "Mooncake's spelling of an etcd server"},
		{[]string{"serve", "--metadata", "etcd://127.0.0.1:2379"}, "etcd metadata is not supported; use one of te's stores"},
		{[]string{"serve", "--mode=initiator"}, "the initiator is te bench"},
		{[]string{"bench", "--block-size", "1GB"}, "block × batch × threads = 128GB: over 64GiB"},
	} {
		stdout, stderr, code := runTE(t, c.args...)
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		if code != 2 || stdout != "" || len(lines) != 2 || !strings.Contains(lines[0], c.want) || !strings.HasPrefix(lines[1], "usage: te ") {
			t.Errorf("te %v: exit %d, stderr:\n%s\nwant exit 2, two lines, the first with %q", c.args, code, stderr, c.want)
		}
		if regexp.MustCompile(` -[a-z]`).MatchString(lines[0]) {
			t.Errorf("te %v: a flag spelled with one dash: %s", c.args, lines[0])
		}
	}
	if _, stderr, code := runTE(t, "benh"); code != 2 || !strings.Contains(stderr, "unknown command benh; did you mean bench?") {
		t.Errorf("te benh: exit %d\n%s", code, stderr)
	}
}

func TestCLIVersion(t *testing.T) {
	stdout, _, code := runTE(t, "version")
	if code != 0 || !regexp.MustCompile(`(?s)^te \S+\n.*go +go1\.\d+\S* \w+/\w+\n.*build +.*CGO_ENABLED=0`).MatchString(stdout) {
		t.Fatalf("te version: exit %d\n%s", code, stdout)
	}
}

// TestCLISizes: sizes in any case, with decimals, KB as 1000 and K as
// 1024, printed back in the unit given.
func TestCLISizes(t *testing.T) {
	for _, c := range []struct{ size, printed string }{{"1.5MiB", "1.5MiB"}, {"64kb", "64KB"}, {"16k", "16KiB"}, {"4096", "4KiB"}} {
		stdout, stderr, code := runTE(t, "bench", "--protocol", "shm", "--block-size", c.size, "--batch-size", "2", "--duration", "200ms", "--quiet")
		if code != 0 || !strings.Contains(stdout, "result: write "+c.printed+" over shm:") {
			t.Errorf("--block-size %s: exit %d\n%s%s", c.size, code, stdout, stderr)
		}
	}
}

// TestCLIQuiet: --quiet leaves only the results.
func TestCLIQuiet(t *testing.T) {
	stdout, stderr, code := runTE(t, "bench", "--quiet", "--duration", "300ms", "--batch-size", "4")
	if code != 0 || stderr != "" || strings.Contains(stdout, "te bench:") || !strings.HasPrefix(stdout, "result: ") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestCLIBenchHeader: the header names the real metadata address and
// what shares the duration.
func TestCLIBenchHeader(t *testing.T) {
	stdout, _, code := runTE(t, "bench", "--duration", "600ms", "--batch-size", "4")
	m := regexp.MustCompile(`te bench: write over tcp and shm to (\S+) \(in-process target\), metadata p2p://(\S+)\n`).FindStringSubmatch(stdout)
	if code != 0 || m == nil || m[1] != m[2] || strings.HasSuffix(m[2], ":0") {
		t.Fatalf("exit %d; want the target's real p2p address as metadata:\n%s", code, stdout)
	}
	if !strings.Contains(stdout, "600ms measured per configuration: tcp, shm, memcpy take turns, 200ms each") {
		t.Errorf("header does not say how the duration is shared:\n%s", stdout)
	}
}

// TestCLIDurationBound: --duration bounds the measured phase of the whole
// configuration, even with 1000 threads, and the JSON says how long each
// part measured.
func TestCLIDurationBound(t *testing.T) {
	start := time.Now()
	stdout, stderr, code := runTE(t, "bench", "--threads", "1000", "--duration", "1s", "--block-size", "4KiB", "--batch-size", "4", "--json")
	wall := time.Since(start)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	rs := decodeReport[benchResult](t, "bench", []byte(stdout))
	var measured float64
	for _, r := range rs {
		measured += r.Seconds
		if r.Threads != 1000 || r.Bytes == 0 {
			t.Errorf("%+v", r)
		}
	}
	if len(rs) != 2 || rs[1].Memcpy == nil {
		t.Fatalf("want tcp and shm with the memcpy beside it: %+v", rs)
	}
	measured += rs[1].Memcpy.Seconds
	t.Logf("measured %.2fs of a 1s duration, wall %v\n%s", measured, wall, stderr)
	// Each part overruns its turn by the batches in flight (before, each
	// measured the whole second); on a starved machine that can be long,
	// and then te says so.
	if measured > 2 && !strings.Contains(stderr, "lower --threads, --batch-size or --block-size") {
		t.Errorf("tcp, shm and memcpy measured %.2fs in all, without a word: --duration 1s does not bound them", measured)
	}
	if wall > 30*time.Second && !strings.Contains(stderr, "setup") {
		t.Errorf("ran %v with no word of its setup", wall)
	}
}

// TestCLIHugeBatch: a batch that takes longer than a second to complete
// reports that, never a rate of 0.00.
func TestCLIHugeBatch(t *testing.T) {
	_, stderr, code := runTEFor(t, 3*time.Minute, "bench", "--protocol", "tcp", "--batch-size", "100000", "--block-size", "8KiB", "--duration", "2")
	if code != 0 || strings.Contains(stderr, " 0.00 GB/s") {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	t.Logf("\n%s", stderr)
}

// TestCLISweepStreams: --sweep prints each row when it is measured, not
// the whole table at the end.
func TestCLISweepStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, teBinary(t), "bench", "--sweep", "--protocol", "tcp", "--duration", "500ms", "--batch-size", "2", "--quiet")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var first time.Time
	var rows int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "| write") || strings.HasPrefix(sc.Text(), "| read") {
			if rows == 0 {
				first = time.Now()
			}
			rows++
		}
	}
	if err := cmd.Wait(); err != nil || rows != 6 {
		t.Fatalf("te bench --sweep: %v, %d rows", err, rows)
	}
	if d := time.Since(first); d < 2*time.Second {
		t.Errorf("the first row came %v before the end of a 6 × 500ms sweep: not printed as measured", d)
	}
}

// TestCLIJSONModes: every --json mode prints the one envelope.
func TestCLIJSONModes(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--json", "--duration", "300ms", "--batch-size", "4"},
		{"bench", "--json", "--protocol", "tcp", "--duration", "300ms", "--batch-size", "4"},
		{"bench", "--json", "--sweep", "--protocol", "shm", "--duration", "100ms", "--batch-size", "2", "--baseline"},
	} {
		stdout, stderr, code := runTE(t, args...)
		if code != 0 {
			t.Fatalf("te %v: exit %d\n%s", args, code, stderr)
		}
		rs := decodeReport[benchResult](t, "bench", []byte(stdout))
		r, _ := cli.ParseReport([]byte(stdout))
		if len(rs) == 0 || r.Flags["duration"] == nil || r.Flags["block_size"] != float64(64<<10) {
			t.Errorf("te %v: %d results, flags %v", args, len(rs), r.Flags)
		}
		var raw map[string]any
		json.Unmarshal(r.Results[0], &raw)
		for _, dup := range []string{"rate", "unit"} {
			if _, ok := raw[dup]; ok {
				t.Errorf("te %v: result has %q beside gb_per_s", args, dup)
			}
		}
	}
	_, name, _ := serveProcess(t, "--buffer-size", "8MiB", "--protocol", "tcp")
	stdout, stderr, code := runTE(t, "segments", name, "--json") // the flag after the name
	if code != 0 {
		t.Fatalf("te segments --json: exit %d\n%s", code, stderr)
	}
	ds := decodeReport[segment.Descriptor](t, "segments", []byte(stdout))
	if len(ds) != 1 || ds[0].Name != name {
		t.Fatalf("te segments --json: %+v", ds)
	}
}

// TestCLIConnectionHints: a closed port says what to check, on one line,
// without repeating links of the error chain; a peer's string is escaped.
func TestCLIConnectionHints(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	for _, args := range [][]string{{"bench", "--segment", dead, "--duration", "1"}, {"segments", dead}} {
		_, stderr, code := runTE(t, args...)
		first := strings.SplitN(stderr, "\n", 2)[0]
		if code != 1 || !strings.Contains(first, "is `te serve` running on that host") || !strings.Contains(first, dead) {
			t.Errorf("te %v: exit %d\n%s", args, code, stderr)
		}
		if strings.Count(first, "connection refused") != 1 || strings.Count(first, "segment: ") > 1 {
			t.Errorf("te %v repeats itself: %s", args, first)
		}
	}
	// A metadata server that does not answer is named as such, not as a
	// te serve to start.
	for _, args := range [][]string{
		{"bench", "--metadata", "http://" + dead + "/metadata", "--duration", "1"},
		{"serve", "--metadata", "consul://" + dead + "/te", "--buffer-size", "1MiB"},
		{"segments", "--metadata", "consul://" + dead + "/te"},
	} {
		_, stderr, code := runTE(t, args...)
		last := strings.TrimSpace(stderr)
		last = last[strings.LastIndex(last, "\n")+1:]
		if code != 1 || !strings.HasSuffix(last, "(the metadata server does not answer: is it running at the --metadata address "+args[2]+"?)") || strings.Contains(stderr, "te serve` running") {
			t.Errorf("te %v: exit %d\n%s", args, code, stderr)
		}
	}
	// A port of another protocol: told at its first bytes, not after a
	// timeout; a silent one: a timeout with what to check, and a setup
	// that failed is not reported "done".
	ssh := fakePeer(t, []byte("SSH-2.0-OpenSSH_9.6\r\n"))
	_, stderr, code := runTE(t, "bench", "--segment", ssh, "--duration", "1")
	if code != 1 || !strings.Contains(stderr, `the peer does not speak te (its first bytes are "SSH-"): is this a te port?`) || strings.Contains(stderr, "timed out") {
		t.Errorf("te bench --segment (an ssh port): exit %d\n%s", code, stderr)
	}
	silent := fakePeer(t, nil)
	_, stderr, code = runTE(t, "bench", "--segment", silent, "--duration", "1")
	if code != 1 || !strings.Contains(stderr, "timed out waiting for the challenge") || !strings.Contains(stderr, "is the port a te one") ||
		!strings.Contains(stderr, "setup ") || strings.Contains(stderr, ": done") {
		t.Errorf("te bench --segment (a silent port): exit %d\n%s", code, stderr)
	}
	// te serve's tcp data port given as the segment (te serve prints
	// both): the initiator is told which port it reached, at once.
	_, name, _ := serveProcess(t, "--buffer-size", "8MiB", "--protocol", "tcp")
	pr, _ := fetch(t, name, nil).Protocol(segment.ProtoTCP)
	for _, args := range [][]string{{"bench", "--segment", pr.Endpoint, "--duration", "1"}, {"segments", pr.Endpoint}} {
		_, stderr, code = runTE(t, args...)
		if code != 1 || !strings.Contains(stderr, "the peer is te's tcp data port, not te's p2p metadata port: check the address") {
			t.Errorf("te %v (te serve's tcp port): exit %d\n%s", args, code, stderr)
		}
	}
	_, stderr, _ = runTE(t, "segments", "\x1b[31mevil:1")
	if strings.Contains(stderr, "\x1b") || !strings.Contains(stderr, `\x1b[31mevil:1`) {
		t.Errorf("a control character reached the terminal: %q", stderr)
	}
}

// fakePeer listens on loopback and writes greeting to every connection it
// accepts, then holds it open; it returns the address.
func fakePeer(t *testing.T, greeting []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
			c.Write(greeting)
		}
	}()
	return ln.Addr().String()
}

// TestCLIMooncakeSpellings: transfer_engine_bench's command lines work as
// written: --mode=target serves, the initiator reaches it.
func TestCLIMooncakeSpellings(t *testing.T) {
	cmd := exec.Command(teBinary(t), "bench", "--mode=target", "--metadata_server=P2PHANDSHAKE", "--protocol=tcp", "--local_server_name=127.0.0.1", "--buffer_size=8MiB")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var serr bytes.Buffer
	cmd.Stderr = &serr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "segment 127.0.0.1:") {
		t.Fatalf("te bench --mode=target printed %q\n%s", sc.Text(), serr.String())
	}
	seg := strings.TrimPrefix(sc.Text(), "segment ")
	stdout, stderr, code := runTE(t, "bench", "--mode=initiator", "--metadata_server=P2PHANDSHAKE", "--segment_id="+seg, "--protocol=tcp",
		"--operation=read", "--block_size=4096", "--batch_size=2", "--threads=2", "--duration=1", "--report_unit=MB", "--report_precision=1")
	if code != 0 || !regexp.MustCompile(`result: read 4KiB over tcp: \d+\.\d MB/s`).MatchString(stdout) {
		t.Fatalf("initiator: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestCLINoRDMADevice: on a host without an RDMA device, every command that
// asks for rdma fails on one line that says so and points at te devices,
// exit 1, never a panic; te devices says why and what to run. (A host with
// a device runs them instead: then only the absence of a panic is checked.)
func TestCLINoRDMADevice(t *testing.T) {
	devs, _ := os.ReadDir("/sys/class/infiniband")
	none := len(devs) == 0
	for _, args := range [][]string{
		{"bench", "--protocol", "rdma", "--duration", "200ms", "--batch-size", "2"},
		{"bench", "--protocol", "tcp,rdma", "--duration", "200ms", "--batch-size", "2"},
		{"serve", "--protocol", "rdma", "--buffer-size", "1MiB"},
		{"serve", "--protocol", "tcp,rdma", "--buffer-size", "1MiB"},
		{"perf", "-d", "rxe0", "-p", "18998"},
		{"devices"},
	} {
		if !none && args[0] == "serve" {
			continue // it would serve until stopped
		}
		_, stderr, code := runTEFor(t, 30*time.Second, args...)
		if strings.Contains(stderr, "panic") || strings.Contains(stderr, "goroutine ") || code == 2 {
			t.Errorf("te %v: exit %d\n%s", args, code, stderr)
		}
		if !none {
			continue
		}
		// bench and serve point at te devices; te devices (and te perf
		// with the device missing) say why and what to run.
		want := []string{"no RDMA device", "`te devices` says why"}
		if args[0] == "devices" || args[0] == "perf" {
			want = []string{"no RDMA devices found: ", "; fix: ", "te rxe add "}
		}
		for _, w := range want {
			if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, w) {
				t.Errorf("te %v: exit %d, want 1 and one line with %q:\n%s", args, code, w, stderr)
			}
		}
	}
}

// TestCLIBufferTooLarge: buffers no host holds are refused before
// anything is mapped, and a buffer the kernel will not map (here under
// a small address-space limit) fails saying what to lower, not with a
// bare "cannot allocate memory".
func TestCLIBufferTooLarge(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--buffer-size", "100TiB", "--duration", "100ms"},
		{"serve", "--buffer-size", "100TiB"},
	} {
		_, stderr, code := runTE(t, args...)
		if code == 0 || !strings.Contains(stderr, "more than this host's memory") || !strings.Contains(stderr, "lower --buffer-size") {
			t.Errorf("te %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	for _, args := range []string{
		"bench --buffer-size 4GiB --duration 100ms",
		"serve --buffer-size 8GiB",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, "sh", "-c", "ulimit -v 3000000 && exec "+teBinary(t)+" "+args).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "lower --buffer-size") {
			t.Errorf("te %s under ulimit -v 3000000: %v\n%s", args, err, out)
		}
	}
}
