package mctcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/mooncake"
)

// TestConformance: te to te over Mooncake's wire, in one process: 1 B to
// 64 MiB with bytes checked, large batches, concurrency, bad requests,
// memory unregistered, target closed or restarted, initiator closed.
func TestConformance(t *testing.T) { transporttest.Run(t, factory) }

// TestConformanceRemote: the same with the target in another process
// (killed and restarted mid-run among the cases).
func TestConformanceRemote(t *testing.T) { transporttest.RunRemote(t, factory) }

type node struct {
	e   *engine.Engine
	mem *engine.Memory
	tr  *Transport
}

func (n *node) base() uint64 { return engine.AddrOf(n.mem.Bytes()) }

func newNode(t testing.TB, st *enginetest.MemStore, name string, size int, c Config, log *slog.Logger) *node {
	t.Helper()
	tr := New(c)
	cfg := engine.Config{Name: name, MetadataTimeout: 2 * time.Second, Logger: log}
	if st != nil {
		cfg.Store = st
	}
	n := enginetest.NewNode(t, cfg, size, tr)
	return &node{e: n.Engine, mem: n.Mem, tr: tr}
}

type pair struct {
	ini, tgt *node
	seg      engine.SegmentID
}

func newPair(t testing.TB, size int, c Config) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &pair{tgt: newNode(t, st, "target", size, c, nil), ini: newNode(t, st, "initiator", size, c, nil)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seg, err := p.ini.e.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.seg = seg
	return p
}

func (p *pair) transfer(t testing.TB, op engine.Op, local []byte, remote uint64) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.ini.e.Transfer(ctx, []engine.Request{{Op: op, Local: local, Target: p.seg, TargetAddr: remote}})
}

// TestVersion1: against a target advertising v1 the initiator speaks v1
// (no status words); with one lane a WRITE followed by a READ of the same
// bytes is ordered, so what was written is read back.
func TestVersion1(t *testing.T) {
	p := newPair(t, 8<<20, Config{Version: 1, Lanes: 1})
	d := p.tgt.e.LocalDescriptor()
	if pr, _ := d.Protocol(mooncake.TEProtoTCP); pr.TCP == nil || pr.TCP.Wire != 1 {
		t.Fatalf("advertised %+v", pr)
	}
	for _, n := range []int{1, 4096, 1 << 20, 4 << 20} {
		src := p.ini.mem.Bytes()[:n]
		dst := p.ini.mem.Bytes()[4<<20 : 4<<20+n]
		rand.Read(src)
		clear(dst)
		if err := p.transfer(t, engine.Write, src, p.tgt.base()); err != nil {
			t.Fatal(err)
		}
		if err := p.transfer(t, engine.Read, dst, p.tgt.base()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("%d bytes: read back differs", n)
		}
	}
}

// rawConn talks to a target's data port the way a Mooncake initiator
// does.
type rawConn struct {
	t *testing.T
	c net.Conn
}

func dialRaw(t *testing.T, addr string) *rawConn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, c: c}
}

// hdr is a request header with garbage in its padding, as Mooncake's
// default mode sends.
func hdr(size, addr uint64, op byte) []byte {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint64(b, size)
	binary.LittleEndian.PutUint64(b[8:], addr)
	b[16] = op
	copy(b[17:], []byte{0x8c, 0x18, 0x58, 0x78, 0x55, 0, 0})
	return b
}

func (r *rawConn) send(b ...[]byte) {
	for _, x := range b {
		if _, err := r.c.Write(x); err != nil {
			r.t.Fatal(err)
		}
	}
}

func (r *rawConn) read(n int) []byte {
	b := make([]byte, n)
	if _, err := io.ReadFull(r.c, b); err != nil {
		r.t.Fatalf("read %d: %v", n, err)
	}
	return b
}

// closed asserts the target closes the connection with nothing (more) sent.
func (r *rawConn) closed() {
	b, err := io.ReadAll(r.c)
	if len(b) != 0 {
		r.t.Fatalf("got % x before close", b)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		r.t.Fatalf("not closed: %v", err)
	}
}

var (
	okStatus, _  = hex.DecodeString("000000005654434d")
	badStatus, _ = hex.DecodeString("010000005654434d")
)

