package tcp

import (
	"bytes"
	"errors"
	"net"
	"testing"

	"github.com/rdmago/te/internal/sock"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{op: opWrite, id: 1, addr: 1 << 40, length: 4096},
		{op: opWrite, flags: flagMore, id: 2, addr: 1 << 40, length: 4096},
		{op: opRead, id: 1<<64 - 1, addr: 42, length: maxPayload},
		{op: opWrite | opReply, status: statusOutOfRange, id: 3},
		{op: opRead | opReply, id: 9, length: 17},
		{legacy: true, op: opWrite, id: 4, addr: 5, length: 6},
		{op: opWriteV, flags: flagMore, id: 10, addr: maxVec, length: 1 << 20},
		{op: opReadV | opReply, status: statusVec, id: 10, addr: 1, length: 0},
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
		{"vector in version 2", func(b []byte) []byte { b[2], b[3] = wireLegacy, byte(opWriteV); b[16] = 1; return b }, errOp},
		{"vector of 0", func(b []byte) []byte { b[3] = byte(opReadV); b[16] = 0; return b }, errVec},
		{"vector too long", func(b []byte) []byte { b[3] = byte(opWriteV); b[16], b[17] = 1, 1; return b }, errVec},
	}
	for _, c := range cases {
		if _, err := decodeHeader(c.mut(good())); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestCheckEntries(t *testing.T) {
	b := make([]byte, 3*entryLen)
	for i, l := range []uint64{4096, 0, 1 << 20} {
		putEntry(b[i*entryLen:], uint64(i)<<40, l)
	}
	if a, l := entry(b, 2); a != 2<<40 || l != 1<<20 {
		t.Fatalf("entry 2: %#x %d", a, l)
	}
	if err := checkEntries(b, 3, 4096+1<<20); err != nil {
		t.Fatal(err)
	}
	for _, total := range []uint64{4096 + 1<<20 - 1, 4096 + 1<<20 + 1, 0} {
		if err := checkEntries(b, 3, total); !errors.Is(err, errVecSum) {
			t.Errorf("total %d: %v", total, err)
		}
	}
	// Entries whose sum wraps around 64 bits do not add up.
	putEntry(b, 0, 1<<64-1)
	putEntry(b[entryLen:], 0, 2)
	if err := checkEntries(b, 2, 1); !errors.Is(err, errVecSum) {
		t.Errorf("wrapped sum: %v", err)
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
		{op: opWriteV, id: 3, addr: 2, length: 8192},
		{legacy: true, op: opRead, id: 4, length: 1},
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
		if h.vector() && (h.legacy || h.addr == 0 || h.addr > maxVec) {
			t.Fatalf("accepted vector %v", h)
		}
		var out [headerLen]byte
		h.encode(out[:])
		if !bytes.Equal(out[:], b[:headerLen]) {
			t.Fatalf("re-encoding differs:\n%x\n%x", out, b[:headerLen])
		}
	})
}

// TestFrameReaderAfterPayload: after a payload read straight into memory,
// the next header's read brings a small frame behind it along (one
// system call for a note's mark after its data) but draws at most
// afterPayload bytes of a large payload into the buffer; every frame
// parses whole.
func TestFrameReaderAfterPayload(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rw := sock.NewRawIO(1)
	if err := rw.Reset(c.(*net.TCPConn)); err != nil {
		t.Fatal(err)
	}
	fr := newFrameReader(c.(*net.TCPConn), rw)
	big := bytes.Repeat([]byte{7}, 4*directRead)
	small := bytes.Repeat([]byte{9}, 100)
	// Two writes: the small frame starts the second, so its header and
	// payload arrive together.
	var parts [2][]byte
	for i, p := range [][]byte{big, small, big, big} {
		var b [headerLen]byte
		(&header{op: opWrite, id: uint64(i), length: uint64(len(p))}).encode(b[:])
		k := min(i, 1)
		parts[k] = append(append(parts[k], b[:]...), p...)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := w.Write(parts[0])
		if err == nil {
			_, err = w.Write(parts[1])
		}
		werr <- err
	}()
	var hb [headerLen]byte
	for i, want := range [][]byte{big, small, big, big} {
		if err := fr.header(&hb, 0); err != nil {
			t.Fatal(err)
		}
		h, err := decodeHeader(hb[:])
		if err != nil || h.id != uint64(i) || h.length != uint64(len(want)) {
			t.Fatalf("frame %d: header %v, %v", i, h, err)
		}
		if i > 0 && fr.br.Buffered() > afterPayload-headerLen {
			t.Fatalf("frame %d: %d bytes buffered after the header, want at most %d", i, fr.br.Buffered(), afterPayload-headerLen)
		}
		if i == 1 && fr.br.Buffered() < len(small) {
			t.Fatalf("the small frame's payload did not come with its header: %d bytes buffered", fr.br.Buffered())
		}
		got := make([]byte, len(want))
		if err := fr.payload(got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: payload differs", i)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
}
