package mooncake

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// An active side's record as Mooncake writes it (keys sorted, compact,
// one newline), and the empty record a TCP-only Mooncake target answers a
// Connection message with.
const (
	hsActive = `{"local_gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:01:01","local_lid":0,"local_nic_path":"10.0.1.1:15001@rxe0","payload":"","peer_nic_path":"10.0.1.2:16002@rxe1","qp_num":[17,18],"ready_ack":false,"reply_msg":""}` + "\n"
	hsEmpty  = `{"local_gid":"","local_lid":0,"local_nic_path":"","payload":"","peer_nic_path":"","qp_num":[],"reply_msg":""}` + "\n"
)

func TestHandshakeMooncakeForm(t *testing.T) {
	h, err := DecodeHandshake([]byte(hsActive))
	if err != nil {
		t.Fatal(err)
	}
	want := &Handshake{LocalNICPath: "10.0.1.1:15001@rxe0", PeerNICPath: "10.0.1.2:16002@rxe1",
		LocalGID: netip.MustParseAddr("::ffff:10.0.1.1"), QPNums: []uint32{17, 18}, ReadyAckSupported: true}
	if diff := cmp.Diff(want, h, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("decoded (-want +got):\n%s", diff)
	}
	for _, in := range []string{hsActive, hsEmpty} {
		h, err := DecodeHandshake([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		out, err := h.Encode()
		if err != nil || string(out) != in {
			t.Errorf("re-encoded %q as\n%s(err %v)", in, out, err)
		}
	}
	if h, _ := DecodeHandshake([]byte(hsEmpty)); h.ReadyAckSupported || h.LocalGID.IsValid() {
		t.Errorf("a record without ready_ack or local_gid decoded as %+v", h)
	}
	ack := *want
	ack.ReadyAck = true
	out, _ := ack.Encode()
	if !strings.Contains(string(out), `"ready_ack":true`) {
		t.Errorf("a ready-ack record encodes as %s", out)
	}
}

func TestHandshakeRefused(t *testing.T) {
	for in, field := range map[string]string{
		`[]`:                            "not a JSON object",
		`null`:                          "null",
		`{"local_lid":65536}`:           "local_lid",
		`{"local_lid":"1"}`:             "local_lid",
		`{"local_gid":"fe80::1%eth0"}`:  "local_gid",
		`{"local_gid":"00:11"}`:         "local_gid",
		`{"local_nic_path":"nodevice"}`: "local_nic_path",
		`{"peer_nic_path":"@rxe0"}`:     "peer_nic_path",
		`{"qp_num":[16777216]}`:         "qp_num[0]",
		`{"qp_num":[-1]}`:               "qp_num[0]",
		`{"qp_num":"1"}`:                "qp_num",
		`{"qp_num":[` + strings.Repeat("1,", 64) + `1]}`: "more than 64",
		`{"ready_ack":1}`: "ready_ack",
		`{"reply_msg":5}`: "reply_msg",
	} {
		_, err := DecodeHandshake([]byte(in))
		if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v, want ErrHandshake naming %s", in, err, field)
		}
	}
	if _, err := DecodeHandshake([]byte(`{"qp_num":[1],"x":"` + strings.Repeat("a", 70<<10) + `"}`)); !errors.Is(err, ErrHandshake) {
		t.Errorf("an oversized record: %v", err)
	}
}

func TestNICPath(t *testing.T) {
	s, d, err := SplitNICPath(NICPath("10.0.0.1:15000", "mlx5_0"))
	if err != nil || s != "10.0.0.1:15000" || d != "mlx5_0" {
		t.Errorf("SplitNICPath = %q, %q, %v", s, d, err)
	}
	if s, d, _ := SplitNICPath("a@b@c"); s != "a" || d != "b@c" {
		t.Errorf("split at the first @, as Mooncake: %q %q", s, d)
	}
}

// FuzzDecodeHandshake: no input panics; whatever decodes re-encodes and
// decodes to the same record.
func FuzzDecodeHandshake(f *testing.F) {
	f.Add([]byte(hsActive))
	f.Add([]byte(hsEmpty))
	f.Add([]byte(`{"qp_num":[1.0e3],"local_gid":"::ffff:1.2.3.4","ready_ack":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHandshake(b)
		if err != nil {
			return
		}
		enc, err := h.Encode()
		if err != nil {
			t.Fatalf("decoded but cannot encode: %v", err)
		}
		h2, err := DecodeHandshake(enc)
		if err != nil {
			t.Fatalf("own encoding refused: %v\n%s", err, enc)
		}
		if diff := cmp.Diff(h, h2, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
