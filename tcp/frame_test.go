package tcp

import (
	"bytes"
	"errors"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{op: opWrite, id: 1, addr: 1 << 40, length: 4096},
		{op: opWrite, flags: flagMore, id: 2, addr: 1 << 40, length: 4096},
		{op: opRead, id: 1<<64 - 1, addr: 42, length: maxPayload},
		{op: opWrite | opReply, status: statusOutOfRange, id: 3},
		{op: opRead | opReply, id: 9, length: 17},
	} {
		var b [headerLen]byte
		h.encode(b[:])
		got, err := decodeHeader(b[:])
		if err != nil || got != h {
			t.Errorf("%v: decoded %v, %v", h, got, err)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	good := func() []byte {
		var b [headerLen]byte
		(&header{op: opWrite, id: 1, addr: 2, length: 3}).encode(b[:])
		return b[:]
	}
	cases := []struct {
		name string
		mut  func(b []byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:headerLen-1] }, errShort},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, errMagic},
		{"version", func(b []byte) []byte { b[2] = 1; return b }, errVersion},
		{"op", func(b []byte) []byte { b[3] = 9; return b }, errOp},
		{"reply op", func(b []byte) []byte { b[3] = 0x80; return b }, errOp},
		{"flags", func(b []byte) []byte { b[7] = 1; return b }, errFlags},
		{"unknown flag", func(b []byte) []byte { b[6] = 2; return b }, errFlags},
		{"flag on a reply", func(b []byte) []byte { b[3] |= byte(opReply); b[6] = 1; return b }, errFlags},
		{"status in request", func(b []byte) []byte { b[4] = 1; return b }, errStatus},
		{"length", func(b []byte) []byte { b[24+4] = 0x40; return b }, errLength},
		{"old hello op", func(b []byte) []byte { b[3] = 1; return b }, errOp},
	}
	for _, c := range cases {
		if _, err := decodeHeader(c.mut(good())); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestDecodeHeaderAllocs(t *testing.T) {
	var b [headerLen]byte
	(&header{op: opRead, id: 1, addr: 2, length: 3}).encode(b[:])
	if n := testing.AllocsPerRun(100, func() { decodeHeader(b[:]) }); n != 0 {
		t.Fatalf("decodeHeader allocates %v times", n)
	}
}

// FuzzDecodeHeader: never panics; a header that decodes re-encodes to the
// same bytes and satisfies every invariant the receiver relies on.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []header{
		{op: opWrite | opReply, status: statusOutOfRange, id: 7},
		{op: opWrite, id: 1, addr: 1 << 40, length: 4096},
		{op: opRead | opReply, status: statusBusy, id: 2},
	} {
		var b [headerLen]byte
		h.encode(b[:])
		f.Add(b[:])
	}
	f.Add([]byte("TE"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			if h != (header{}) {
				t.Fatalf("error %v with a non-zero header %v", err, h)
			}
			return
		}
		if h.length > maxPayload {
			t.Fatalf("accepted length %d", h.length)
		}
		if h.op&opReply == 0 && h.status != statusOK {
			t.Fatalf("accepted a request with status %d", h.status)
		}
		var out [headerLen]byte
		h.encode(out[:])
		if !bytes.Equal(out[:], b[:headerLen]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", out, b[:headerLen])
		}
	})
}
