package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/perftest"
)

// TestParsePerf: perftest's spellings, short and long, before and after
// the host, mean what they mean to perftest.
func TestParsePerf(t *testing.T) {
	a, _, err := parsePerf(strings.Fields("-d rxe0 -x 3 -i 2 10.0.0.2 -s 4096 -n 77 -p 19000 -F --report_gbits -q 1 -t 64 -Q 8 -e"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.dev != (perftest.Device{Name: "rxe0", Port: 2, GIDIndex: 3}) || a.host != "10.0.0.2" || a.port != 19000 || !a.gbits ||
		a.p.Size != 4096 || a.p.Iters != 77 || a.p.Depth != 64 || a.p.CQMod != 8 || a.p.CQ != "event" || a.p.Op != "write" || a.p.Test != "bw" {
		t.Errorf("parsed %+v", a)
	}
	a, _, err = parsePerf(strings.Fields("--ib-dev=mlx5_0 --gid-index=1 --duration 5 --all --op read"), io.Discard)
	if err != nil || a.dev.GIDIndex != 1 || a.p.Duration != 5*time.Second || !a.all || a.host != "" || a.p.Op != "read" || a.port != 18515 {
		t.Errorf("long spellings: %+v %v", a, err)
	}
	a, _, err = parsePerf(strings.Fields("-d rxe0 --peer rxe1 --peer-x 1 --lat --inline_size 16"), io.Discard)
	if err != nil || a.peer != (perftest.Device{Name: "rxe1", Port: 1, GIDIndex: 1}) || a.p.Test != "lat" || a.p.Size != 8 || a.p.Warmup != 0 || a.p.Inline != 16 {
		t.Errorf("in-process latency: %+v %v", a, err)
	}
	for args, want := range map[string]string{
		"":                              "-d DEV is required",
		"-d rxe0 -g":                    "multicast",
		"-d rxe0 -R host":               "rdma_cm",
		"-d rxe0 -b host":               "one direction",
		"-d rxe0 -q 2":                  "one queue pair",
		"-d rxe0 -c UD":                 "RC only",
		"-d rxe0 a b":                   "one server host",
		"-d rxe0 --peer rxe1 host":      "takes no server host",
		"-d rxe0 -a -s 8":               "leave out -s",
		"-d rxe0 -s 0 --lat -n 1 -s 4":  "-s 4",
		"-d rxe0 --op bogus":            `--op "bogus"`,
		"-d rxe0 -D 5 --lat":            "-D",
		"-d rxe0 -p 70000":              "-p 70000",
		"-d rxe0 --cq spin":             `--cq "spin"`,
		"-d rxe0 -i 0":                  "-i 0",
		"-d rxe0 --sise 8":              "unknown flag --sise; did you mean --size?",
		"-d rxe0 -m 1500":               "-m 1500",
		"-d rxe0 --op read -I 64 --lat": "RDMA READ has no inline",
		"-d rxe0 -server":               "te perf without a HOST is the server",
		"-d rxe0 -connect 10.0.0.2":     "give the server host as the argument: te perf -d DEV HOST",
	} {
		var ue *cli.UsageError
		if _, _, err := parsePerf(strings.Fields(args), io.Discard); !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
			t.Errorf("te perf %s: %v; want a usage error with %q", args, err, want)
		}
	}
	var out bytes.Buffer
	if _, _, err := parsePerf([]string{"-d", "x", "-h"}, &out); !errors.Is(err, cli.ErrHelp) || !strings.Contains(out.String(), "--report_gbits") {
		t.Errorf("-h: %v %q", err, out.String())
	}
}

// TestPerfJSON: --json is te's one envelope, with perftest's flags by
// their long names and the results as an array.
func TestPerfJSON(t *testing.T) {
	_, fs, err := parsePerf(strings.Fields("-d rxe0 -x 1 -s 4096 --json 10.0.0.2"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rep := cli.NewReport[perftest.Result](fs)
	want := perftest.Result{Device: "rxe0", Peer: "rxe1", Op: "write", Test: "bw", Bytes: 4096, Iters: 5000, MTU: 1024, MBps: 12.5, Mpps: 0.003}
	rep.Results = []perftest.Result{want}
	var b bytes.Buffer
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	got := decodeReport[perftest.Result](t, "perf", b.Bytes())
	if len(got) != 1 || got[0] != want {
		t.Errorf("results %+v", got)
	}
	r, _ := cli.ParseReport(b.Bytes())
	if r.Flags["gid_index"] != 1.0 || r.Flags["size"] != 4096.0 || r.Flags["ib_dev"] != "rxe0" || r.Flags["report_gbits"] != false {
		t.Errorf("flags %v", r.Flags)
	}
}

func TestPerfPrinter(t *testing.T) {
	var b bytes.Buffer
	r := perftest.Result{Device: "rxe0", Peer: "rxe1", Op: "write", Test: "bw", Bytes: 65536, Iters: 10, MTU: 1024, MBps: 12.5, Mpps: 0.0002}
	p := &perfPrinter{w: &b}
	p.print(r)
	r.Bytes = 131072
	p.print(r)
	if s := b.String(); strings.Count(s, "BW average[MB/sec]") != 1 || !strings.Contains(s, "12.50") || !strings.Contains(s, " 131072 ") {
		t.Errorf("bw table:\n%s", s)
	}
	b.Reset()
	(&perfPrinter{w: &b, gbits: true}).print(r)
	if s := b.String(); !strings.Contains(s, "BW average[Gb/sec]") || !strings.Contains(s, " 0.10 ") {
		t.Errorf("Gb/s table:\n%s", s)
	}
	b.Reset()
	lat := perftest.Result{Op: "send", Test: "lat", Bytes: 8, Iters: 3, TypicalUS: 4.5, PreemptPerS: 12}
	(&perfPrinter{w: &b}).print(lat)
	if s := b.String(); !strings.Contains(s, "t_typical[usec]") || !strings.Contains(s, "4.50") || !strings.Contains(s, "preempted 12") {
		t.Errorf("lat table:\n%s", s)
	}
}

func TestPerfUsage(t *testing.T) {
	for _, args := range [][]string{
		{"perf"}, {"perf", "-d", "rxe0", "-peer", "rxe1", "host"},
		{"perf", "-d", "rxe0", "-peer", "rxe1", "-op", "bogus"}, {"perf", "-no-such-flag"},
		{"perf", "-d", "rxe0", "-peer", "rxe1", "-cq", "bogus"},
		{"devices", "extra-arg"}, {"devices", "-no-such-flag"}, {"rxe"}, {"rxe", "add"}, {"rxe", "del", "a", "b"},
		{"rxe", "del", "rxe0", "--name", "x"},
	} {
		if got := run(args); got != 2 {
			t.Errorf("te %v: exit %d, want 2", args, got)
		}
	}
}

// TestPerfNoDevice: a server on a device that is not there fails at once
// (it used to wait for a client first).
func TestPerfNoDevice(t *testing.T) {
	done := make(chan int, 1)
	go func() { done <- run([]string{"perf", "-d", "no-such-dev9", "-p", "18999"}) }()
	select {
	case got := <-done:
		if got != 1 {
			t.Errorf("exit %d, want 1", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("te perf -d no-such-dev9 (server) still running after 10 s")
	}
	if _, err := lookupDevice("no-such-dev9"); err == nil || !strings.Contains(err.Error(), `no RDMA device "no-such-dev9"`) {
		t.Errorf("lookupDevice: %v", err)
	}
}

func TestGUIDFormat(t *testing.T) {
	if g := guid(0x5c6c1bfffebcf664); g != "5c6c:1bff:febc:f664" {
		t.Errorf("guid = %s", g)
	}
	if s := activeSpeed(8); s != "10.0 Gbps (8)" {
		t.Errorf("speed %s", s)
	}
}
