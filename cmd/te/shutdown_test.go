package main

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
)

// te serve stops promptly on SIGTERM while peers hold connections to its
// data port (handshaken, then silent) and to its p2p port: no wait on a
// peer is left unbounded, none is paid per peer.
func TestServeStopsWithHeldConnections(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB")
	d := fetch(t, name, nil)
	pr, _ := d.Protocol(segment.ProtoTCP)
	hold(t, pr.Endpoint, 512, func(c net.Conn) error {
		return control.TCP.Dial(control.Stream(c, c, control.TCP.Frames()), nil, auth.Party{Name: "mallory", Epoch: 1}, auth.Party{Name: d.Name, Epoch: d.Epoch})
	})
	hold(t, name, 512, nil)
	start := time.Now()
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		took := time.Since(start)
		t.Logf("te serve stopped in %v with 1024 held connections: %v", took.Round(time.Millisecond), err)
		if err != nil || took > 3*time.Second {
			t.Fatalf("te serve took %v to stop (exit %v)\n%s", took, err, srvErr.String())
		}
	case <-time.After(stopGrace + 5*time.Second):
		srv.Process.Kill()
		<-done
		t.Fatalf("te serve still running %v after SIGTERM\n%s", stopGrace+5*time.Second, srvErr.String())
	}
}
