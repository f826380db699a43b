package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

var testProto = Proto{
	Name:    "test",
	Magic:   [4]byte{'T', 'E', 'S', 'T'},
	Version: 2,
	Limit: func(t Type) (int, bool) {
		switch t {
		case 1:
			return 16, true
		case 2:
			return 1 << 20, true
		}
		return 0, false
	},
}

func TestRoundTrip(t *testing.T) {
	var e Enc
	e.U8(7)
	e.U16(0xbeef)
	e.U32(0xdeadbeef)
	e.U64(1 << 60)
	e.String("rxe0")
	e.Bytes([]byte{1, 2, 3})
	e.Fixed([]byte("gid-16-bytes-xyz"))
	frame := testProto.Append(nil, 2, 0x8001, e.B)

	var hdr [HeaderLen]byte
	h, p, err := testProto.Read(bytes.NewReader(frame), hdr[:], nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.Type != 2 || h.Flags != 0x8001 || h.Len != len(e.B) {
		t.Fatalf("header %+v", h)
	}
	d := NewDec(p)
	if d.U8() != 7 || d.U16() != 0xbeef || d.U32() != 0xdeadbeef || d.U64() != 1<<60 ||
		d.String(8) != "rxe0" || !bytes.Equal(d.Bytes(3), []byte{1, 2, 3}) || string(d.Fixed(16)) != "gid-16-bytes-xyz" {
		t.Fatalf("fields did not round-trip: %v", d.Err())
	}
	if err := d.Finish(); err != nil {
		t.Fatal(err)
	}
}

func TestReadUsesBuffer(t *testing.T) {
	frame := testProto.Append(nil, 1, 0, []byte("hello"))
	buf := make([]byte, 0, 16)
	var hdr [HeaderLen]byte
	_, p, err := testProto.Read(bytes.NewReader(frame), hdr[:], buf)
	if err != nil {
		t.Fatal(err)
	}
	if &p[0] != &buf[:1][0] {
		t.Fatal("payload did not reuse the caller's buffer")
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, _, err := testProto.Read(bytes.NewReader(frame), hdr[:], buf); err != nil {
			t.Fatal(err)
		}
	}); n > 1 { // the bytes.Reader escapes; the read itself must not allocate
		t.Fatalf("%v allocations per read", n)
	}
}

func TestRejects(t *testing.T) {
	good := testProto.Append(nil, 1, 0, []byte("abc"))
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"bad magic":     mut(func(b []byte) []byte { b[0] = 'X'; return b }),
		"bad version":   mut(func(b []byte) []byte { b[4] = 9; return b }),
		"unknown type":  mut(func(b []byte) []byte { b[5] = 3; return b }),
		"over limit":    testProto.Append(nil, 1, 0, make([]byte, 17)),
		"huge length":   mut(func(b []byte) []byte { b[8], b[9], b[10], b[11] = 0xff, 0xff, 0xff, 0xff; return b }),
		"truncated":     good[:len(good)-1],
		"short payload": mut(func(b []byte) []byte { b[11] = 5; return b }),
	}
	for name, frame := range cases {
		var hdr [HeaderLen]byte
		_, _, err := testProto.Read(bytes.NewReader(frame), hdr[:], nil)
		if !errors.Is(err, ErrFrame) {
			t.Errorf("%s: err = %v, want ErrFrame", name, err)
		}
	}
	var hdr [HeaderLen]byte
	if _, _, err := testProto.Read(bytes.NewReader(good[:5]), hdr[:], nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short header: %v", err)
	}
	if _, _, err := testProto.Read(bytes.NewReader(nil), hdr[:], nil); err != io.EOF {
		t.Errorf("empty stream: %v", err)
	}
}

func TestDecErrors(t *testing.T) {
	d := NewDec([]byte{0, 5, 'a', 'b'})
	if s := d.String(10); s != "" || !errors.Is(d.Err(), ErrFrame) {
		t.Fatalf("short string: %q %v", s, d.Err())
	}
	if d.U64() != 0 {
		t.Fatal("read after error returned data")
	}
	d = NewDec([]byte{0, 5, 'a', 'b', 'c', 'd', 'e'})
	if d.String(4); !errors.Is(d.Err(), ErrFrame) {
		t.Fatal("string over its bound accepted")
	}
	d = NewDec([]byte{1, 2})
	d.U8()
	if err := d.Finish(); !errors.Is(err, ErrFrame) {
		t.Fatal("trailing byte accepted")
	}
}

func FuzzRead(f *testing.F) {
	var e Enc
	e.String("seg")
	e.U64(42)
	f.Add(testProto.Append(nil, 2, 0, e.B))
	f.Add(testProto.Append(nil, 1, 0, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var hdr [HeaderLen]byte
		h, p, err := testProto.Read(bytes.NewReader(b), hdr[:], nil)
		if err != nil {
			return
		}
		if max, _ := testProto.Limit(h.Type); len(p) != h.Len || h.Len > max {
			t.Fatalf("accepted %d-byte payload for %+v", len(p), h)
		}
		// Re-encoding an accepted frame gives back the bytes read.
		if out := testProto.Append(nil, h.Type, h.Flags, p); !bytes.Equal(out, b[:HeaderLen+h.Len]) {
			t.Fatalf("re-encoding differs")
		}
		d := NewDec(p)
		_ = d.String(8)
		_ = d.U64()
		_ = d.Bytes(100)
		_ = d.Finish()
	})
}
