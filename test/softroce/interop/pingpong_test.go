package interop

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

// Parameters of every run; the tool gets the same ones on its command line.
const (
	msgSize = 8192 // two pages, eight packets at path MTU 1024
	iters   = 100
	rxDepth = 64
	// pageSize is the tool's page size: with -c it keeps the first byte of
	// every page 0 and checks that the message it received last keeps it too.
	pageSize = 4096
)

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}

// pattern fills b with message number k of our side: distinct per message,
// first byte of every page 0 (the tool's -c check).
func pattern(b []byte, k int) {
	for i := range b {
		b[i] = byte(k*131 + i*7 + i>>8)
		if i%pageSize == 0 {
			b[i] = 0
		}
	}
}

// toolInitial is the tool's first message: its buffer is filled with 0x7b,
// and a client started with -c zeroes the first byte of every page.
func toolInitial(n int) []byte {
	b := bytes.Repeat([]byte{0x7b}, n)
	for i := 0; i < n; i += pageSize {
		b[i] = 0
	}
	return b
}

// ours is our end of the pingpong: one context on one device (one "host").
type ours struct {
	t   *testing.T
	dev srenv.Dev
	ctx *uverbs.Context
	pd  *uverbs.PD
	ch  *uverbs.CompChannel
	cq  *uverbs.CQ
	mr  *uverbs.MR // [0,msgSize) receive buffer, [msgSize,2*msgSize) send buffer
	qp  *uverbs.QP
	gid uverbs.GIDEntry
	psn uverbs.PSN
}

func newOurs(t *testing.T, dev srenv.Dev) *ours {
	t.Helper()
	o := &ours{t: t, dev: dev, psn: uverbs.PSN(rand.Uint32() & 0xffffff)}
	var err error
	if o.ctx, err = uverbs.Open(dev.Name, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// every object is closed explicitly first, so a leak is an error
		for _, c := range []interface{ Close() error }{o.qp, o.cq, o.ch, o.mr, o.pd, o.ctx} {
			if c != nil {
				if err := c.Close(); err != nil {
					t.Errorf("%s: close %T: %v", dev.Name, c, err)
				}
			}
		}
	})
	ip, _ := netip.AddrFromSlice(dev.IP)
	if o.gid, err = o.ctx.FindRoCEv2GID(1, ip.Unmap()); err != nil {
		t.Fatal(err)
	}
	if o.gid.Index != dev.GIDIndex {
		t.Fatalf("%s: GID index %d, harness says %d", dev.Name, o.gid.Index, dev.GIDIndex)
	}
	if o.pd, err = o.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if o.ch, err = o.ctx.CreateCompChannel(); err != nil {
		t.Fatal(err)
	}
	if o.cq, err = o.ctx.CreateCQ(uverbs.CQConfig{Entries: rxDepth + 8, Channel: o.ch}); err != nil {
		t.Fatal(err)
	}
	if o.mr, err = o.pd.AllocMR(2*msgSize, uverbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if o.qp, err = o.pd.CreateQP(uverbs.QPConfig{SendCQ: o.cq, RecvCQ: o.cq,
		Caps: uverbs.QPCaps{MaxSendWR: 4, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := o.qp.ToInit(1, 0); err != nil { // INIT accepts receives
		t.Fatal(err)
	}
	// receives are posted before the exchange: the peer may send right after it
	for i := 0; i < rxDepth; i++ {
		o.postRecv()
	}
	return o
}

func (o *ours) dest() Dest { return Dest{QPN: o.qp.QPN(), PSN: o.psn, GID: o.gid.GID} }

func (o *ours) connect(r Dest) error {
	return o.qp.Connect(uverbs.ConnectConfig{
		SGIDIndex: uint8(o.gid.Index), LocalPSN: o.psn,
		// the tool's default path MTU is 1024; both ends must agree
		Remote: uverbs.Endpoint{QPN: r.QPN, PSN: r.PSN, GID: r.GID, MTU: uverbs.MTU1024},
	})
}

const (
	recvID = 1
	sendID = 2
)

func (o *ours) postRecv() {
	o.t.Helper()
	if n, err := o.qp.PostRecv([]uverbs.RecvWR{{ID: recvID, SGL: []uverbs.SGE{o.mr.SGE(0, msgSize)}}}); err != nil || n != 1 {
		o.t.Fatalf("%s: post_recv: %d %v", o.dev.Name, n, err)
	}
}

// run plays iters rounds of the tool's pingpong: the client sends first, each
// side sends its next message once its previous send completed and the peer's
// answer arrived. check(k, got) verifies received message k (1-based).
func (o *ours) run(ctx context.Context, client bool, check func(k int, got []byte) error) {
	o.t.Helper()
	sendBuf := o.mr.Bytes()[msgSize:]
	scnt, rcnt, posted := 0, 0, rxDepth
	sending := false
	wc := make([]uverbs.WC, 8)
	for scnt < iters || rcnt < iters {
		mayAnswer := rcnt == scnt
		if !client {
			mayAnswer = rcnt == scnt+1
		}
		if !sending && scnt < iters && mayAnswer {
			pattern(sendBuf, scnt+1)
			wr := uverbs.SendWR{ID: sendID, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled,
				SGL: []uverbs.SGE{o.mr.SGE(msgSize, msgSize)}}
			if n, err := o.qp.PostSend([]uverbs.SendWR{wr}); err != nil || n != 1 {
				o.t.Fatalf("%s: post_send %d: %d %v", o.dev.Name, scnt+1, n, err)
			}
			sending = true
			continue
		}
		n, err := o.cq.Wait(ctx, wc)
		if err != nil {
			o.t.Fatalf("%s: waiting after %d sends, %d receives: %v", o.dev.Name, scnt, rcnt, err)
		}
		for _, w := range wc[:n] {
			if err := w.Err(); err != nil {
				o.t.Fatalf("%s: %v", o.dev.Name, err)
			}
			switch w.ID {
			case sendID:
				scnt++
				sending = false
			case recvID:
				rcnt++
				posted--
				if w.ByteLen != msgSize {
					o.t.Fatalf("%s: message %d is %d bytes, want %d", o.dev.Name, rcnt, w.ByteLen, msgSize)
				}
				if err := check(rcnt, o.mr.Bytes()[:msgSize]); err != nil {
					o.t.Fatalf("%s: message %d: %v", o.dev.Name, rcnt, err)
				}
				if posted+rcnt < iters {
					o.postRecv()
					posted++
				}
			default:
				o.t.Fatalf("%s: completion with unknown id %+v", o.dev.Name, w)
			}
		}
	}
}

func diff(got, want []byte) error {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("byte %d = %#x, want %#x (first difference)", i, got[i], want[i])
		}
	}
	return nil
}

func toolArgs(d srenv.Dev, port int) []string {
	return []string{"-d", d.Name, "-g", strconv.Itoa(d.GIDIndex), "-p", strconv.Itoa(port),
		"-s", strconv.Itoa(msgSize), "-n", strconv.Itoa(iters), "-r", strconv.Itoa(rxDepth), "-c"}
}

// checkToolOutput asserts the tool finished all iterations without reporting bad data.
func checkToolOutput(t *testing.T, out string) {
	t.Helper()
	if !strings.Contains(out, fmt.Sprintf("%d iters in", iters)) {
		t.Errorf("tool did not report %d iterations:\n%s", iters, out)
	}
	if strings.Contains(out, "invalid data") {
		t.Errorf("tool found invalid data:\n%s", out)
	}
	t.Logf("ibv_rc_pingpong:\n%s", strings.TrimSpace(out))
}

type pair struct {
	name     string
	srv, cli srenv.Dev
}

func pairs(topo srenv.Topo) []pair {
	a, b := topo.Pair(0)
	a2, b2 := topo.Pair(1)
	return []pair{
		{"rail1", b, a}, // server on host B, client on host A
		{"rail2", a2, b2},
		{"loopback", topo.Lo, topo.Lo},
	}
}

var nextPort = 18600

func port() int { nextPort++; return nextPort }

// TestOurServerTheirClient: our RC pingpong server, rdma-core's client.
// The tool echoes: its first message is its own 0x7b fill, every later one
// is the message we sent it last.
func TestOurServerTheirClient(t *testing.T) {
	topo := srenv.Require(t)
	for _, p := range pairs(topo) {
		t.Run(p.name+"-"+p.srv.Name+"-"+p.cli.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			o := newOurs(t, p.srv)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			port := ln.Addr().(*net.TCPAddr).Port
			tool := exec.CommandContext(ctx, "ibv_rc_pingpong", append(toolArgs(p.cli, port), "127.0.0.1")...)
			var out bytes.Buffer
			tool.Stdout, tool.Stderr = &out, &out
			if err := tool.Start(); err != nil {
				t.Fatal(err)
			}
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(60 * time.Second)) // the tool may die first
			conn, err := ln.Accept()
			if err != nil {
				t.Fatalf("accept: %v\ntool output:\n%s", err, out.String())
			}
			defer conn.Close()
			remote, err := ServerExchange(ctx, conn, o.dest(), o.connect)
			if err != nil {
				t.Fatalf("%v\ntool output:\n%s", err, out.String())
			}
			if remote.GID != uverbs.GID(p.cli.GID) {
				t.Errorf("tool client sent GID %s, want %s", remote.GID, uverbs.GID(p.cli.GID))
			}
			want := make([]byte, msgSize)
			o.run(ctx, false, func(k int, got []byte) error {
				if k == 1 {
					return diff(got, toolInitial(msgSize))
				}
				pattern(want, k-1)
				return diff(got, want)
			})
			if err := tool.Wait(); err != nil {
				t.Fatalf("ibv_rc_pingpong client: %v\n%s", err, out.String())
			}
			checkToolOutput(t, out.String())
		})
	}
}

