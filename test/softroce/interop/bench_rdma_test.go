package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/test/softroce/srenv"
)

// startServe runs `te serve` with args and returns its segment name; the
// process is killed when the test ends.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "te", append([]string{"serve"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("te serve stderr:\n%s", stderr.String())
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	name, ok := strings.CutPrefix(strings.TrimSpace(line), "segment ")
	if err != nil || !ok {
		t.Fatalf("te serve %v: no segment line (%q, %v); stderr:\n%s", args, line, err, stderr.String())
	}
	return name
}

type benchJSON struct {
	Protocol string  `json:"protocol"`
	Bytes    uint64  `json:"bytes"`
	GBps     float64 `json:"gb_per_s"`
	Verified *bool   `json:"verified"`
	Rails    []struct {
		Device string `json:"device"`
		Bytes  uint64 `json:"bytes"`
		Up     bool   `json:"up"`
	} `json:"rails"`
}

// TestTeBenchRDMA runs te serve on host B's rails and te bench on host A's,
// as two processes, over both rails: data verified, both rails carry bytes.
// Then te segments shows the target's rails and rkeys.
func TestTeBenchRDMA(t *testing.T) {
	topo := srenv.Require(t)
	var a, b []string
	for i := range topo.HostA {
		a, b = append(a, topo.HostA[i].Name), append(b, topo.HostB[i].Name)
	}
	seg := startServe(t, "--protocol", "rdma", "--devices", strings.Join(b, ","), "--buffer-size", "64MiB")
	for _, op := range []string{"write", "read"} {
		out := runOut(t, "te", "bench", "--segment", seg, "--protocol", "rdma", "--devices", strings.Join(a, ","),
			"--operation", op, "--block-size", "64KiB", "--batch-size", "64", "--duration", "2s", "--verify", "--json", "--quiet")
		// The te/v1 report: one result for the one protocol.
		var report struct {
			Schema  string      `json:"schema"`
			Results []benchJSON `json:"results"`
		}
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &report); err != nil || report.Schema != "te/v1" || len(report.Results) != 1 {
			t.Fatalf("te bench %s: schema %q, %d results, %v\n%s", op, report.Schema, len(report.Results), err, out)
		}
		r := report.Results[0]
		t.Logf("%s: %.3f GB/s, rails %+v", op, r.GBps, r.Rails)
		if r.Protocol != "rdma" || r.Bytes == 0 || r.Verified == nil || !*r.Verified {
			t.Fatalf("te bench %s: %+v", op, r)
		}
		if len(r.Rails) != len(a) {
			t.Fatalf("te bench %s: %d rails reported, want %d", op, len(r.Rails), len(a))
		}
		for _, rl := range r.Rails {
			if rl.Bytes == 0 || !rl.Up {
				t.Errorf("te bench %s: rail %s carried %d bytes (up %v)", op, rl.Device, rl.Bytes, rl.Up)
			}
		}
	}
	segs := runOut(t, "te", "segments", seg)
	for _, d := range b {
		if !strings.Contains(segs, d+":1") {
			t.Errorf("te segments does not show rail %s:\n%s", d, segs)
		}
	}
	if !strings.Contains(segs, "RKEYS") {
		t.Errorf("te segments shows no rkeys:\n%s", segs)
	}
}

// TestTeBenchRDMALoopback is the main job over RDMA: te bench with an
// in-process target on the loopback device.
func TestTeBenchRDMALoopback(t *testing.T) {
	topo := srenv.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "te", "bench", "--protocol", "rdma", "--devices", topo.Lo.Name,
		"--duration", "1s", "--verify").CombinedOutput()
	if err != nil {
		t.Fatalf("te bench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "verify: true") || !strings.Contains(string(out), "rails:  "+topo.Lo.Name) {
		t.Fatalf("te bench over rdma loopback:\n%s", out)
	}
	t.Logf("%s", out)
}

