package p2p

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/rdmago/te/segment"
)

// FuzzReadFrame feeds arbitrary bytes to the frame decoder used on both ends
// of the handshake socket. Properties: no panic; a frame decodes only within
// its type's bound; a decoded frame re-encodes to the bytes it was read from;
// descriptor payloads go through segment.Unmarshal without panicking.
func FuzzReadFrame(f *testing.F) {
	f.Add(appendFrame(nil, frameGet, []byte("127.0.0.1:15001")))
	f.Add(appendFrame(nil, frameNotFound, []byte("127.0.0.1:15001/kv")))
	f.Add(appendFrame(nil, frameError, []byte("no")))
	f.Add(appendFrame(nil, frameDescriptor, []byte(`{"schema":1,"segment":{"name":"127.0.0.1:1","epoch":1,"version":1,"protocols":[{"name":"tcp"}],"buffers":[{"addr":4096,"length":4096}]}}`)))
	f.Add([]byte("TEMD\x01\x02\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte("TEMD"))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, maxDesc := range []int{0, segment.MaxEncodedSize} {
			var h [headerLen]byte
			typ, p, err := readFrame(bytes.NewReader(in), h[:], maxDesc)
			if err != nil {
				if p != nil {
					t.Fatalf("payload %q with error %v", p, err)
				}
				if !errors.Is(err, errFrame) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				continue
			}
			limit, ok := maxPayload(typ, maxDesc)
			if !ok || len(p) > limit {
				t.Fatalf("accepted %v frame of %d bytes (limit %d, known %v)", typ, len(p), limit, ok)
			}
			if re := appendFrame(nil, typ, p); !bytes.Equal(re, in[:len(re)]) {
				t.Fatalf("re-encoding differs:\n in %x\nout %x", in[:len(re)], re)
			}
			if typ == frameDescriptor {
				d, err := segment.Unmarshal(p)
				if (d == nil) == (err == nil) {
					t.Fatalf("Unmarshal = %v, %v", d, err)
				}
			}
		}
	})
}
