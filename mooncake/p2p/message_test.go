package p2p

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/rdmago/te/engine/driver"
)

// TestFraming checks the bytes of the framing against the reference's
// capture of a live Mooncake target: a Probe reply is
// 16 00 00 00 00 00 00 00 03 {"status":"success"}\n, and the length
// counts the type byte.
func TestFraming(t *testing.T) {
	got := AppendMessage(nil, Probe, []byte(`{"status":"success"}`+"\n"))
	want, _ := hex.DecodeString("160000000000000003")
	want = append(want, `{"status":"success"}`+"\n"...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got % x\nwant % x", got, want)
	}
	typ, body, err := ReadMessage(bytes.NewReader(got), DefaultMaxMessage)
	if err != nil || typ != Probe || string(body) != `{"status":"success"}`+"\n" {
		t.Fatalf("%v %q %v", typ, body, err)
	}
	// The legacy untyped framing: no type byte, the length counts the body.
	u := AppendMessage(nil, Untyped, []byte(`{"a":1}`))
	if u[0] != 7 || u[8] != '{' {
		t.Fatalf("% x", u)
	}
	typ, body, err = ReadMessage(bytes.NewReader(u), DefaultMaxMessage)
	if err != nil || typ != Untyped || string(body) != `{"a":1}` {
		t.Fatalf("%v %q %v", typ, body, err)
	}
}

func TestReadMessageBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"length 0", make([]byte, 8), ErrTooLarge},
		{"above the bound", append([]byte{1, 0, 0x10, 0, 0, 0, 0, 0}, 1), ErrTooLarge},
		{"big-endian length", []byte{0, 0, 0, 0, 0, 0, 0, 9, 1}, ErrTooLarge},
		{"truncated body", append([]byte{10, 0, 0, 0, 0, 0, 0, 0, 1}, "{}"...), ErrMalformed},
		{"truncated length", []byte{1, 0}, io.ErrUnexpectedEOF},
		{"nothing", nil, io.EOF},
	} {
		_, _, err := ReadMessage(bytes.NewReader(tc.in), DefaultMaxMessage)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A peer announcing 1 MiB and sending 3 bytes costs 3 bytes of memory,
	// not 1 MiB, and fails with a clear error.
	_, _, err := ReadMessage(io.MultiReader(bytes.NewReader([]byte{0, 0, 0x10, 0, 0, 0, 0, 0}), strings.NewReader("\x01{}")), DefaultMaxMessage)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "3 of 1048576 bytes") {
		t.Fatal(err)
	}
}

// FuzzReadMessage: no input panics, and what is read re-encodes to the
// bytes it was read from.
func FuzzReadMessage(f *testing.F) {
	f.Add(AppendMessage(nil, Metadata, []byte("{}\n")))
	f.Add(AppendMessage(nil, Untyped, []byte("{}")))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, body, err := ReadMessage(bytes.NewReader(b), 4096)
		if err != nil {
			return
		}
		again := AppendMessage(nil, typ, body)
		if !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("re-encoded % x from % x", again, b)
		}
	})
}

// FuzzAnswer: the server's reply to any message is a well-formed frame
// of the request's type, or a refusal; never a panic.
func FuzzAnswer(f *testing.F) {
	f.Add(uint8(1), []byte("{}"))
	f.Add(uint8(0), []byte(`{"local_nic_path":"a@b"}`))
	f.Add(uint8(2), []byte(`{"name":"x","notify_msg":"y"}`))
	f.Add(uint8(3), []byte("null"))
	f.Add(uint8(9), []byte("x"))
	s := &Store{life: context.Background()}
	s.opts.setDefaults()
	frame := AppendMessage(nil, Metadata, []byte("{}\n"))
	s.reply.Store(&frame)
	var in countInbox
	s.ReceiveNotifications(&in)
	from := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		reply, err := s.answer(Type(typ), body, from)
		if err != nil {
			return
		}
		rt, _, err := ReadMessage(bytes.NewReader(reply), DefaultMaxMessage)
		if err != nil {
			t.Fatalf("own reply unreadable: %v", err)
		}
		if rt != Type(typ) && !(Type(typ) == Untyped && rt == Untyped) {
			t.Fatalf("reply type %v to %v", rt, Type(typ))
		}
	})
}

// countInbox takes every notification, keeping the last.
type countInbox struct {
	mu   sync.Mutex
	n    int
	last driver.Delivery
}

func (c *countInbox) Deliver(_ context.Context, d *driver.Delivery) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	c.last = driver.Delivery{From: d.From, ID: d.ID, Name: bytes.Clone(d.Name), Msg: bytes.Clone(d.Msg)}
	return nil
}

// FuzzDecodeNotify: no input panics; what decodes re-encodes to the same
// record, within the bounds.
func FuzzDecodeNotify(f *testing.F) {
	f.Add([]byte(`{"name":"agent1","notify_msg":"notification7"}` + "\n"))
	f.Add([]byte(`{"name":"","notify_msg":"success"}`))
	f.Add([]byte(`{"name":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeNotify(b)
		if err != nil {
			return
		}
		if len(r.Name) > MaxNotifyName || len(r.NotifyMsg) > MaxNotifyMsg {
			t.Fatalf("decoded past the bounds: %d, %d bytes", len(r.Name), len(r.NotifyMsg))
		}
		enc, err := EncodeNotify(r)
		if err != nil {
			t.Fatal(err)
		}
		if r2, err := DecodeNotify(enc); err != nil || r2 != r {
			t.Fatalf("round trip: %+v, %v; want %+v", r2, err, r)
		}
	})
}
