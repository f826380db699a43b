package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
)

// fakeTarget accepts one connection at a time, completes the handshake,
// then answers each request with what misbehave returns (raw bytes).
func fakeTarget(t *testing.T, st *enginetest.MemStore, name string, misbehave func(req header) []byte) segment.Buffer {
	t.Helper()
	return fakeTargetAuth(t, st, name, nil, misbehave)
}

// fakeTargetAuth is fakeTarget holding a cluster secret (nil: none).
func fakeTargetAuth(t *testing.T, st *enginetest.MemStore, name string, secret *auth.Secret, misbehave func(req header) []byte) segment.Buffer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				if _, err := acceptHandshake(c, secret, auth.Party{Name: name, Epoch: 5}); err != nil {
					return
				}
				var hb [headerLen]byte
				for {
					if _, err := io.ReadFull(c, hb[:]); err != nil {
						return
					}
					h, err := decodeHeader(hb[:])
					if err != nil {
						return
					}
					if h.op == opWrite {
						io.CopyN(io.Discard, c, int64(h.length))
					}
					c.Write(misbehave(h))
				}
			})
		}
	})
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	st.Publish(context.Background(), &segment.Descriptor{Name: name, Epoch: 5, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}},
		Buffers:   []segment.Buffer{buf}})
	return buf
}

func frame(h header, payload []byte) []byte {
	b := make([]byte, headerLen, headerLen+len(payload))
	h.encode(b)
	return append(b, payload...)
}

// TestHostileTarget: replies that break the protocol fail the tasks with
// ErrProtocol and never write local memory outside the slice; with and
// without a cluster secret (a hostile target may hold it too).
func TestHostileTarget(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("auth=", on), func(t *testing.T) {
			var s *auth.Secret
			if on {
				s = testSecret(t)
			}
			testHostileTarget(t, s)
		})
	}
}

func testHostileTarget(t *testing.T, secret *auth.Secret) {
	cases := []struct {
		name string
		op   engine.Op
		resp func(h header) []byte
		want error
	}{
		{"wrong id", engine.Write, func(h header) []byte {
			return frame(header{op: opWrite | opReply, id: h.id + 7}, nil)
		}, ErrProtocol},
		{"wrong op", engine.Write, func(h header) []byte {
			return frame(header{op: opRead | opReply, id: h.id}, nil)
		}, ErrProtocol},
		{"bad magic", engine.Read, func(h header) []byte {
			b := frame(header{op: opRead | opReply, id: h.id, length: h.length}, make([]byte, h.length))
			b[0] = 'Z'
			return b
		}, ErrProtocol},
		{"oversized READ reply", engine.Read, func(h header) []byte {
			return frame(header{op: opRead | opReply, id: h.id, length: h.length + 64}, bytes.Repeat([]byte{0xEE}, int(h.length)+64))
		}, ErrProtocol},
		{"payload on a WRITE reply", engine.Write, func(h header) []byte {
			return frame(header{op: opWrite | opReply, id: h.id, length: 4}, []byte("junk"))
		}, ErrProtocol},
		{"refusal", engine.Read, func(h header) []byte {
			return frame(header{op: opRead | opReply, status: statusOutOfRange, id: h.id}, nil)
		}, engine.ErrOutOfRange},
		{"unknown status", engine.Write, func(h header) []byte {
			return frame(header{op: opWrite | opReply, status: 999, id: h.id}, nil)
		}, ErrProtocol},
		{"silence", engine.Read, func(h header) []byte { return nil }, ErrTimeout},
		{"stall mid-payload", engine.Read, func(h header) []byte {
			return frame(header{op: opRead | opReply, id: h.id, length: h.length}, make([]byte, h.length/2))
		}, ErrTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := enginetest.NewMemStore()
			defer st.Close()
			buf := fakeTargetAuth(t, st, "evil", secret, c.resp)
			// Long enough that a loaded machine's slow fake target
			// does not turn the expected error into a timeout.
			n := newNode(t, st, "ini", 1<<16, Config{Lanes: 1, IOTimeout: 2 * time.Second, Auth: secret})
			seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "evil", nil)
			if err != nil {
				t.Fatal(err)
			}
			fill(t, n.buf())
			want := bytes.Clone(n.buf())
			b, _ := n.e.AllocateBatch(1)
			defer n.e.FreeBatch(b)
			if err := n.e.Submit(b, []engine.Request{{Op: c.op, Local: n.buf()[4096:8192], Target: seg, TargetAddr: buf.Addr}}); err != nil {
				t.Fatal(err)
			}
			err = n.e.Wait(ctxT(t, 30*time.Second), b)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if c.name == "stall mid-payload" {
				return // half the slice was legitimately written
			}
			if st, _ := n.e.Status(b, 0); st.State != engine.StateFailed || st.Transferred != 0 {
				t.Fatalf("status %+v", st)
			}
			if !bytes.Equal(n.buf()[:4096], want[:4096]) || !bytes.Equal(n.buf()[8192:], want[8192:]) {
				t.Fatal("memory outside the slice changed")
			}
			if c.name == "oversized READ reply" && !bytes.Equal(n.buf(), want) {
				t.Fatal("a refused READ reply wrote the slice")
			}
		})
	}
}

