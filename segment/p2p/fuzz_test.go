package p2p

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
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
	f.Add(appendFrame(nil, frameDescriptor, []byte(`{"schema":2,"segment":{"name":"127.0.0.1:1","epoch":1,"version":1,"protocols":[{"name":"tcp"}],"buffers":[{"addr":4096,"length":4096}]}}`)))
	f.Add([]byte("TEMD\x01\x02\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte("TEMD"))
	f.Add(requests.Append(nil, frameAnswer, 0, make([]byte, 18)))
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
			// The socket also carries internal/control's handshake
			// frames, so the bound is the protocol's, not maxPayload's.
			proto := newProto(maxDesc)
			limit, ok := proto.Limit(typ)
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

// FuzzServerConn feeds arbitrary bytes to a live store's socket, one
// store with a cluster secret and one without (bit 0 of the first byte
// picks): no crash or hang, every answer is a well-formed frame, and the
// store with the secret never sends a descriptor to this stream.
func FuzzServerConn(f *testing.F) {
	secret, _ := auth.New([]byte("the fuzz store's cluster secret"))
	var stores [2]*Store
	for i, s := range []*auth.Secret{nil, secret} {
		st, err := New(context.Background(), Options{Auth: s, Timeout: 2 * time.Second})
		if err != nil {
			f.Fatal(err)
		}
		stores[i] = st
		if err := st.Publish(context.Background(), desc(st.Name(), 1, 1)); err != nil {
			f.Fatal(err)
		}
	}
	f.Cleanup(func() { stores[0].Close(); stores[1].Close() })
	in := (*auth.Secret)(nil).Initiate("p2p", auth.Party{Name: "fuzz:1"}, auth.Party{Name: stores[0].Name()})
	hello := appendFrame(nil, frameHello, auth.AppendHello(nil, in.Hello()))
	f.Add(append(append(hello, appendFrame(nil, frameAnswer, auth.AppendAnswer(nil, auth.Answer{}))...), appendFrame(nil, frameGet, []byte(stores[0].Name()))...))
	f.Add(appendFrame(nil, frameGet, []byte("x")))
	f.Fuzz(func(t *testing.T, in []byte) {
		st := stores[0]
		if len(in) > 0 && in[0]&1 == 1 {
			st = stores[1]
		}
		c, err := net.Dial("tcp", st.ListenAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		out, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("store hung on the stream")
		}
		r := bytes.NewReader(out)
		for r.Len() > 0 {
			var h [headerLen]byte
			typ, _, err := readFrame(r, h[:], segment.MaxEncodedSize)
			if err != nil {
				t.Fatalf("malformed answer: %v", err)
			}
			if typ == frameDescriptor && st == stores[1] {
				t.Fatal("a descriptor without the secret")
			}
		}
	})
}
