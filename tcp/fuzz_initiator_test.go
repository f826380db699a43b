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
// local memory outside the READ slice, whatever the target sends.
func FuzzReplyStream(f *testing.F) {
	const blk = 4096
	var stream atomic.Pointer[[]byte]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	var wg sync.WaitGroup
	f.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				if _, err := acceptHandshake(c, nil, auth.Party{Name: "evil", Epoch: 5}); err != nil {
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
	st := enginetest.NewMemStore()
	f.Cleanup(func() { st.Close() })
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	st.Publish(context.Background(), &segment.Descriptor{Name: "evil", Epoch: 5, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}},
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
	payload := bytes.Repeat([]byte{0x5A}, blk)
	f.Add(append(frame(header{op: opRead | opReply, id: 0, addr: buf.Addr, length: blk}, payload),
		frame(header{op: opWrite | opReply, id: 1, addr: buf.Addr + blk}, nil)...))
	f.Add(frame(header{op: opRead | opReply, id: 0, status: statusOutOfRange}, nil))
	f.Add(frame(header{op: opRead | opReply, id: 0, length: blk}, payload[:100]))
	f.Add(frame(header{op: opWrite | opReply, id: 1}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		stream.Store(&data)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		seg, err := n.e.OpenSegment(ctx, "evil", nil)
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
		if !bytes.Equal(got[:blk], want[:blk]) || !bytes.Equal(got[2*blk:], want[2*blk:]) {
			t.Fatal("memory outside the READ slice changed")
		}
		copy(got[blk:2*blk], want[blk:2*blk])
		if err := n.e.CloseSegment(seg); err != nil {
			t.Fatal(err)
		}
	})
}
