package perftest

import (
	"bytes"
	"errors"
	"math"
	"net"
	"strings"
	"testing"

	"github.com/rdmago/te/uverbs"
)

func TestKeyMsg(t *testing.T) {
	in := Info{LID: 0x12, OutReads: 16, QPN: 0x11, PSN: 0xabcdef, RKey: 0xdeadbeef, Addr: 0x7f0011223344,
		GID: uverbs.GID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 1}}
	b := keyMsg(in, true)
	// perftest's KEY_PRINT_FMT_GID, as its server prints and parses it
	want := "0012:0010:000011:abcdef:deadbeef:00007f0011223344:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:01:00000000:"
	if len(b) != keyMsgGID || string(b[:len(want)]) != want || b[len(want)] != 0 {
		t.Fatalf("key message %q (%d bytes)", b, len(b))
	}
	out, err := parseKeyMsg(b, true)
	if err != nil || out != in {
		t.Errorf("round trip: %+v %v", out, err)
	}
	in.GID = uverbs.GID{}
	b = keyMsg(in, false)
	if len(b) != keyMsgNoGID || !strings.HasPrefix(string(b), "0012:0010:000011:abcdef:deadbeef:00007f0011223344:00000000\x00") {
		t.Fatalf("key message without GID %q (%d bytes)", b, len(b))
	}
	if out, err := parseKeyMsg(b, false); err != nil || out != in {
		t.Errorf("round trip without GID: %+v %v", out, err)
	}
	for _, bad := range []string{"", "zz:0010:000011:abcdef:deadbeef:0:0", "1:2:3:4:5:6", "10000:0:0:0:0:0:0"} {
		if _, err := parseKeyMsg([]byte(bad), false); !errors.Is(err, ErrPeer) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func FuzzParseKeyMsg(f *testing.F) {
	f.Add(keyMsg(Info{QPN: 17, GID: uverbs.GID{15: 1}}, true), true)
	f.Add(keyMsg(Info{QPN: 17}, false), false)
	f.Fuzz(func(t *testing.T, b []byte, gid bool) {
		in, err := parseKeyMsg(b, gid)
		if err != nil {
			return
		}
		if out, err := parseKeyMsg(keyMsg(in, gid), gid); err != nil || out != in {
			t.Errorf("%q: re-encoded %+v %v, want %+v", b, out, err, in)
		}
	})
}

// TestExchangeSteps runs the report and key steps of both roles against
// each other over a socket pair: each role's order matches the other's.
func TestExchangeSteps(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cli, srv := ptConn{w: a, r: a, client: true}, ptConn{w: b, r: b}
	mine := ptReport{size: 65536, iters: 5000, peak: 1234.5, avg: 1200.25, msgRate: 0.019}
	type res struct {
		rep ptReport
		in  Info
		err error
	}
	done := make(chan res, 1)
	go func() {
		in, err := srv.keys(Info{QPN: 2}, true)
		if err != nil {
			done <- res{err: err}
			return
		}
		rep, err := srv.report(ptReport{})
		done <- res{rep, in, err}
	}()
	in, err := cli.keys(Info{QPN: 1, OutReads: 16}, true)
	if err != nil || in.QPN != 2 {
		t.Fatalf("client keys: %+v %v", in, err)
	}
	rep, err := cli.report(mine)
	if err != nil || rep != (ptReport{}) {
		t.Fatalf("client report: %+v %v", rep, err)
	}
	r := <-done
	if r.err != nil || r.in.QPN != 1 || r.in.OutReads != 16 || r.rep != mine {
		t.Fatalf("server: %+v", r)
	}
	// the wire form of a report field: big-endian IEEE 754, as perftest's hton_double
	var buf bytes.Buffer
	c := ptConn{w: &buf, r: bytes.NewReader(make([]byte, 40)), client: true}
	if _, err := c.report(ptReport{peak: 1}); err != nil {
		t.Fatal(err)
	}
	if got := buf.Bytes()[16:24]; !bytes.Equal(got, []byte{0x3f, 0xf0, 0, 0, 0, 0, 0, 0}) || math.Float64frombits(0x3ff0000000000000) != 1 {
		t.Errorf("peak on the wire % x", got)
	}
}
