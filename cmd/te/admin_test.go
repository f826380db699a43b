package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
)

// freeAddr returns a loopback address with a port that was free a moment
// ago, for a process that is told its address before it starts.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// promQuery runs an instant query on Prometheus's HTTP API and returns
// the result's samples as label set (sorted k=v) to value.
func promQuery(t *testing.T, base, q string) map[string]float64 {
	t.Helper()
	body, err := httpGet(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		t.Fatalf("query %s: %v\n%s", q, err, body)
	}
	var r struct {
		Status string
		Data   struct {
			Result []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.Status != "success" {
		t.Fatalf("query %s: %v: %s", q, err, body)
	}
	out := map[string]float64{}
	for _, s := range r.Data.Result {
		v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		out[fmt.Sprint(s.Metric)] = v
	}
	return out
}

// TestPrometheusScrapesAdmin: a real Prometheus server (Debian's
// prometheus package) scrapes te serve --admin and te bench --admin while
// te bench writes over tcp; its HTTP API then has non-zero byte counters
// for the right peer and protocol on both sides (the target's per
// initiator, the initiator's per target), and promtool check metrics
// passes on te serve's exposition.
func TestPrometheusScrapesAdmin(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Unavailable(t, "prometheus not found (apt-get install prometheus, or make deps)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Unavailable(t, "promtool not found (apt-get install prometheus, or make deps)")
	}
	serveAdmin, benchAdmin, promAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: serve
    static_configs: [{targets: [%q]}]
  - job_name: bench
    static_configs: [{targets: [%q]}]
`, serveAdmin, benchAdmin)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var promLog testenv.Buffer
	pc := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr)
	pc.Stdout, pc.Stderr = &promLog, &promLog
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		pc.Process.Kill()
		pc.Wait()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", promLog.String())
		}
	}()
	promURL := "http://" + promAddr
	// Prometheus applies its scrape targets a few seconds after it starts;
	// the bench must run after that to be scraped.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		body, err := httpGet(promURL + "/api/v1/targets")
		if err == nil && strings.Count(body, `"scrapeUrl"`) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus has not set up its two targets in 30s: %v %.500s", err, body)
		}
	}

	_, name, _ := serveProcess(t, "--buffer-size", "64MiB", "--protocol", "tcp", "--admin", serveAdmin)
	var benchErr testenv.Buffer
	bench := exec.Command(teBinary(t), "bench", "--segment", name, "--protocol", "tcp", "--operation", "write", "--duration", "4",
		"--batch-size", "16", "--admin", benchAdmin)
	bench.Stderr = &benchErr
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	defer bench.Process.Kill()
	// The initiator's name, as the target knows it, from its snapshot.
	var ini string
	for deadline := time.Now().Add(30 * time.Second); ini == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if body, err := httpGet("http://" + benchAdmin + "/debug/te"); err == nil {
			var s struct{ Name string }
			if json.Unmarshal([]byte(body), &s) == nil {
				ini = s.Name
			}
		}
	}
	if ini == "" {
		t.Fatalf("te bench --admin served no snapshot; stderr:\n%s", benchErr.String())
	}
	if err := bench.Wait(); err != nil {
		t.Fatalf("te bench: %v\n%s", err, benchErr.String())
	}
	// Prometheus has scraped both; the bench is gone, so ask over a
	// window. Wait for the target's counters to reach it (a scrape or
	// two after the bench).
	served := fmt.Sprintf(`max_over_time(te_served_bytes_total{job="serve",peer=%q,protocol="tcp",op="WRITE"}[5m])`, ini)
	sent := fmt.Sprintf(`max_over_time(te_bytes_total{job="bench",peer=%q,protocol="tcp",op="WRITE"}[5m])`, name)
	var got map[string]float64
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if _, err := httpGet(promURL + "/-/ready"); err != nil {
			continue
		}
		got = promQuery(t, promURL, served)
		if len(got) == 1 && positive(got) && positive(promQuery(t, promURL, sent)) {
			break
		}
	}
	if len(got) != 1 || !positive(got) {
		t.Fatalf("Prometheus has %v for %s", got, served)
	}
	out := promQuery(t, promURL, sent)
	if len(out) != 1 || !positive(out) {
		t.Fatalf("Prometheus has %v for %s; the bench's targets: %v, its byte counters %v", out, sent,
			promQuery(t, promURL, `max_over_time(up{job="bench"}[5m])`), promQuery(t, promURL, `max_over_time(te_bytes_total{job="bench"}[5m])`))
	}
	// Nothing for another peer or protocol.
	if other := promQuery(t, promURL, `te_served_bytes_total{job="serve",op="WRITE"} > 0 unless te_served_bytes_total{protocol="tcp",peer="`+ini+`"}`); len(other) != 0 {
		t.Fatalf("bytes counted for another peer or protocol: %v", other)
	}
	t.Logf("Prometheus: served to %s %v; sent to %s %v", ini, got, name, out)

	expo, err := httpGet("http://" + serveAdmin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(expo)
	if msg, err := check.CombinedOutput(); err != nil || len(bytes.TrimSpace(msg)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, msg)
	}
}

func positive(m map[string]float64) bool {
	for _, v := range m {
		if v <= 0 {
			return false
		}
	}
	return len(m) > 0
}
