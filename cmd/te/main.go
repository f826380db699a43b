// Command te is the transfer engine's one CLI: devices, bench, serve,
// segments, perf and more. Each subcommand lives in its own file and
// registers itself in init, so areas of the engine add commands without
// touching this file. The conventions every command follows (flags, help,
// sizes, --json) are package internal/cli's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sort"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/proc"
)

// command is one subcommand of te.
type command struct {
	name    string
	summary string
	// run parses args (without the subcommand name) and does the work. It
	// returns a *cli.UsageError for a mistake on the command line (exit
	// 2), cli.ErrHelp after printing the help (exit 0).
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

// errUsage is returned by commands that printed their own usage message;
// it exits 2.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: te <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n  %-10s %s\n", "help", "te help COMMAND: a command's flags", "version", "the build: version, commit, Go version, build flags")
	fmt.Fprintf(w, "\nrun 'te help <command>' (or te <command> -h) for a command's flags\n")
}

func main() {
	// Package log's lines (the Consul store's events name keys and quote
	// errors that others' writes caused) are escaped and cut like slog's.
	log.SetOutput(cli.LogWriter(os.Stderr))
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int { return runIO(args, os.Stdout, os.Stderr) }

// runIO runs te with args and returns the exit status.
func runIO(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "-help":
		usage(stdout)
		return 0
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		return runIO([]string{args[1], "-h"}, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprint(stdout, cli.ReadBuild())
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		names := []string{"help", "version"}
		for n := range commands {
			names = append(names, n)
		}
		msg := fmt.Sprintf("te: unknown command %s", cli.Printable(args[0]))
		if s := cli.Suggest(args[0], names); len(s) > 0 {
			msg += "; did you mean " + s[0] + "?"
		}
		fmt.Fprintf(stderr, "%s\nrun 'te help' for the commands\n", msg)
		return 2
	}
	// Stop signals are caught before the command does anything, and the
	// command cannot swallow them: see supervise.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, proc.StopSignals...)
	defer signal.Stop(sigs)
	err := supervise(sigs, stopGrace, func(ctx context.Context) error { return c.run(ctx, args[1:]) })
	return exitCode(c.name, err, stderr)
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

// exitCode prints err as te does and says how to exit: 0 for none or
// after -h, 2 for a mistake on the command line (with a short usage), 1
// for the rest, on one line.
func exitCode(name string, err error, stderr io.Writer) int {
	var ue *cli.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprint(stderr, ue.Lines())
		return 2
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "te %s: %s\n", name, cli.ErrorLine(explain(err)))
	return 1
}
