package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// supervise ends a command that ignores its context: after the grace
// following a signal, or at once on a second signal; a command that
// watches its context returns its own result.
func TestSupervise(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	stubborn := func(context.Context) error { <-block; return nil }

	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	start := time.Now()
	err := supervise(sigs, 100*time.Millisecond, stubborn)
	if !errors.Is(err, errNotStopped) || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("after the grace: %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("returned after %v, before the grace", d)
	}

	sigs <- syscall.SIGINT
	sigs <- syscall.SIGINT
	if err := supervise(sigs, time.Hour, stubborn); !errors.Is(err, errNotStopped) || !strings.Contains(err.Error(), "second signal") {
		t.Fatalf("second signal: %v", err)
	}

	want := errors.New("stopped cleanly")
	sigs <- syscall.SIGTERM
	if err := supervise(sigs, time.Hour, func(ctx context.Context) error { <-ctx.Done(); return want }); err != want {
		t.Fatalf("a command that stops: %v", err)
	}
	if err := supervise(sigs, time.Hour, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("no signal: %v", err)
	}
}

// A FIFO as the secret file (mode 0600, no writer) is refused at once
// by every command that reads it; its open used to block te serve before
// any output, deaf to SIGTERM. Devices and directories likewise.
func TestSecretFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{fifo, "/dev/zero", dir} {
		for _, args := range [][]string{
			{"serve", "--auth-file", f},
			{"bench", "--duration", "1", "--auth-file", f},
			{"segments", "--auth-file", f, "127.0.0.1:1"},
		} {
			start := time.Now()
			_, stderr, code := runTEFor(t, 5*time.Second, args...)
			d := time.Since(start)
			if code != 1 || !strings.Contains(stderr, "not a regular file") {
				t.Errorf("te %v: exit %d after %v\n%s", args, code, d, stderr)
			}
			if d > time.Second {
				t.Errorf("te %v took %v to fail", args, d)
			}
		}
	}
}

// Blank means unset for $TE_AUTH_FILE, as in auth.FromEnv; a blank
// --auth-file is a usage error, not a silent run without authentication.
func TestAuthFileBlank(t *testing.T) {
	for _, v := range []string{"", "  "} {
		for _, cmd := range []string{"serve", "bench", "segments"} {
			_, stderr, code := runTE(t, cmd, "--auth-file", v)
			if code != 2 || !strings.Contains(stderr, "blank file name") {
				t.Errorf("te %s --auth-file %q: exit %d\n%s", cmd, v, code, stderr)
			}
		}
	}
	t.Setenv("TE_AUTH_FILE", " \t")
	_, stderr, code := runTE(t, "bench", "--duration", "200ms", "--batch-size", "4", "--quiet")
	if code != 0 {
		t.Fatalf("te bench with a blank $TE_AUTH_FILE: exit %d\n%s", code, stderr)
	}
}

// te serve and te bench stop on SIGTERM and SIGINT while still setting
// up: here waiting on a metadata server that accepts and never answers.
func TestSignalDuringSetup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	}()
	silent := ln.Addr().String()
	for _, c := range []struct {
		sig  syscall.Signal
		args []string
	}{
		{syscall.SIGTERM, []string{"serve", "--metadata", "consul://" + silent + "/te?timeout=1m"}},
		{syscall.SIGINT, []string{"serve", "--metadata", "consul://" + silent + "/te?timeout=1m"}},
		{syscall.SIGTERM, []string{"bench", "--metadata", "consul://" + silent + "/te?timeout=1m"}},
		{syscall.SIGINT, []string{"bench", "--segment", silent, "--duration", "1"}},
	} {
		cmd := exec.Command(teBinary(t), c.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case conn := <-accepted: // it is waiting on the silent server
			defer conn.Close()
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("te %v never connected to the silent server\n%s", c.args, stderr.String())
		}
		start := time.Now()
		cmd.Process.Signal(c.sig)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			t.Logf("te %v: %v after %v: %v; %s", c.args, c.sig, time.Since(start).Round(time.Millisecond), err, strings.TrimSpace(stderr.String()))
			if err == nil {
				t.Errorf("te %v: exit 0 after %v during setup", c.args, c.sig)
			}
		case <-time.After(stopGrace / 2):
			cmd.Process.Kill()
			<-done
			t.Errorf("te %v: still running %v after %v\n%s", c.args, stopGrace/2, c.sig, stderr.String())
		}
	}
}

// runTEFor is runTE with a time limit.
func runTEFor(t *testing.T, limit time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	bin := teBinary(t) // built first: the limit is for te alone
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("te %v: %v", args, err)
	}
	return o.String(), e.String(), code
}
