package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/diagnose"
)

// layerLine finds the report line of a layer: its status and the rest.
func layerLine(t *testing.T, out string, layer diagnose.Layer) (diagnose.Status, string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^(PASS|FAIL|SKIP) +` + regexp.QuoteMeta(string(layer)) + ` +(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %s line in:\n%s", layer, out)
	}
	return diagnose.Status(m[1]), m[2]
}

// TestDiagnoseCLI: against a live te serve every layer passes (exit 0,
// text and te/v1 JSON); stopped (SIGSTOP) the peer accepts and never
// answers, and once killed nothing listens: each is a FAIL at the
// descriptor layer (with p2p metadata the store is the peer itself) with
// its cause and fix, and exit 1.
func TestDiagnoseCLI(t *testing.T) {
	srv, seg, _ := serveProcess(t, "--buffer-size", "1MiB", "--protocol", "tcp")
	stdout, stderr, code := runTE(t, "diagnose", seg)
	if code != 0 || strings.Contains(stdout, "FAIL") || !strings.Contains(stdout, "every layer passed (tcp") {
		t.Fatalf("healthy peer: exit %d\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, l := range []diagnose.Layer{diagnose.LayerDescriptor, diagnose.LayerTransport, diagnose.LayerLocal, diagnose.LayerTCPDial,
		diagnose.LayerTCPHello, diagnose.LayerTCPRange, diagnose.LayerTCPProbe, diagnose.LayerTransfer} {
		if st, _ := layerLine(t, stdout, l); st != diagnose.Pass {
			t.Errorf("%s: %s", l, st)
		}
	}

	stdout, _, code = runTE(t, "diagnose", "--json", "--probe-size", "1KiB", seg)
	r, err := cli.ParseReport([]byte(stdout))
	if code != 0 || err != nil {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, stdout)
	}
	var rep diagnose.Report
	if len(r.Results) != 1 {
		t.Fatalf("--json: %d results, want 1", len(r.Results))
	}
	if err := json.Unmarshal(r.Results[0], &rep); err != nil || !rep.OK() || rep.Segment != seg || len(rep.Checks) < 8 {
		t.Fatalf("--json result: %v %+v", err, rep)
	}
	if r.Command != "diagnose" || r.Flags["probe_size"] != float64(1024) {
		t.Errorf("--json envelope: command %q, flags %v", r.Command, r.Flags)
	}

	if err := srv.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = runTE(t, "diagnose", "--timeout", "0.5", seg)
	srv.Process.Signal(syscall.SIGCONT)
	st, line := layerLine(t, stdout, diagnose.LayerDescriptor)
	if code != 1 || st != diagnose.Fail || !strings.Contains(line, "did not answer within 500ms") || !strings.Contains(stdout, "fix: check the peer process (state T") {
		t.Errorf("stopped peer: exit %d\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "te diagnose: not every layer passed: 1 failed, the first at descriptor") {
		t.Errorf("stopped peer: stderr %q", stderr)
	}

	srv.Process.Kill()
	srv.Wait()
	stdout, _, code = runTE(t, "diagnose", seg)
	st, line = layerLine(t, stdout, diagnose.LayerDescriptor)
	if code != 1 || st != diagnose.Fail || !strings.Contains(line, "connection refused") || !strings.Contains(stdout, "fix: start the peer") {
		t.Errorf("killed peer: exit %d\n%s", code, stdout)
	}
	if st, _ := layerLine(t, stdout, diagnose.LayerTransfer); st != diagnose.Skip {
		t.Errorf("killed peer: transfer %s, want SKIP", st)
	}
}

func TestDiagnoseUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diagnose"}, "name one segment"},
		{[]string{"diagnose", "127.0.0.1"}, "with p2p metadata a segment is the host:port"},
		{[]string{"diagnose", "--protocol", "shm", "127.0.0.1:1"}, "te diagnose checks tcp or rdma"},
		{[]string{"diagnose", "--epoch", "zz", "127.0.0.1:1"}, "want the hex epoch"},
		{[]string{"diagnose", "--local-size", "1KiB", "127.0.0.1:1"}, "must hold one --probe-size"},
	} {
		_, stderr, code := runTE(t, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("te %v: exit %d\n%s\nwant exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}
