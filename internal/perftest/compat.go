package perftest

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/rdmago/te/uverbs"
)

// perftest's out-of-band exchange after the versions (its
// perftest_communication.c, 4.5-0.17 and later; read, not copied). Every
// step is symmetric: the client writes its part and reads the server's,
// the server reads first. In order:
//
//	sys data  cycle buffer (int32, network order), cache line size (int32)
//	MTU       the port's MTU enum as a decimal string in 2 bytes ("3\0")
//	keys x3   the QP's address as fixed-size text (keyMsg), once before and
//	          twice after the QPs move to RTS
//	test      the client runs; the server waits in a fourth key exchange
//	report    the client's result: size, iterations (uint64 BE), peak and
//	          average bandwidth, message rate (float64 BE)
//	close     a fifth key exchange, then "done\0"
//
// Only write and read bandwidth tests are supported against perftest: its
// latency tests mark messages differently from te's and its send test
// posts receives on its own schedule.

// Sizes of the key message with and without a GID (KEY_MSG_SIZE_GID,
// KEY_MSG_SIZE), NUL included.
const (
	keyMsgGID   = 108
	keyMsgNoGID = 59
)

// keyMsg formats info as perftest's key message: lid, out_reads, qpn, psn,
// rkey, vaddr, then the GID as 16 bytes (with a GID), and the SRQ number.
func keyMsg(in Info, withGID bool) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", in.LID, in.OutReads, in.QPN, in.PSN, in.RKey, in.Addr)
	if withGID {
		for _, g := range in.GID {
			fmt.Fprintf(&b, "%02x:", g)
		}
	}
	fmt.Fprintf(&b, "%08x", 0) // SRQ number: te uses none
	if withGID {
		b.WriteByte(':')
	}
	n := keyMsgNoGID
	if withGID {
		n = keyMsgGID
	}
	out := make([]byte, n)
	copy(out, b.String())
	return out
}

// parseKeyMsg decodes a peer's key message; the bytes come from the
// network, so every field is checked.
func parseKeyMsg(b []byte, withGID bool) (Info, error) {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	f := strings.Split(strings.TrimSuffix(string(b), ":"), ":")
	want := 7
	if withGID {
		want = 23
	}
	if len(f) != want {
		return Info{}, fmt.Errorf("%w sent a key message of %d fields, want %d: %q", ErrPeer, len(f), want, b)
	}
	num := func(s string, bits int) (uint64, error) {
		v, err := strconv.ParseUint(s, 16, bits)
		if err != nil {
			return 0, fmt.Errorf("%w sent a malformed key message %q: %v", ErrPeer, b, err)
		}
		return v, nil
	}
	var in Info
	var vals [6]uint64
	for i, bits := range []int{16, 16, 24, 24, 32, 64} {
		v, err := num(f[i], bits)
		if err != nil {
			return Info{}, err
		}
		vals[i] = v
	}
	in.LID, in.OutReads, in.QPN, in.PSN, in.RKey, in.Addr = uint16(vals[0]), int(vals[1]), uint32(vals[2]), uint32(vals[3]), uint32(vals[4]), vals[5]
	if withGID {
		for i := range in.GID {
			v, err := num(f[6+i], 8)
			if err != nil {
				return Info{}, err
			}
			in.GID[i] = byte(v)
		}
	}
	return in, nil
}

// ptConn runs the exchange's steps in the client's or the server's order.
type ptConn struct {
	w      io.Writer
	r      io.Reader
	client bool
}

// xchg sends mine and receives the peer's part of one step.
func (c ptConn) xchg(mine []byte, theirs []byte) error {
	if c.client {
		if _, err := c.w.Write(mine); err != nil {
			return err
		}
	}
	if _, err := io.ReadFull(c.r, theirs); err != nil {
		return fmt.Errorf("%w (perftest): %v", ErrPeer, err)
	}
	if !c.client {
		if _, err := c.w.Write(mine); err != nil {
			return err
		}
	}
	return nil
}