// flakyTarget breaks its first connection at the first request: it drops
// the connection with the request unanswered or, with midPayload, after
// half of a READ reply's payload. Every later connection serves WRITEs
// and READs properly (READs return readPattern bytes).
func flakyTarget(t *testing.T, st *enginetest.MemStore, name string, midPayload bool) segment.Buffer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := acceptHandshake(c, nil, auth.Party{Name: name, Epoch: 5}); err != nil {
					return
				}
				var hb [headerLen]byte
				for {
					if _, err := io.ReadFull(c, hb[:]); err != nil {
						return
					}
					h, _ := decodeHeader(hb[:])
					switch {
					case first && midPayload:
						c.Write(frame(header{op: opRead | opReply, id: h.id, length: h.length}, bytes.Repeat([]byte{readPattern}, int(h.length/2))))
						return
					case first:
						return // drop the connection with the request unanswered
					case h.op == opRead:
						c.Write(frame(header{op: opRead | opReply, id: h.id, length: h.length}, bytes.Repeat([]byte{readPattern}, int(h.length))))
					default:
						io.CopyN(io.Discard, c, int64(h.length))
						c.Write(frame(header{op: opWrite | opReply, id: h.id}, nil))
					}
				}
			})
		}
	})
	buf := segment.Buffer{Addr: 1 << 40, Length: 1 << 20}
	st.Publish(context.Background(), &segment.Descriptor{Name: name, Epoch: 5, Version: 1,
		Protocols: []segment.Protocol{{Name: segment.ProtoTCP, Endpoint: ln.Addr().String()}},
		Buffers:   []segment.Buffer{buf}})
	return buf
}

// TestRetry: a request lost with its connection is retried on a new one
// (engine.Config.Retries, default 1); with retries off it fails.
func TestRetry(t *testing.T) {
	for _, c := range []struct {
		retries int
		want    error
	}{{0, nil}, {-1, ErrConnection}} {
		t.Run(fmt.Sprint("retries=", c.retries), func(t *testing.T) {
			st := enginetest.NewMemStore()
			defer st.Close()
			buf := flakyTarget(t, st, "flaky", false)
			e, err := engine.New(engine.Config{Name: "ini", Store: st, Retries: c.retries})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Install(New(Config{Lanes: 1})); err != nil {
				t.Fatal(err)
			}
			mem, _ := engine.Alloc(4096)
			defer mem.Close()
			if err := e.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
				t.Fatal(err)
			}
			seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "flaky", nil)
			if err != nil {
				t.Fatal(err)
			}
			err = e.Transfer(ctxT(t, 10*time.Second), []engine.Request{{Op: engine.Write, Local: mem.Bytes(), Target: seg, TargetAddr: buf.Addr}})
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

const readPattern = 0xAB

// TestRetryMidPayload: a READ whose reply breaks off mid-payload is
// retried on a fresh connection, not on the broken one: the retry must
// not race the lane's failure (repeated, since the race is narrow).
func TestRetryMidPayload(t *testing.T) {
	for i := range 30 {
		st := enginetest.NewMemStore()
		buf := flakyTarget(t, st, "flaky", true)
		n := newNode(t, st, "ini", 64<<10, Config{Lanes: 1})
		seg, err := n.e.OpenSegment(ctxT(t, 5*time.Second), "flaky", nil)
		if err != nil {
			t.Fatal(err)
		}
		local := n.buf()
		clear(local)
		if err := n.e.Transfer(ctxT(t, 30*time.Second), []engine.Request{{Op: engine.Read, Local: local, Target: seg, TargetAddr: buf.Addr}}); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !bytes.Equal(local, bytes.Repeat([]byte{readPattern}, len(local))) {
			t.Fatalf("round %d: READ returned the wrong bytes", i)
		}
		n.e.Close()
		st.Close()
	}
}
