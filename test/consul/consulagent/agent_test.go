package consulagent_test

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/test/consul/consulagent"
)

// The agent answers, and answers again on the same port after a restart.
func TestStartRestart(t *testing.T) {
	t0 := time.Now()
	a := consulagent.Start(t)
	t.Logf("agent ready at %s in %v", a.Addr(), time.Since(t0))
	get := func() int {
		resp, err := http.Get("http://" + a.Addr() + "/v1/status/leader")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := get(); c != http.StatusOK {
		t.Fatalf("leader status %d", c)
	}
	a.Stop()
	if _, err := http.Get("http://" + a.Addr() + "/v1/status/leader"); err == nil {
		t.Fatal("agent still answers after Stop")
	}
	t0 = time.Now()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(t0))
	if c := get(); c != http.StatusOK {
		t.Fatalf("leader status after restart %d", c)
	}
}

// A port taken between New and Start makes consul fail; Start says so, with
// the log, without waiting a minute for it to exit, and Launch moves to fresh ports.
func TestStartPortTaken(t *testing.T) {
	bin := consulagent.Require(t)
	a, err := consulagent.New(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Cleanup(a.Stop)
	done := make(chan error, 1)
	go func() { done <- a.Start() }()
	select {
	case err = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("Start did not return with its HTTP port taken")
	}
	if !errors.Is(err, consulagent.ErrFailed) {
		t.Fatalf("Start with its HTTP port taken: %v, want ErrFailed", err)
	}
	if !strings.Contains(err.Error(), "consul log:") {
		t.Errorf("error carries no log: %v", err)
	}
	t.Logf("%.300s", err)

	b, err := consulagent.Launch(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	if b.Addr() == a.Addr() {
		t.Fatalf("Launch chose the taken port %s", a.Addr())
	}
}