func (c ptConn) keys(my Info, withGID bool) (Info, error) {
	n := keyMsgNoGID
	if withGID {
		n = keyMsgGID
	}
	buf := make([]byte, n)
	if err := c.xchg(keyMsg(my, withGID), buf); err != nil {
		return Info{}, err
	}
	return parseKeyMsg(buf, withGID)
}

// ptSetup is what both roles do before the test: versions checked, system
// data and MTU exchanged, the end opened and connected.
func ptSetup(c ptConn, peerVer string, dev Device, p Params, sizes []int, o Options) (*end, Info, error) {
	v, _ := strconv.ParseFloat(strings.Fields(peerVer + " 0")[0], 64)
	if v < minPeerVer {
		return nil, Info{}, fmt.Errorf("%w: perftest version %q: te speaks perftest's exchange of version %.2f and later", ErrPeer, peerVer, minPeerVer)
	}
	if p.Test != TestBW || p.Op == OpSend {
		return nil, Info{}, fmt.Errorf("%w is perftest (version %s): te perf runs only write and read bandwidth tests (ib_write_bw, ib_read_bw) against perftest", ErrPeer, peerVer)
	}
	// cycle buffer and cache line: perftest cycles its remote address
	// through the larger cycle buffer of the two, so the region covers it
	page, line := os.Getpagesize(), 64
	var mine, theirs [4]byte
	binary.BigEndian.PutUint32(mine[:], uint32(page))
	if err := c.xchg(mine[:], theirs[:]); err != nil {
		return nil, Info{}, err
	}
	cycle := int(min(binary.BigEndian.Uint32(theirs[:]), 1<<30))
	binary.BigEndian.PutUint32(mine[:], uint32(line))
	if err := c.xchg(mine[:], theirs[:]); err != nil {
		return nil, Info{}, err
	}
	p.Region = max(p.Region, page, cycle)
	for _, s := range sizes {
		p.Region = max(p.Region, s)
	}
	if err := p.Check(); err != nil {
		return nil, Info{}, err
	}
	e, err := openEnd(dev, p, o.Verbs)
	if err != nil {
		return nil, Info{}, err
	}
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()
	my := e.port.Attr.ActiveMTU
	if p.MTU != 0 {
		my = MTUEnum(p.MTU)
	}
	var mtu [2]byte
	if err := c.xchg([]byte{'0' + byte(my), 0}, mtu[:]); err != nil {
		return nil, Info{}, err
	}
	if peer := uverbs.MTU(mtu[0] - '0'); peer >= uverbs.MTU256 && peer <= uverbs.MTU4096 && peer < my {
		my = peer
	}
	e.p.MTU = my.Bytes()
	withGID := e.port.Attr.LinkLayer == uverbs.LinkLayerEthernet || dev.GIDIndex >= 0
	peer, err := c.keys(e.info(), withGID)
	if err != nil {
		return nil, Info{}, err
	}
	peer.MTU = uint8(my)
	if err := e.connect(peer); err != nil {
		return nil, Info{}, err
	}
	o.logf("te perf: perftest %s peer: QP %d -> %d, path MTU %d", peerVer, e.qp.QPN(), peer.QPN, e.p.MTU)
	for range 2 { // after RTS, and once more before the test
		if _, err := c.keys(e.info(), withGID); err != nil {
			return nil, Info{}, err
		}
	}
	ok = true
	return e, peer, nil
}

// ptReport is perftest's bandwidth report on the wire.
type ptReport struct {
	size, iters        uint64
	peak, avg, msgRate float64
}

