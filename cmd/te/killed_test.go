package main

import (
	"bufio"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A te bench killed mid-transfer (SIGKILL) leaves a Warn-level line on
// the target naming what happened and the initiator's address; it used
// to leave nothing above Debug.
func TestKilledBenchWarns(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "64MiB")
	// Four threads of large requests: at any moment some lane is inside
	// a frame (or holds replies its initiator has not read), so the kill
	// is seen as one: a kill while every lane sits between requests
	// looks to the target like a clean close, which it logs at Debug.
	bench := exec.Command(teBinary(t), "bench", "--segment", name, "--protocol", "tcp", "--duration", "30",
		"--block-size", "1MiB", "--batch-size", "8", "--threads", "4", "--buffer-size", "32MiB")
	progress, err := bench.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := bench.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it reports progress: it is mid-transfer.
	measuring := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(progress)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "GB/s") {
				measuring <- true
				break
			}
		}
		io.Copy(io.Discard, progress)
	}()
	select {
	case <-measuring:
	case <-time.After(time.Minute):
		bench.Process.Kill()
		t.Fatal("te bench reported no progress in a minute")
	}
	bench.Process.Signal(syscall.SIGKILL)
	bench.Wait()
	time.Sleep(500 * time.Millisecond)
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	log := srvErr.String()
	var warn string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "tcp: ") && strings.Contains(l, "peer=127.0.0.1:") {
			warn = l
		}
	}
	if warn == "" {
		t.Fatalf("no Warn line on the target after its initiator was killed:\n%s", log)
	}
	t.Logf("%s", warn)
}
