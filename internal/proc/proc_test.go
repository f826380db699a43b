//go:build unix

package proc

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// A child in its own group has a process group ID equal to its PID, not
// ours; Terminate stops it like SIGTERM.
func TestOwnGroupTerminate(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	OwnGroup(cmd)
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	pgid, err := syscall.Getpgid(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if pgid != cmd.Process.Pid || pgid == syscall.Getpgrp() {
		t.Errorf("child pgid %d, pid %d, ours %d", pgid, cmd.Process.Pid, syscall.Getpgrp())
	}
	if err := cmd.Process.Signal(Terminate); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("child ended with %v, want SIGTERM", err)
	}
}

// StopSignals are delivered to a NotifyContext-style listener.
func TestStopSignals(t *testing.T) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, StopSignals...)
	defer signal.Stop(c)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-c:
		if s != Terminate {
			t.Errorf("got %v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM not delivered")
	}
	if len(StopSignals) != 2 || StopSignals[0] != os.Interrupt {
		t.Errorf("StopSignals %v", StopSignals)
	}
}