func (c ptConn) report(mine ptReport) (ptReport, error) {
	var out ptReport
	var a, b [8]byte
	for i, f := range []struct {
		u *uint64
		d *float64
		v uint64
	}{{u: &out.size, v: mine.size}, {u: &out.iters, v: mine.iters},
		{d: &out.peak, v: math.Float64bits(mine.peak)}, {d: &out.avg, v: math.Float64bits(mine.avg)},
		{d: &out.msgRate, v: math.Float64bits(mine.msgRate)}} {
		binary.BigEndian.PutUint64(a[:], f.v)
		if err := c.xchg(a[:], b[:]); err != nil {
			return out, fmt.Errorf("report field %d: %w", i, err)
		}
		if f.u != nil {
			*f.u = binary.BigEndian.Uint64(b[:])
		} else {
			*f.d = math.Float64frombits(binary.BigEndian.Uint64(b[:]))
		}
	}
	return out, nil
}

// finish is the test's end: the wait, the report, the close.
func (c ptConn) finish(e *end, mine ptReport, withGID bool) (ptReport, error) {
	if _, err := c.keys(e.info(), withGID); err != nil {
		return ptReport{}, err
	}
	rep, err := c.report(mine)
	if err != nil {
		return rep, err
	}
	if _, err := c.keys(e.info(), withGID); err != nil {
		return rep, err
	}
	_, err = c.w.Write([]byte("done\x00"))
	return rep, err
}

// servePerftest serves a perftest client (version v) with p: the server
// of a write or read bandwidth test is passive; it returns the client's
// report.
func servePerftest(ctx context.Context, conn net.Conn, rd *bufio.Reader, v string, dev Device, p Params, sizes []int, o Options) ([]Result, error) {
	c := ptConn{w: conn, r: rd}
	e, peer, err := ptSetup(c, v, dev, p, sizes, o)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	withGID := e.port.Attr.LinkLayer == uverbs.LinkLayerEthernet || dev.GIDIndex >= 0
	rep, err := c.finish(e, ptReport{}, withGID)
	if err != nil {
		return nil, err
	}
	r := e.result(peer, conn.RemoteAddr().String()+" (perftest "+v+")")
	r.Bytes, r.Iters, r.MBps, r.Mpps = int(min(rep.size, 1<<40)), int(min(rep.iters, 1<<40)), finite(rep.avg), finite(rep.msgRate)
	if o.ReportGbits { // the client reported in its own unit: Gb/s
		r.MBps = r.MBps * 1e9 / 8 / (1 << 20)
	}
	o.logf("te perf: served %s %s to %s", p.Op, p.Test, r.Peer)
	var out []Result
	o.report(&out, r)
	return out, nil
}

// finite is v, or 0 for what JSON cannot carry: perftest reports inf or
// nan when its CPU clock calibration fails (seen under emulation).
func finite(v float64) float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0
	}
	return v
}

// connectPerftest runs the tests against a perftest server (version v)
// started with the same flags.
func connectPerftest(ctx context.Context, conn net.Conn, rd *bufio.Reader, v string, dev Device, p Params, sizes []int, o Options) ([]Result, error) {
	c := ptConn{w: conn, r: rd, client: true}
	e, peer, err := ptSetup(c, v, dev, p, sizes, o)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	peerName := conn.RemoteAddr().String() + " (perftest " + v + ")"
	var out []Result
	var last Result
	for _, s := range sizesOr(p, sizes) {
		e.p.Size = s
		r, err := e.bwResult(ctx, peer, peerName)
		if err != nil {
			return out, err
		}
		o.report(&out, r)
		last = r
	}
	rep := ptReport{size: uint64(last.Bytes), iters: uint64(last.Iters), peak: last.MBps, avg: last.MBps, msgRate: last.Mpps}
	if o.ReportGbits {
		rep.peak, rep.avg = last.Gbps(), last.Gbps()
	}
	withGID := e.port.Attr.LinkLayer == uverbs.LinkLayerEthernet || dev.GIDIndex >= 0
	if _, err := c.finish(e, rep, withGID); err != nil {
		return out, err
	}
	return out, nil
}
