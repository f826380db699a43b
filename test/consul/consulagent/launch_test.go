package consulagent

import (
	"net"
	"os"
	"strings"
	"testing"
)

// Launch moves to fresh ports when consul cannot bind the first ones: the
// first pick here hands it an HTTP port already held.
func TestLaunchRetries(t *testing.T) {
	bin := Require(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := l.Addr().(*net.TCPAddr).Port
	picks := 0
	a, err := launch(bin, t.TempDir(), func(a *Agent) error {
		picks++
		err := a.pickPorts()
		if picks == 1 {
			a.ports[0] = held
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if picks != 2 {
		t.Fatalf("%d picks, want 2: one refused, one that started", picks)
	}
	if a.ports[0] == held {
		t.Fatalf("agent runs on the held port %d", held)
	}
	b, err := os.ReadFile(a.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "=== run 2") || !strings.Contains(string(b), "address already in use") {
		t.Fatalf("log does not show a refused run then a second one:\n%s", b)
	}
}
