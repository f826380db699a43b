package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/ebpf"
	"github.com/rdmago/te/internal/testenv"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "te trace loads eBPF programs: needs root")
	}
}

// traceJSON runs te trace --json with args and decodes its rows.
func traceJSON(t *testing.T, args ...string) []traceRow {
	t.Helper()
	stdout, stderr, code := runTE(t, append([]string{"trace", "--json", "--interval", "500ms"}, args...)...)
	if code != 0 {
		t.Fatalf("te trace %v: exit %d\n%s", args, code, stderr)
	}
	return decodeReport[traceRow](t, "trace", []byte(stdout))
}

// TestTraceServe: te trace, in its own process, against a te serve that a
// te bench drives over TCP: the serve's table names the bench's segment as
// the peer of every lane, the bench's names the serve's, and the bytes
// move between two refreshes.
func TestTraceServe(t *testing.T) {
	needRoot(t)
	srv, name, _ := serveProcess(t, "--buffer-size", "64MiB", "--protocol", "tcp")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bench := exec.CommandContext(ctx, teBinary(t), "bench", "--segment", name, "--protocol", "tcp", "--operation", "write",
		"--block-size", "1MiB", "--batch-size", "16", "--duration", "30", "--quiet")
	var benchErr bytes.Buffer
	bench.Stdout, bench.Stderr = io.Discard, &benchErr
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		bench.Process.Kill()
		bench.Wait()
	}()
	// Wait until the bench has its lanes up and listed.
	var lanes []laneLabel
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ls, err := queryLanes(bench.Process.Pid)
		if err == nil {
			lanes = lanes[:0]
			for _, l := range ls {
				if !l.Accepted && l.Peer == name {
					lanes = append(lanes, l)
				}
			}
			if len(lanes) == 4 { // tcp.DefaultLanes
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("te bench listed no lanes to %s: %v, %v\n%s", name, ls, err, benchErr.String())
		}
	}

	// The serve's rows name the bench's segment as every lane's peer. On a
	// loaded machine the bench may stall through one interval: the bytes
	// must move in one of several.
	checkServe := func() (moving int) {
		rows := traceJSON(t, "--pid", strconv.Itoa(srv.Process.Pid))
		for _, l := range lanes {
			found := false
			for _, r := range rows {
				if r.Remote != l.Local || r.Local != l.Remote {
					continue
				}
				found = true
				if r.Peer != lanes[0].Segment || !strings.HasSuffix(r.Lane, " in") || r.State != "ESTABLISHED" {
					t.Errorf("serve side of lane %+v: %+v; want peer %s", l, r, lanes[0].Segment)
				}
				if r.RxBps > 0 && r.BytesReceived > 0 {
					moving++
				}
			}
			if !found {
				t.Errorf("te trace --pid %d: no row for lane %+v in %+v", srv.Process.Pid, l, rows)
			}
		}
		return moving
	}
	checkBench := func() (moving int) {
		for _, r := range traceJSON(t, "--pid", strconv.Itoa(bench.Process.Pid)) {
			if r.Peer == name && r.Lane != "-" && r.TxBps > 0 && r.BytesAcked > 0 {
				moving++
			}
		}
		return moving
	}
	for _, c := range []struct {
		side  string
		check func() int
	}{{"serve", checkServe}, {"bench", checkBench}} {
		moving := 0
		for try := 0; try < 10 && moving < len(lanes) && !t.Failed(); try++ {
			moving = c.check()
		}
		if moving < len(lanes) {
			t.Errorf("te trace of the %s: %d of %d lanes moved bytes in any of 10 intervals", c.side, moving, len(lanes))
		}
	}

	// The live table: the peers and counters in text, two refreshes.
	stdout, stderr, code := runTE(t, "trace", "--pid", strconv.Itoa(srv.Process.Pid), "--interval", "300ms", "--count", "2")
	if code != 0 || strings.Count(stdout, "PEER") != 2 || !strings.Contains(stdout, lanes[0].Segment) || !strings.Contains(stdout, "ESTABLISHED") {
		t.Errorf("te trace table: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Logf("te trace --pid %d:\n%s", srv.Process.Pid, stdout)
}

// TestBenchTrace: te bench --trace prints the per-lane table; as root from
// eBPF, as nobody from TCP_INFO after a clear message, and the bench passes.
func TestBenchTrace(t *testing.T) {
	args := []string{"bench", "--trace", "--protocol", "tcp", "--duration", "1", "--block-size", "1MiB", "--batch-size", "16", "--verify"}
	if os.Geteuid() == 0 {
		stdout, stderr, code := runTE(t, args...)
		if code != 0 || !strings.Contains(stdout, "lanes (eBPF)") || !strings.Contains(stdout, "0 g1") || !strings.Contains(stdout, "verify: true") {
			t.Fatalf("te bench --trace: exit %d\n%s\n%s", code, stdout, stderr)
		}
		t.Logf("root:\n%s", stdout)
	}
	cmd := exec.Command(nobodyCopy(t), args...)
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("te bench --trace unprivileged: %v\n%s\n%s", err, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "--trace: ebpf: tracing needs root") || !strings.Contains(out.String(), "lanes (TCP_INFO") ||
		!strings.Contains(out.String(), "0 g1") || !strings.Contains(out.String(), "verify: true") {
		t.Fatalf("te bench --trace unprivileged:\n%s\n%s", out.String(), errb.String())
	}
	t.Logf("nobody:\n%s%s", errb.String(), out.String())

	// te trace itself says what is missing.
	cmd = exec.Command(nobodyCopy(t), "trace", "--count", "1")
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	errb.Reset()
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errb.String(), "te trace: ebpf: tracing needs root") {
		t.Fatalf("te trace as nobody: %v\n%s", err, errb.String())
	}
}

