package tcp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
)

// FuzzServerStream feeds arbitrary bytes, after a valid HELLO, to a live
// target's listener: the receiver must never crash or hang, must answer
// only with well-formed replies, and must never touch memory outside what
// it registered (guard regions around it stay intact).
func FuzzServerStream(f *testing.F) {
	const size = 1 << 16
	secret := testSecret(f)
	// Two targets, one without and one with a cluster secret; the stream
	// picks one (bit 1 of its first byte).
	type target struct {
		n    *node
		base uint64
		s    *auth.Secret
	}
	var targets [2]target
	all, err := engine.Alloc(5 * size)
	if err != nil {
		f.Fatal(err)
	}
	fill(f, all.Bytes())
	for i, s := range []*auth.Secret{nil, secret} {
		n := newNode(f, nil, fmt.Sprint("fuzz-target-", i), 0, Config{Auth: s})
		reg := all.Bytes()[(1+2*i)*size : (2+2*i)*size]
		if err := n.e.RegisterLocalMemory(reg, ""); err != nil {
			f.Fatal(err)
		}
		targets[i] = target{n: n, base: engine.AddrOf(reg), s: s}
	}
	f.Cleanup(func() {
		for _, tg := range targets {
			tg.n.e.Close()
		}
		all.Close()
	})
	// Guards: the unregistered stretches around and between the regions.
	guards := [][2]int{{0, size}, {2 * size, 3 * size}, {4 * size, 5 * size}}
	want := make([][]byte, len(guards))
	for i, g := range guards {
		want[i] = bytes.Clone(all.Bytes()[g[0]:g[1]])
	}
	frameBytes := func(h header, payload []byte) []byte {
		b := make([]byte, headerLen)
		h.encode(b)
		return append(b, payload...)
	}
	base := targets[0].base
	f.Add(frameBytes(header{op: opWrite, id: 1, addr: base, length: 4}, []byte("abcd")))
	f.Add(frameBytes(header{op: opRead, id: 2, addr: base + 100, length: 16}, nil))
	f.Add(frameBytes(header{op: opWrite, id: 3, addr: base + 1<<16 - 2, length: 4}, []byte("wxyz")))
	f.Add(append(frameBytes(header{op: opWrite, flags: flagMore, id: 4, addr: 8, length: 3}, []byte("abc")), 'T', 'E'))
	vec := func(h header, ents [][2]uint64, payload []byte) []byte {
		b := frameBytes(h, nil)
		for _, e := range ents {
			b = binary.LittleEndian.AppendUint64(b, e[0])
			b = binary.LittleEndian.AppendUint64(b, e[1])
		}
		return append(b, payload...)
	}
	// Vectors: in range, one entry refused (its payload discarded), a
	// READV with a refused entry, entries that do not add up.
	f.Add(vec(header{op: opWriteV, id: 5, addr: 2, length: 6}, [][2]uint64{{base, 2}, {base + 10, 4}}, []byte("abcdef")))
	f.Add(vec(header{op: opWriteV, flags: flagMore, id: 6, addr: 2, length: 6}, [][2]uint64{{base, 2}, {8, 4}}, []byte("abcdef")))
	f.Add(vec(header{op: opReadV, id: 7, addr: 3, length: 48}, [][2]uint64{{base, 16}, {8, 16}, {base + 100, 16}}, nil))
	f.Add(vec(header{op: opReadV, id: 8, addr: 2, length: 10}, [][2]uint64{{base, 16}, {base, 16}}, nil))
	f.Fuzz(func(t *testing.T, stream []byte) {
		tg := targets[0]
		if len(stream) > 0 && stream[0]&2 != 0 {
			tg = targets[1]
		}
		// Rebase addresses into the registered region half of the time,
		// so in-range frames are exercised, not only refusals.
		if len(stream) >= headerLen && stream[0]&1 == 1 {
			stream = bytes.Clone(stream)
			a := binary.LittleEndian.Uint64(stream[16:])
			binary.LittleEndian.PutUint64(stream[16:], tg.base+a%(1<<16))
		}
		c, err := net.Dial("tcp", tg.n.tr.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := dialHandshake(c, tg.s, auth.Party{Name: "fuzz", Epoch: 1}, auth.Party{Name: tg.n.e.Name(), Epoch: tg.n.e.Epoch()}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(stream); err != nil {
			return // the target may already have closed on bad framing
		}
		c.(*net.TCPConn).CloseWrite()
		replies, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("target hung on the stream")
		}
		for i, g := range guards {
			if !bytes.Equal(all.Bytes()[g[0]:g[1]], want[i]) {
				t.Fatal("memory next to a registered region changed")
			}
		}
		// Every reply is a well-formed header (plus a vector's statuses,
		// plus READ payload).
		for off := 0; off+headerLen <= len(replies); {
			h, err := decodeHeader(replies[off:])
			if err != nil || h.op&opReply == 0 {
				t.Fatalf("malformed reply at %d: %v %v", off, h, err)
			}
			off += headerLen + int(h.length)
			if h.vector() && h.status == statusVec {
				off += int(h.addr)
			}
		}
	})
}