// TestTheirServerOurClient: rdma-core's server, our client; every answer
// must echo the message we sent.
func TestTheirServerOurClient(t *testing.T) {
	topo := srenv.Require(t)
	for _, p := range pairs(topo) {
		t.Run(p.name+"-"+p.srv.Name+"-"+p.cli.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			port := port()
			tool := exec.CommandContext(ctx, "ibv_rc_pingpong", toolArgs(p.srv, port)...)
			var out bytes.Buffer
			tool.Stdout, tool.Stderr = &out, &out
			if err := tool.Start(); err != nil {
				t.Fatal(err)
			}
			o := newOurs(t, p.cli)
			var conn net.Conn
			var err error
			for conn == nil { // until the tool listens
				if conn, err = net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); err != nil {
					if ctx.Err() != nil {
						t.Fatalf("dial tool: %v\n%s", err, out.String())
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			defer conn.Close()
			remote, err := ClientExchange(ctx, conn, o.dest())
			if err != nil {
				t.Fatalf("%v\ntool output:\n%s", err, out.String())
			}
			if remote.GID != uverbs.GID(p.srv.GID) {
				t.Errorf("tool server sent GID %s, want %s", remote.GID, uverbs.GID(p.srv.GID))
			}
			if err := o.connect(remote); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, msgSize)
			o.run(ctx, true, func(k int, got []byte) error {
				pattern(want, k)
				return diff(got, want)
			})
			if err := tool.Wait(); err != nil {
				t.Fatalf("ibv_rc_pingpong server: %v\n%s", err, out.String())
			}
			checkToolOutput(t, out.String())
		})
	}
}
