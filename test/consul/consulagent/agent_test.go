package consulagent_test

import (
	"net/http"
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
