package main

import (
	"bytes"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
)

// TestServeLogEscaped: the names a hostile initiator puts in its hello
// (each at the protocol's longest, full of terminal control sequences)
// reach te serve's log lines through every failed handshake it logs, on
// its tcp data port, its p2p metadata port and its shm socket: no control
// byte but newline reaches stderr, and no line passes the cap.
func TestServeLogEscaped(t *testing.T) {
	sf := secretFile(t)
	srv, name, srvErr := serveProcess(t, "--buffer-size", "1MiB", "--auth-file", sf)
	s, err := auth.Load(sf)
	if err != nil {
		t.Fatal(err)
	}
	d := fetch(t, name, s)
	tcpEP, _ := d.Protocol(segment.ProtoTCP)
	shmEP, ok := d.Protocol(segment.ProtoSHM)
	if !ok {
		t.Fatalf("te serve offers no shm: %+v", d.Protocols)
	}
	other, err := auth.New([]byte("another cluster secret, not te serve's"))
	if err != nil {
		t.Fatal(err)
	}
	// A title sequence, then the byte whose escape is longest, to the
	// longest name a hello may carry.
	evil := ("\x1b[2J\x1b]0;pwned\x07\r" + strings.Repeat("\x1b", auth.MaxNameLen))[:auth.MaxNameLen]
	ports := []struct {
		spec *control.Spec
		// target is how an initiator addresses the port's server.
		target auth.Party
		dial   func() (control.Conn, func())
	}{
		{&control.TCP, auth.Party{Name: d.Name, Epoch: d.Epoch}, func() (control.Conn, func()) {
			c, err := net.Dial("tcp", tcpEP.Endpoint)
			if err != nil {
				t.Fatal(err)
			}
			return control.Stream(c, c, control.TCP.Frames()), func() { c.Close() }
		}},
		{&control.P2P, auth.Party{Name: name}, func() (control.Conn, func()) {
			c, err := net.Dial("tcp", name)
			if err != nil {
				t.Fatal(err)
			}
			return control.Stream(c, c, control.P2P.Frames()), func() { c.Close() }
		}},
		{&control.SHM, auth.Party{Name: d.Name, Epoch: d.Epoch}, func() (control.Conn, func()) {
			c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: shmEP.Endpoint, Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			return control.Packet(c, control.SHM.Frames(), make([]byte, 1<<16)), func() { c.Close() }
		}},
	}
	for i, hs := range []struct {
		secret *auth.Secret
		// target: the name addressed, when not the server's.
		target string
	}{
		{nil, ""},   // no secret
		{other, ""}, // another secret
		{s, evil},   // another segment
	} {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // past the log's one line a second
		}
		for _, p := range ports {
			c, closeConn := p.dial()
			target := p.target
			if hs.target != "" {
				target.Name = hs.target
			}
			if err := p.spec.Dial(c, hs.secret, auth.Party{Name: evil, Epoch: 7}, target); err == nil {
				t.Errorf("%s: handshake %d accepted", p.spec.Label, i)
			}
			closeConn()
		}
	}
	time.Sleep(200 * time.Millisecond)
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	log := srvErr.String()
	if n := strings.Count(log, "level=WARN"); n < 9 {
		t.Fatalf("%d Warn lines, want one per failed handshake (9):\n%s", n, strings.Join(strings.Split(log, "\n"), "\n")[:min(len(log), 20000)])
	}
	if i := bytes.IndexFunc([]byte(log), func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f }); i >= 0 {
		t.Errorf("a control byte %q reached te serve's stderr at %d: %.300q", log[i], i, log[max(0, i-100):])
	}
	longest := 0
	for _, line := range strings.Split(log, "\n") {
		longest = max(longest, len(line))
		if len(line) > maxPrintedLine {
			t.Errorf("te serve logged a line of %d bytes: %.300q…", len(line), line)
		}
	}
	t.Logf("longest line: %d bytes", longest)
}