// TestTeBenchMooncakeRDMA: te serve --mooncake --protocol rdma on host B's
// rails and te bench --mooncake --protocol rdma on host A's, as two
// processes that know each other only through Mooncake's wire (the
// P2PHANDSHAKE socket for the descriptor and the endpoint handshakes,
// Mooncake's QP setup), over both rails, data verified: the pair
// test/interop/mooncake/run.sh runs against a Mooncake build.
func TestTeBenchMooncakeRDMA(t *testing.T) {
	topo := srenv.Require(t)
	var a, b []string
	for i := range topo.HostA {
		a, b = append(a, topo.HostA[i].Name), append(b, topo.HostB[i].Name)
	}
	seg := startServe(t, "--mooncake", "--protocol", "rdma", "--devices", strings.Join(b, ","), "--buffer-size", "64MiB")
	for _, op := range []string{"write", "read"} {
		out := runOut(t, "te", "bench", "--mooncake", "--metadata", "P2PHANDSHAKE", "--segment", seg, "--protocol", "rdma",
			"--devices", strings.Join(a, ","), "--operation", op, "--block-size", "64KiB", "--batch-size", "32", "--duration", "2s",
			"--verify", "--json", "--quiet")
		var report struct {
			Results []benchJSON `json:"results"`
		}
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &report); err != nil || len(report.Results) != 1 {
			t.Fatalf("te bench --mooncake %s: %d results, %v\n%s", op, len(report.Results), err, out)
		}
		r := report.Results[0]
		t.Logf("%s: %.3f GB/s, rails %+v", op, r.GBps, r.Rails)
		if r.Protocol != "mooncake-rdma" || r.Bytes == 0 || r.Verified == nil || !*r.Verified || len(r.Rails) != len(a) {
			t.Fatalf("te bench --mooncake %s: %+v", op, r)
		}
		for _, rl := range r.Rails {
			if rl.Bytes == 0 || !rl.Up {
				t.Errorf("te bench --mooncake %s: rail %s carried %d bytes (up %v)", op, rl.Device, rl.Bytes, rl.Up)
			}
		}
	}
	// Mooncake's segment, as a Mooncake initiator reads it.
	if segs := runOut(t, "te", "segments", "--mooncake", "--metadata", "P2PHANDSHAKE", seg); !strings.Contains(segs, "mooncake-rdma") {
		t.Errorf("te segments --mooncake shows no mooncake-rdma entry:\n%s", segs)
	}

	// Through Mooncake's HTTP metadata (te metadata serve): te serve's
	// transport opens a handshake socket of its own, published as the
	// segment's rpc_meta, where te bench sets up its endpoints.
	ctx, cancel := context.WithCancel(context.Background())
	meta := exec.CommandContext(ctx, "te", "metadata", "serve", "--listen", "127.0.0.1:0")
	mout, err := meta.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := meta.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); meta.Wait() })
	line, _ := bufio.NewReader(mout).ReadString('\n')
	url := regexp.MustCompile(`http://[0-9.:]+/[a-z]+`).FindString(line)
	if url == "" {
		t.Fatalf("te metadata serve printed %q", line)
	}
	startServe(t, "--mooncake", "--protocol", "rdma", "--metadata", url, "--name", "te_target", "--listen", "127.0.0.1:0",
		"--devices", strings.Join(b, ","), "--buffer-size", "16MiB")
	out := runOut(t, "te", "bench", "--mooncake", "--metadata", url, "--segment", "te_target", "--protocol", "rdma",
		"--devices", strings.Join(a, ","), "--operation", "write", "--block-size", "64KiB", "--batch-size", "16", "--duration", "1s",
		"--verify", "--quiet")
	if !strings.Contains(out, "verify: true") || !strings.Contains(out, "over mooncake-rdma") {
		t.Fatalf("te bench --mooncake --metadata %s:\n%s", url, out)
	}
	t.Logf("through HTTP metadata: %s", strings.TrimSpace(out))
}
