// Package e2e runs the te binary against a real Consul agent: te serve
// publishes a segment, te segments lists it, te bench opens it through
// Consul and moves data to it; when te serve stops (or is killed) the
// segment disappears.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/test/consul/consulagent"
)

// buildTE builds cmd/te into a temporary directory.
func buildTE(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	bin := filepath.Join(t.TempDir(), "te")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/te")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/te: %v\n%s", err, b)
	}
	return bin
}

// serve starts te serve and returns it with the segment name it printed.
func serve(t *testing.T, te, metadata, name string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(te, "serve", "--metadata", metadata, "--name", name,
		"--listen", "127.0.0.1:0", "--buffer-size", "16MiB")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		l, _ := r.ReadString('\n')
		line <- l
		r.WriteTo(io.Discard)
	}()
	select {
	case l := <-line:
		seg, ok := strings.CutPrefix(strings.TrimSpace(l), "segment ")
		if !ok {
			t.Fatalf("te serve printed %q; stderr:\n%s", l, stderr.String())
		}
		return cmd, seg
	case <-time.After(60 * time.Second):
		t.Fatalf("te serve did not start; stderr:\n%s", stderr.String())
	}
	return nil, ""
}

func te(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// waitGone polls te segments until name is no longer listed.
func waitGone(t *testing.T, bin, metadata, name string, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	for {
		out, err := te(t, bin, "segments", "--metadata", metadata)
		if err != nil {
			t.Fatalf("te segments: %v\n%s", err, out)
		}
		if !strings.Contains(out, name) {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			t.Fatalf("segment %s still listed %v later:\n%s", name, within, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestServeBenchOverConsul(t *testing.T) {
	a := consulagent.Start(t)
	bin := buildTE(t)
	metadata := a.URI("e2e") + "?ttl=1s"

	srv, seg := serve(t, bin, metadata, "e2e-target")
	if seg != "e2e-target" {
		t.Fatalf("segment name %q, want e2e-target", seg)
	}

	out, err := te(t, bin, "segments", "--metadata", metadata)
	if err != nil {
		t.Fatalf("te segments: %v\n%s", err, out)
	}
	t.Logf("te segments:\n%s", out)
	if !strings.Contains(out, "e2e-target") || !strings.Contains(out, "tcp=127.0.0.1:") {
		t.Fatalf("te segments does not list the served segment with its tcp endpoint:\n%s", out)
	}

	out, err = te(t, bin, "bench", "--metadata", metadata, "--segment", seg, "--protocol", "tcp",
		"--block-size", "64KiB", "--batch-size", "16", "--duration", "1s", "--verify", "--json", "--quiet")
	if err != nil {
		t.Fatalf("te bench: %v\n%s", err, out)
	}
	// The te/v1 report: one result per protocol and configuration.
	type result struct {
		Segment  string  `json:"segment"`
		Bytes    uint64  `json:"bytes"`
		GBps     float64 `json:"gb_per_s"`
		Verified *bool   `json:"verified"`
	}
	var report struct {
		Schema  string   `json:"schema"`
		Results []result `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil || report.Schema != "te/v1" || len(report.Results) == 0 {
		t.Fatalf("te bench --json output (schema %q, %d results): %v\n%s", report.Schema, len(report.Results), err, out)
	}
	results := report.Results
	for _, r := range results {
		if r.Segment != seg || r.Bytes == 0 || r.Verified == nil || !*r.Verified {
			t.Fatalf("te bench result %+v: want bytes moved to %s and verified", r, seg)
		}
		t.Logf("te bench over Consul metadata: %d bytes, %.2f GB/s, verified", r.Bytes, r.GBps)
	}

	// A clean stop destroys the session: the segment goes at once.
	srv.Process.Signal(syscall.SIGTERM)
	if err := srv.Wait(); err != nil {
		t.Fatalf("te serve exit: %v", err)
	}
	t.Logf("after SIGTERM, gone in %v", waitGone(t, bin, metadata, seg, 5*time.Second))
	out, err = te(t, bin, "bench", "--metadata", metadata, "--segment", seg, "--duration", "1s", "--quiet")
	if err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("te bench against a stopped segment: %v\n%s", err, out)
	}

	// A killed server stops renewing its session: its segment goes within
	// TTL..2×TTL.
	srv2, seg2 := serve(t, bin, metadata, "e2e-killed")
	if err := srv2.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	srv2.Wait()
	t.Logf("after SIGKILL (TTL 1s), gone in %v", waitGone(t, bin, metadata, seg2, 2*time.Second+5*time.Second))
}
