package tcp

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
)

// FuzzServerStream feeds arbitrary bytes, after a valid HELLO, to a live
// target's listener: the receiver must never crash or hang, must answer
// only with well-formed replies, and must never touch memory outside what
// it registered (guard regions around it stay intact).
func FuzzServerStream(f *testing.F) {
	const size = 1 << 16
	n := newNode(f, nil, "fuzz-target", 0, Config{})
	all, err := engine.Alloc(3 * size)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.e.Close(); all.Close() })
	if err := n.e.RegisterLocalMemory(all.Bytes()[size:2*size], ""); err != nil {
		f.Fatal(err)
	}
	fill(f, all.Bytes())
	before, after := bytes.Clone(all.Bytes()[:size]), bytes.Clone(all.Bytes()[2*size:])
	base := engine.AddrOf(all.Bytes()[size:])
	frameBytes := func(h header, payload []byte) []byte {
		b := make([]byte, headerLen)
		h.encode(b)
		return append(b, payload...)
	}
	f.Add(frameBytes(header{op: opWrite, id: 1, addr: base, length: 4}, []byte("abcd")))
	f.Add(frameBytes(header{op: opRead, id: 2, addr: base + 100, length: 16}, nil))
	f.Add(frameBytes(header{op: opWrite, id: 3, addr: base + 1<<16 - 2, length: 4}, []byte("wxyz")))
	f.Add(append(frameBytes(header{op: opWrite, flags: flagMore, id: 4, addr: 8, length: 3}, []byte("abc")), 'T', 'E'))
	f.Fuzz(func(t *testing.T, stream []byte) {
		// Rebase addresses into the registered region half of the time,
		// so in-range frames are exercised, not only refusals.
		if len(stream) >= headerLen && stream[0]&1 == 1 {
			stream = bytes.Clone(stream)
			a := binary.LittleEndian.Uint64(stream[16:])
			binary.LittleEndian.PutUint64(stream[16:], base+a%(1<<16))
		}
		c, err := net.Dial("tcp", n.tr.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		hello := make([]byte, headerLen)
		(&header{op: opHello, addr: n.e.Epoch()}).encode(hello)
		if _, err := c.Write(append(hello, stream...)); err != nil {
			return // the target may already have closed on bad framing
		}
		c.(*net.TCPConn).CloseWrite()
		replies, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("target hung on the stream")
		}
		if !bytes.Equal(all.Bytes()[:size], before) || !bytes.Equal(all.Bytes()[2*size:], after) {
			t.Fatal("memory next to the registered region changed")
		}
		// Every reply is a well-formed header (plus READ payload).
		for off := 0; off+headerLen <= len(replies); {
			h, err := decodeHeader(replies[off:])
			if err != nil || h.op&opReply == 0 {
				t.Fatalf("malformed reply at %d: %v %v", off, h, err)
			}
			off += headerLen + int(h.length)
		}
	})
}