// TestTargetWire checks the target's bytes against the documented and
// captured wire: v2 WRITE then status, v2 READ status then payload,
// pipelined requests in order, v1 without status words, rejections.
func TestTargetWire(t *testing.T) {
	n := newNode(t, nil, "target", 1<<20, Config{}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	mem := n.mem.Bytes()

	r := dialRaw(t, addr)
	payload := []byte(strings.Repeat("mooncake", 512)) // 4 KiB
	r.send(hdr(4096, base+4096, 0x81), payload)
	if got := r.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("WRITE status % x", got)
	}
	if !bytes.Equal(mem[4096:8192], payload) {
		t.Fatal("WRITE did not land")
	}
	// Pipelined: a READ and a WRITE and a READ back to back.
	copy(mem[0:3], "abc")
	r.send(hdr(3, base, 0x80), hdr(2, base+100, 0x81), []byte("xy"), hdr(2, base+100, 0x80))
	if got := r.read(8 + 3 + 8 + 8 + 2); !bytes.Equal(got, slicesConcat(okStatus, []byte("abc"), okStatus, okStatus, []byte("xy"))) {
		t.Fatalf("pipelined answers % x", got)
	}
	// Rejected: outside every buffer, crossing the end, size 0: status 1
	// and a closed connection.
	for _, h := range [][]byte{hdr(8, base+1<<20, 0x80), hdr(8, base+1<<20-4, 0x81), hdr(0, base, 0x80), hdr(8, 1, 0x81)} {
		r := dialRaw(t, addr)
		r.send(h)
		if got := r.read(8); !bytes.Equal(got, badStatus) {
			t.Fatalf("rejection % x", got)
		}
		r.closed()
	}
	// v1: a WRITE gets nothing back, a READ only its payload.
	r = dialRaw(t, addr)
	r.send(hdr(5, base+200, 0x01), []byte("hello"), hdr(5, base+200, 0x00))
	if got := r.read(5); string(got) != "hello" {
		t.Fatalf("v1 READ %q", got)
	}
	// v1 rejection: closed with no bytes.
	r.send(hdr(5, base+1<<20, 0x00))
	r.closed()
	// Unknown opcodes are refused (Mooncake would serve them as READs).
	for _, op := range []byte{0x82, 0x7f} {
		r := dialRaw(t, addr)
		r.send(hdr(1, base, op))
		if op&0x80 != 0 {
			if got := r.read(8); !bytes.Equal(got, badStatus) {
				t.Fatalf("opcode %#x: % x", op, got)
			}
		}
		r.closed()
	}
	// A WRITE header followed by EOF: closed silently.
	r = dialRaw(t, addr)
	r.send(hdr(100, base, 0x81), []byte("short"))
	r.c.(*net.TCPConn).CloseWrite()
	r.closed()
}

func slicesConcat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// TestTargetStall: a request whose header or payload stops arriving is
// closed within IOTimeout and the watchdog's tick; a connection idle
// between requests is not, however long it waits.
func TestTargetStall(t *testing.T) {
	const timeout = 200 * time.Millisecond
	n := newNode(t, nil, "target", 1<<20, Config{IOTimeout: timeout}, nil)
	addr, base := n.tr.Endpoint(), n.base()
	idle := dialRaw(t, addr)
	for _, c := range []struct {
		name string
		sent []byte
	}{
		{"payload", slicesConcat(hdr(4096, base, 0x81), make([]byte, 100))},
		{"header", hdr(4096, base, 0x81)[:10]},
		{"small payload", slicesConcat(hdr(100, base, 0x81), make([]byte, 10))},
	} {
		r := dialRaw(t, addr)
		start := time.Now()
		r.send(c.sent)
		r.closed()
		took := time.Since(start)
		if took < timeout || took > 10*timeout {
			t.Errorf("%s: stalled request closed after %v; IOTimeout %v", c.name, took, timeout)
		}
	}
	// The idle connection waited all along and still works.
	idle.send(hdr(8, base, 0x80))
	if got := idle.read(8); !bytes.Equal(got, okStatus) {
		t.Fatalf("idle connection: % x", got)
	}
	idle.read(8)
}

