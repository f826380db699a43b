package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// FuzzReplyStream answers an initiator's first request with arbitrary
// bytes: the initiator must never crash or hang, and must never write
// local memory outside the READ slices, whatever the target sends; over
// version 2 frames and over version 3 (vector replies).
func FuzzReplyStream(f *testing.F) {
	const blk = 4096
	var stream atomic.Pointer[[]byte]
	var wg sync.WaitGroup
	f.Cleanup(wg.Wait) // after the listeners' Close (cleanups run last first)
	// Two listeners: the segments "evil" and "evil3" (below).
	listen := func(name string) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { ln.Close() })
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(time.Minute))
					if _, err := acceptHandshake(c, nil, auth.Party{Name: name, Epoch: 5}); err != nil {
						return
					}
					var hb [headerLen]byte
					if _, err := io.ReadFull(c, hb[:]); err != nil {
						return // the first request
					}
					c.Write(*stream.Load())
					// Then end the stream, so the initiator fails at once
					// rather than after its I/O timeout.
					c.(*net.TCPConn).CloseWrite()
					io.Copy(io.Discard, c) // until the initiator hangs up
				})
			}
		})
		return ln
	}
	ln, ln3 := listen("evil"), listen("evil3")
	st := enginetest.NewMemStore()
	f.Cleanup(func() { st.Close() })
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	// "evil" advertises no wire version (version 2 frames), "evil3"
	// version 3 (vectors); the stream's first byte picks one.
	st.Publish(context.Background(), &segment.Descriptor{Name: "evil", Epoch: 5, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}},
		Buffers:   []segment.Buffer{buf}})
	st.Publish(context.Background(), &segment.Descriptor{Name: "evil3", Epoch: 5, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln3.Addr().String(), TCP: &segment.TCP{Wire: wireVersion}}},
		Buffers:   []segment.Buffer{buf}})
	// A short I/O timeout only makes silent streams fail sooner; any
	// outcome but a hang or a stray write passes.
	n := newNode(f, st, "ini", 4*blk, Config{Lanes: 1, IOTimeout: 200 * time.Millisecond})
	fill(f, n.buf())
	want := bytes.Clone(n.buf())
	reqs := []engine.Request{
		{Op: engine.Read, Local: n.buf()[blk : 2*blk], Target: 0, TargetAddr: buf.Addr},
		{Op: engine.Write, Local: n.buf()[2*blk : 3*blk], Target: 0, TargetAddr: buf.Addr + blk},
	}
	// To evil3: two READs (one vector), then a WRITE.
	reqs3 := []engine.Request{
		{Op: engine.Read, Local: n.buf()[blk : 2*blk], Target: 0, TargetAddr: buf.Addr},
		{Op: engine.Read, Local: n.buf()[2*blk : 3*blk], Target: 0, TargetAddr: buf.Addr + blk},
		{Op: engine.Write, Local: n.buf()[3*blk : 4*blk], Target: 0, TargetAddr: buf.Addr + 2*blk},
	}
	payload := bytes.Repeat([]byte{0x5A}, blk)
	vreply := func(h header, st []byte, payload []byte) []byte {
		return append(append(frame(h, nil), st...), payload...)
	}
	f.Add(append(frame(header{op: opRead | opReply, id: 0, addr: buf.Addr, length: blk}, payload),
		frame(header{op: opWrite | opReply, id: 1, addr: buf.Addr + blk}, nil)...))
	f.Add(frame(header{op: opRead | opReply, id: 0, status: statusOutOfRange}, nil))
	f.Add(frame(header{op: opRead | opReply, id: 0, length: blk}, payload[:100]))
	f.Add(frame(header{op: opWrite | opReply, id: 1}, nil))
	// Version 3 replies (the stream's first byte is odd: 'T' is 0x54, so
	// these start with one byte that the harness drops).
	v3 := func(b []byte) []byte { return append([]byte{1}, b...) }
	f.Add(v3(append(vreply(header{op: opReadV | opReply, id: 0, addr: 2, length: 2 * blk}, nil, bytes.Repeat(payload, 2)),
		frame(header{op: opWrite | opReply, id: 2}, nil)...)))
	f.Add(v3(vreply(header{op: opReadV | opReply, id: 0, addr: 2, status: statusVec, length: blk}, []byte{1, 0}, payload)))
	f.Add(v3(vreply(header{op: opReadV | opReply, id: 0, addr: 2, status: statusVec, length: 2 * blk}, []byte{0, 0}, payload)))
	f.Add(v3(vreply(header{op: opReadV | opReply, id: 0, addr: 3, length: 2 * blk}, nil, payload)))
	f.Add(v3(vreply(header{op: opWriteV | opReply, id: 0, addr: 2}, nil, nil)))
	f.Fuzz(func(t *testing.T, data []byte) {
		name, reqs, lo, hi := "evil", reqs, blk, 2*blk
		if len(data) > 0 && data[0]&1 == 1 {
			name, reqs, lo, hi = "evil3", reqs3, blk, 3*blk
			data = data[1:]
		}
		stream.Store(&data)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		seg, err := n.e.OpenSegment(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			reqs[i].Target = seg
		}
		b, err := n.e.AllocateBatch(len(reqs))
		if err != nil {
			t.Fatal(err)
		}
		if err := n.e.Submit(b, reqs); err != nil {
			t.Fatal(err)
		}
		werr := n.e.Wait(ctx, b)
		if ctx.Err() != nil {
			t.Fatalf("initiator hung on the reply stream: %v", werr)
		}
		if err := n.e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		got := n.buf()
		if !bytes.Equal(got[:lo], want[:lo]) || !bytes.Equal(got[hi:], want[hi:]) {
			t.Fatal("memory outside the READ slices changed")
		}
		copy(got[lo:hi], want[lo:hi])
		if err := n.e.CloseSegment(seg); err != nil {
			t.Fatal(err)
		}
	})
}
