package perftest

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParamsCheck(t *testing.T) {
	good := Params{Op: OpWrite, Test: TestBW}
	good.Defaults()
	if err := good.Check(); err != nil || good.Size != 65536 || good.Iters != 5000 || good.Depth != 128 {
		t.Fatalf("defaults %+v: %v", good, err)
	}
	lat := Params{Op: OpSend, Test: TestLat}
	lat.Defaults()
	if lat.Size != 8 || lat.Iters != 1000 {
		t.Errorf("latency defaults %+v", lat)
	}
	for _, c := range []struct {
		p    Params
		want int
	}{
		{Params{Op: OpWrite, Test: TestLat, Inline: -1}, 220},
		{Params{Op: OpSend, Test: TestLat, Inline: -1}, 236},
		{Params{Op: OpRead, Test: TestLat, Inline: -1}, 0},
		{Params{Op: OpWrite, Test: TestBW, Inline: -1}, 0},
		{Params{Op: OpWrite, Test: TestBW, Inline: 64}, 64},
		{Params{Op: OpSend, Test: TestLat, Inline: 0}, 0},
	} {
		if got := c.p.InlineSize(); got != c.want {
			t.Errorf("%+v: inline %d, want %d", c.p, got, c.want)
		}
	}
	for _, cq := range []string{"", "auto", "poll", "event"} {
		ok := Params{Op: OpWrite, Test: TestBW, Size: 2, Iters: 1, Depth: 1, CQMod: 1, CQ: cq, Spin: 100, Duration: time.Second}
		if err := ok.Check(); err != nil {
			t.Errorf("Check(%+v): %v", ok, err)
		}
	}
	for _, bad := range []Params{
		{Op: "atomic", Test: TestBW, Size: 8, Iters: 1, Depth: 1},
		{Op: OpWrite, Test: "both", Size: 8, Iters: 1, Depth: 1},
		{Op: OpWrite, Test: TestBW, Size: 0, Iters: 1, Depth: 1},
		{Op: OpWrite, Test: TestLat, Size: 4, Iters: 1, Depth: 1},
		{Op: OpWrite, Test: TestBW, Size: 2 << 30, Iters: 1, Depth: 1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 0, Depth: 1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 5000},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, MTU: 1500},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, CQ: "spin"},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, CQ: "event", Spin: -1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, CQMod: -1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, QPTimeout: 32},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, Warmup: -1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, Inline: -2},
		{Op: OpRead, Test: TestLat, Size: 8, Iters: 1, Depth: 1, Inline: 64},
		{Op: OpWrite, Test: TestLat, Size: 8, Iters: 1, Depth: 1, Duration: time.Second},
		{Op: OpSend, Test: TestBW, Size: 8, Iters: 1, Depth: 1, Duration: time.Second},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, Duration: -1},
		{Op: OpWrite, Test: TestBW, Size: 8, Iters: 1, Depth: 1, Region: -1},
	} {
		if bad.CQMod == 0 {
			bad.CQMod = 1 // each case breaks one rule only
		}
		if err := bad.Check(); err == nil {
			t.Errorf("Check(%+v) accepted", bad)
		}
	}
}

func TestAllSizes(t *testing.T) {
	bw, lat := AllSizes(TestBW), AllSizes(TestLat)
	if len(bw) != 23 || bw[0] != 2 || bw[22] != MaxAllSize || len(lat) != 21 || lat[0] != 8 {
		t.Errorf("bw %v lat %v", bw, lat)
	}
}

func TestLatStats(t *testing.T) {
	var times []time.Duration
	for i := 1; i <= 1000; i++ {
		times = append(times, time.Duration(i)*time.Microsecond)
	}
	var r Result
	LatStats(&r, times, 2)
	if r.MinUS != 0.5 || r.MaxUS != 500 || r.TypicalUS != 250.5 || r.AvgUS != 250.25 || r.P99US != 495 || r.P999US != 499.5 {
		t.Errorf("stats %+v", r)
	}
	var one Result
	LatStats(&one, times[:1], 1)
	LatStats(&one, nil, 1) // no samples: no panic, nothing set
	if one.P99US != 1 || one.P999US != 1 {
		t.Errorf("one sample: %+v", one)
	}
	if g := (Result{MBps: 1000}).Gbps(); g < 8.38 || g > 8.39 {
		t.Errorf("Gbps %v", g)
	}
}

func TestReadJSONLine(t *testing.T) {
	var h hello
	if err := ReadJSONLine(bufio.NewReader(strings.NewReader(`{"params":{"op":"read"}}`+"\n")), &h); err != nil || h.Params.Op != "read" {
		t.Errorf("good line: %+v %v", h, err)
	}
	for name, in := range map[string]string{
		"eof":       `{"params":`,
		"malformed": "not json\n",
		"too long":  strings.Repeat("x", 70000) + "\n",
	} {
		if err := ReadJSONLine(bufio.NewReaderSize(strings.NewReader(in), 65536), &h); !errors.Is(err, ErrPeer) {
			t.Errorf("%s: %v, want ErrPeer", name, err)
		}
	}
}

func FuzzReadJSONLine(f *testing.F) {
	f.Add([]byte(`{"params":{"op":"write","test":"bw","size":65536,"iters":10,"depth":4},"info":{"qpn":17,"gid":[0,0,0,0,0,0,0,0,0,0,255,255,10,0,1,1]}}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hello
		if ReadJSONLine(bufio.NewReader(bytes.NewReader(b)), &h) != nil {
			return
		}
		_ = h.Params.Check() // must not panic on anything that decodes
	})
}

func TestPeerVersion(t *testing.T) {
	for in, want := range map[string]bool{teVersion: true, perftestVer: false, "5.70": false, "": false} {
		v, te := peerVersion(versionBytes(in))
		if v != in || te != want {
			t.Errorf("%q: %q %v", in, v, te)
		}
	}
}
