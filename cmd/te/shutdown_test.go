package main

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/shm"
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

// te serve stops within one shm I/O timeout (5 s) and a margin while a
// same-user process holds 64 shm connections whose busy counters it
// raised and never lowers; it used to wait two timeouts for each in turn
// (about 10 minutes here). The hostile peer is the shm package's test
// binary in its "busy" role.
func TestServeStopsWithStuckShmPeers(t *testing.T) {
	dir := t.TempDir()
	shmTest := filepath.Join(dir, "shm.test")
	build := exec.Command("go", "test", "-c", "-o", shmTest, "github.com/rdmago/te/shm")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c ./shm: %v\n%s", err, out)
	}
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB")
	hostile := exec.Command(shmTest)
	hostile.Env = append(os.Environ(), "TE_SHM_TEST_CHILD=busy,"+name)
	out, err := hostile.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hostile.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hostile.Process.Kill()
		hostile.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
		io.Copy(io.Discard, out)
	}()
	select {
	case l := <-line:
		if l != "held 64" {
			t.Fatalf("hostile peer: %q", l)
		}
	case <-time.After(time.Minute):
		t.Fatal("hostile peer did not connect in a minute")
	}
	start := time.Now()
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		took := time.Since(start)
		t.Logf("te serve stopped in %v with 64 stuck shm peers: %v", took.Round(time.Millisecond), err)
		if took > shm.DefaultIOTimeout+4*time.Second {
			t.Fatalf("te serve took %v to stop\n%s", took, srvErr.String())
		}
		if !strings.Contains(srvErr.String(), "gave up waiting for peers stuck inside a copy") || !strings.Contains(srvErr.String(), "peers=64") {
			t.Fatalf("te serve did not say which peers it gave up on:\n%s", srvErr.String())
		}
	case <-time.After(stopGrace + 5*time.Second):
		srv.Process.Kill()
		<-done
		t.Fatalf("te serve still running %v after SIGTERM\n%s", stopGrace+5*time.Second, srvErr.String())
	}
}