// TestInitiatorRejected: a READ outside the target's memory (the target
// unregistered it behind the initiator's back) fails with ErrOutOfRange;
// the lane recovers for the next request.
func TestInitiatorRejected(t *testing.T) {
	p := newPair(t, 1<<20, Config{Lanes: 1})
	// A fake segment whose buffer lies past the target's memory.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // a Mooncake target that rejects everything
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var h [24]byte
				if _, err := io.ReadFull(c, h[:]); err == nil {
					c.Write(badStatus)
				}
			}()
		}
	}()
	_ = p
	st := enginetest.NewMemStore()
	defer st.Close()
	ini := newNode(t, st, "ini2", 1<<20, Config{}, nil)
	d := &mooncake.Descriptor{Name: "127.0.0.1:1", Protocols: []string{"tcp"}, TCPDataPort: uint16(ln.Addr().(*net.TCPAddr).Port), TCPProtoVersion: 2,
		Buffers: []mooncake.Buffer{{Name: "x", Addr: 1 << 30, Length: 1 << 20}}}
	td, err := mooncake.ToTE(d, mooncake.ToOptions{Name: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	td.Version = 1
	if err := st.Publish(context.Background(), td); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seg, err := ini.e.OpenSegment(ctx, "fake", nil)
	if err != nil {
		t.Fatal(err)
	}
	err = ini.e.Transfer(ctx, []engine.Request{{Op: engine.Read, Local: ini.mem.Bytes()[:64], Target: seg, TargetAddr: 1 << 30}})
	if !errors.Is(err, engine.ErrOutOfRange) {
		t.Fatalf("rejected READ: %v", err)
	}
	// The real pair still works afterwards.
	if err := p.transfer(t, engine.Write, p.ini.mem.Bytes()[:64], p.tgt.base()); err != nil {
		t.Fatal(err)
	}
}

// TestSteadyStateAllocs: neither side allocates per request.
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const batch = 128
	for _, c := range []struct {
		op   engine.Op
		size int
	}{{engine.Write, 4096}, {engine.Read, 4096}, {engine.Write, 64 << 10}, {engine.Read, 64 << 10}, {engine.Write, 1 << 20}, {engine.Read, 1 << 20}} {
		t.Run(fmt.Sprintf("%v/%d", c.op, c.size), func(t *testing.T) {
			p := newPair(t, batch*c.size, Config{})
			reqs := make([]engine.Request, batch)
			for i := range reqs {
				reqs[i] = engine.Request{Op: c.op, Local: p.ini.mem.Bytes()[i*c.size : (i+1)*c.size], Target: p.seg, TargetAddr: p.tgt.base() + uint64(i*c.size)}
			}
			ctx := context.Background()
			var failed error
			run := func() {
				b, err := p.ini.e.AllocateBatch(batch)
				if err == nil {
					err = p.ini.e.Submit(b, reqs)
				}
				if err == nil {
					err = p.ini.e.Wait(ctx, b)
				}
				if err == nil {
					err = p.ini.e.FreeBatch(b)
				}
				if err != nil && failed == nil {
					failed = err
				}
			}
			for range 10 {
				run()
			}
			allocs := enginetest.AllocsPerRun(10, run)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per batch of %d", allocs, batch)
			}
		})
	}
}

// TestExposedWarning: one warning when the data port listens beyond
// loopback.
func TestExposedWarning(t *testing.T) {
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	newNode(t, nil, "a", 0, Config{}, log)
	if strings.Contains(logs.String(), "no authentication") {
		t.Fatalf("loopback warned: %s", logs.String())
	}
	newNode(t, nil, "b", 0, Config{Listen: "0.0.0.0:0"}, log)
	if n := strings.Count(logs.String(), "no authentication"); n != 1 {
		t.Fatalf("%d warnings: %s", n, logs.String())
	}
}

// FuzzTarget: any bytes on the data port leave the target serving (and
// never panic it); a valid request afterwards still works.
func FuzzTarget(f *testing.F) {
	n := newNode(f, nil, "target", 1<<16, Config{IOTimeout: 200 * time.Millisecond}, nil)
	base := n.base()
	f.Add(slicesConcat(hdr(4, base, 0x81), []byte("abcd")))
	f.Add(hdr(4, base, 0x80))
	f.Add(hdr(1<<40, base, 0x81))
	f.Add(hdr(4, base, 0x01))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := net.Dial("tcp", n.tr.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
		c.Close()
		r := dialRaw(t, n.tr.Endpoint())
		r.send(hdr(4, base+8, 0x80))
		if got := r.read(8); !bytes.Equal(got, okStatus) {
			t.Fatalf("after % x: % x", b, got)
		}
	})
}
