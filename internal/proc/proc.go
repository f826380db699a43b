//go:build unix

// Package proc holds the process-control values of package syscall that
// code outside internal/ needs: the signals that ask a process to stop, and
// a process group of its own for a child, so that only internal/ imports
// syscall.
package proc

import (
	"os"
	"os/exec"
	"syscall"
)

// Terminate is SIGTERM, what a service manager sends to stop a process.
var Terminate os.Signal = syscall.SIGTERM

// StopSignals are the signals a command treats as a request to stop:
// Ctrl-C (SIGINT) and SIGTERM.
var StopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// OwnGroup makes cmd start in a process group of its own, so that signals
// sent to the caller's terminal group (Ctrl-C on a test run) do not reach
// it and the caller decides when it stops. Call it before cmd.Start.
func OwnGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}
