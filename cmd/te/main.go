// Command te is the transfer engine's one CLI: devices, bench, serve,
// segments, perf and more. Each subcommand lives in its own file and
// registers itself in init, so areas of the engine add commands without
// touching this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/rdmago/te/internal/proc"
)

// command is one subcommand of te.
type command struct {
	name    string
	summary string
	// run parses args (without the subcommand name) and does the work.
	// It returns errUsage for bad flags, which prints usage and exits 2.
	run func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

// register adds a subcommand; called from init functions.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("te: duplicate command " + c.name)
	}
	commands[c.name] = c
}

var errUsage = errors.New("usage")

func usage() {
	fmt.Fprintf(os.Stderr, "usage: te <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nrun 'te <command> -h' for a command's flags\n")
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "te: unknown command %q\n", args[0])
		usage()
		return 2
	}
	// Stop signals are caught before the command does anything, and the
	// command cannot swallow them: see supervise.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, proc.StopSignals...)
	defer signal.Stop(sigs)
	err := supervise(sigs, stopGrace, func(ctx context.Context) error { return c.run(ctx, args[1:]) })
	if err != nil {
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(os.Stderr, "te %s: %v\n", c.name, err)
		return 1
	}
	return 0
}

// stopGrace is how long a command may take to stop after SIGINT or
// SIGTERM before te exits without it.
const stopGrace = 10 * time.Second

// errNotStopped: a command went on past stopGrace after a stop signal, or
// a second stop signal came.
var errNotStopped = errors.New("did not stop in time")

// supervise runs fn with a context that ends at the first signal on sigs.
// fn then has grace to return (and clean up); a second signal or the end
// of grace returns errNotStopped without waiting for it any longer, so a
// command blocked where it does not watch its context (an open(2) that
// waits, a peer that never answers) still ends on SIGTERM.
func supervise(sigs <-chan os.Signal, grace time.Duration, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	var first os.Signal
	var deadline <-chan time.Time
	for {
		select {
		case err := <-done:
			return err
		case s := <-sigs:
			if first != nil {
				return fmt.Errorf("%w: second signal (%v)", errNotStopped, s)
			}
			first = s
			cancel()
			t := time.NewTimer(grace)
			defer t.Stop()
			deadline = t.C
		case <-deadline:
			return fmt.Errorf("%w: still running %v after %v", errNotStopped, grace, first)
		}
	}
}

// newFlags returns a FlagSet for a subcommand that reports errors instead
// of exiting, so run can map them to exit status 2.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("te "+name, flag.ContinueOnError)
	return fs
}
