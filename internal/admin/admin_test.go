package admin_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/admin"
	"github.com/rdmago/te/tcp"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestServer serves the three endpoints of one engine and closes
// idempotently; a bad address is refused with a hint.
func TestServer(t *testing.T) {
	n := enginetest.NewNode(t, engine.Config{Name: "node"}, 1<<20, tcp.New(tcp.Config{}))
	s, err := admin.Start("127.0.0.1:0", n.Engine, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr()
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "te_tasks_in_flight 0") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d\n%.1000s", code, body)
	}
	code, body := get(t, base+"/debug/te")
	var snap engine.Snapshot
	if err := json.Unmarshal([]byte(body), &snap); code != 200 || err != nil || snap.Name != "node" || len(snap.Transports) != 1 {
		t.Fatalf("/debug/te: %d %v\n%.1000s", code, err, body)
	}
	if code, body := get(t, base+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/: %d\n%.500s", code, body)
	}
	if code, _ := get(t, base+"/debug/pprof/goroutine?debug=1"); code != 200 {
		t.Fatalf("/debug/pprof/goroutine: %d", code)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	var nilSrv *admin.Server
	nilSrv.Close()
	if _, err := admin.Start("not an address", n.Engine, nil); err == nil || !strings.Contains(err.Error(), "host:port") {
		t.Fatalf("a bad address: %v", err)
	}
}
