package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPerfParamsCheck(t *testing.T) {
	good := perfParams{Op: "write", Test: "bw"}
	good.defaults()
	if err := good.check(); err != nil || good.Size != 65536 || good.Iters != 5000 || good.Depth != 128 {
		t.Fatalf("defaults %+v: %v", good, err)
	}
	lat := perfParams{Op: "send", Test: "lat"}
	lat.defaults()
	if lat.Size != 8 || lat.Iters != 1000 {
		t.Errorf("latency defaults %+v", lat)
	}
	for _, c := range []struct {
		p    perfParams
		want int
	}{
		{perfParams{Op: "write", Test: "lat", Inline: -1}, 220},
		{perfParams{Op: "send", Test: "lat", Inline: -1}, 236},
		{perfParams{Op: "read", Test: "lat", Inline: -1}, 0},
		{perfParams{Op: "write", Test: "bw", Inline: -1}, 0},
		{perfParams{Op: "write", Test: "bw", Inline: 64}, 64},
		{perfParams{Op: "send", Test: "lat", Inline: 0}, 0},
	} {
		if got := c.p.inlineSize(); got != c.want {
			t.Errorf("%+v: inline %d, want %d", c.p, got, c.want)
		}
	}
	for _, cq := range []string{"", "auto", "poll", "event"} {
		ok := perfParams{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, CQMod: 1, CQ: cq, Spin: 100}
		if err := ok.check(); err != nil {
			t.Errorf("check(%+v): %v", ok, err)
		}
	}
	for _, bad := range []perfParams{
		{Op: "atomic", Test: "bw", Size: 8, Iters: 1, Depth: 1},
		{Op: "write", Test: "both", Size: 8, Iters: 1, Depth: 1},
		{Op: "write", Test: "bw", Size: 4, Iters: 1, Depth: 1},
		{Op: "write", Test: "bw", Size: 2 << 30, Iters: 1, Depth: 1},
		{Op: "write", Test: "bw", Size: 8, Iters: 0, Depth: 1},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 5000},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, MTU: 1500},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, CQ: "spin"},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, CQ: "event", Spin: -1},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, CQMod: -1},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, QPTimeout: 32},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, Warmup: -1},
		{Op: "write", Test: "bw", Size: 8, Iters: 1, Depth: 1, Inline: -2},
		{Op: "read", Test: "lat", Size: 8, Iters: 1, Depth: 1, Inline: 64},
	} {
		if bad.CQMod == 0 {
			bad.CQMod = 1 // each case breaks one rule only
		}
		if err := bad.check(); err == nil {
			t.Errorf("check(%+v) accepted", bad)
		}
	}
}

func TestLatStats(t *testing.T) {
	var times []time.Duration
	for i := 1; i <= 1000; i++ {
		times = append(times, time.Duration(i)*time.Microsecond)
	}
	var r perfResult
	latStats(&r, times, 2)
	if r.MinUS != 0.5 || r.MaxUS != 500 || r.TypicalUS != 250.5 || r.AvgUS != 250.25 || r.P99US != 495 || r.P999US != 499.5 {
		t.Errorf("stats %+v", r)
	}
}

func TestReadJSONLine(t *testing.T) {
	var h perfHello
	if err := readJSONLine(bufio.NewReader(strings.NewReader(`{"params":{"op":"read"}}`+"\n")), &h); err != nil || h.Params.Op != "read" {
		t.Errorf("good line: %+v %v", h, err)
	}
	for name, in := range map[string]string{
		"eof":       `{"params":`,
		"malformed": "not json\n",
		"too long":  strings.Repeat("x", 70000) + "\n",
	} {
		if err := readJSONLine(bufio.NewReaderSize(strings.NewReader(in), 65536), &h); !errors.Is(err, errPerfPeer) {
			t.Errorf("%s: %v, want errPerfPeer", name, err)
		}
	}
}

func FuzzReadJSONLine(f *testing.F) {
	f.Add([]byte(`{"params":{"op":"write","test":"bw","size":65536,"iters":10,"depth":4},"info":{"qpn":17,"gid":[0,0,0,0,0,0,0,0,0,0,255,255,10,0,1,1]}}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h perfHello
		if readJSONLine(bufio.NewReader(bytes.NewReader(b)), &h) != nil {
			return
		}
		_ = h.Params.check() // must not panic on anything that decodes
	})
}

func TestPrintPerf(t *testing.T) {
	var b bytes.Buffer
	r := perfResult{Device: "rxe0", Peer: "rxe1", Op: "write", Test: "bw", Bytes: 65536, Iters: 10, MTU: 1024, MBps: 12.5, Mpps: 0.0002}
	if err := printPerf(&b, r, false); err != nil || !strings.Contains(b.String(), "BW average[MB/sec]") || !strings.Contains(b.String(), "12.50") {
		t.Errorf("bw table:\n%s", b.String())
	}
	b.Reset()
	if err := printPerf(&b, r, true); err != nil {
		t.Fatal(err)
	}
	var back perfResult
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back != r {
		t.Errorf("json %s -> %+v %v", b.String(), back, err)
	}
}

func TestPerfUsage(t *testing.T) {
	for _, args := range [][]string{
		{"perf"}, {"perf", "-d", "rxe0"}, {"perf", "-d", "rxe0", "-peer", "rxe1", "-server"},
		{"perf", "-d", "rxe0", "-peer", "rxe1", "-op", "bogus"}, {"perf", "-no-such-flag"},
		{"perf", "-d", "rxe0", "-peer", "rxe1", "-cq", "bogus"},
		{"devices", "extra-arg"}, {"devices", "-no-such-flag"},
	} {
		if got := run(args); got != 2 {
			t.Errorf("te %v: exit %d, want 2", args, got)
		}
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