// nobodyCopy copies te where user nobody can run it.
func nobodyCopy(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "te-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := os.ReadFile(teBinary(t))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "te"), b, 0o755)
	}
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "te")
}

// TestTraceRows: rows are labelled by cookie, or by address pair where
// the kernel gave no cookie; an accepted connection takes its peer from
// the initiator's listing; throughput is the byte delta over the interval.
func TestTraceRows(t *testing.T) {
	ap := netip.MustParseAddrPort
	labels := []laneLabel{
		{Segment: "ini", Peer: "tgt", Lane: 1, Gen: 3, Local: "10.0.0.1:5000", Remote: "10.0.0.2:80", Cookie: 7},
		{Segment: "tgt", Lane: -1, Accepted: true, Local: "10.0.0.2:80", Remote: "10.0.0.1:5000", Cookie: 8},
		{Segment: "ini", Peer: "tgt", Lane: 0, Gen: 1, Local: "10.0.0.1:5001", Remote: "10.0.0.2:80"},
	}
	prev := []ebpf.Conn{{Cookie: 7, BytesAcked: 1000, BytesReceived: 10}}
	cur := []ebpf.Conn{
		{Cookie: 7, Local: ap("10.0.0.1:5000"), Remote: ap("10.0.0.2:80"), BytesAcked: 3000, BytesReceived: 10, State: ebpf.Established},
		{Cookie: 8, Local: ap("10.0.0.2:80"), Remote: ap("10.0.0.1:5000"), BytesReceived: 500},
		{Local: ap("10.0.0.1:5001"), Remote: ap("10.0.0.2:80")},
		{Cookie: 9, Local: ap("10.0.0.1:6000"), Remote: ap("10.0.0.9:22")},
	}
	rows := traceRows(cur, prev, 2*time.Second, labels)
	want := []struct{ peer, lane string }{{"tgt", "1 g3"}, {"ini", "1 g3 in"}, {"tgt", "0 g1"}, {"10.0.0.9:22", "-"}}
	for i, w := range want {
		if rows[i].Peer != w.peer || rows[i].Lane != w.lane {
			t.Errorf("row %d: peer %q lane %q, want %q %q", i, rows[i].Peer, rows[i].Lane, w.peer, w.lane)
		}
	}
	if rows[0].TxBps != 1000 || rows[0].RxBps != 0 || rows[1].RxBps != 250 || rows[0].State != "ESTABLISHED" {
		t.Errorf("rates: %+v", rows[:2])
	}
}
