package perftest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/rdmago/te/uverbs"
)

// Options are what a run needs besides the test.
type Options struct {
	Verbs *uverbs.Options // providers
	// Log receives progress lines (waiting, served); nil discards them.
	Log io.Writer
	// OnResult, when set, sees each result as it is measured (a sweep
	// prints row by row).
	OnResult func(Result)
	// ReportGbits: bandwidth a perftest peer reports (and te reports to
	// it) is in Gb/s, as both were started with --report_gbits.
	ReportGbits bool
}

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

func (o Options) report(out *[]Result, r Result) {
	*out = append(*out, r)
	if o.OnResult != nil {
		o.OnResult(r)
	}
}

// sizesOr is sizes, or p.Size alone.
func sizesOr(p Params, sizes []int) []int {
	if len(sizes) == 0 {
		return []int{p.Size}
	}
	return sizes
}

// Local runs both ends in this process, the client on a and the server
// on b, one test per size (p.Size when sizes is empty).
func Local(ctx context.Context, a, b Device, p Params, sizes []int, o Options) ([]Result, error) {
	var out []Result
	for _, s := range sizesOr(p, sizes) {
		p.Size = s
		if err := p.Check(); err != nil {
			return out, err
		}
		r, err := localOne(ctx, a, b, p, o)
		if err != nil {
			return out, err
		}
		o.report(&out, r)
	}
	return out, nil
}

func localOne(ctx context.Context, a, b Device, p Params, o Options) (Result, error) {
	cli, err := openEnd(a, p, o.Verbs)
	if err != nil {
		return Result{}, err
	}
	defer cli.Close()
	srv, err := openEnd(b, p, o.Verbs)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
	ci, si := cli.info(), srv.info()
	if err := srv.connect(ci); err != nil {
		return Result{}, err
	}
	if err := cli.connect(si); err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srvErr := make(chan error, 1)
	go func() {
		err := srv.serveSide(ctx, ci)
		if err != nil {
			cancel() // unblock the client
		}
		srvErr <- err
	}()
	res, err := cli.clientSide(ctx, si, b.Name)
	if err != nil {
		cancel()
		if e := <-srvErr; e != nil {
			return res, errors.Join(err, e)
		}
		return res, err
	}
	return res, <-srvErr
}

// The first bytes on the wire are perftest's version exchange: the client
// writes its 16-byte NUL-padded version string, then the server its own.
// perftest reads the number at its start (and wants at least 5.70); te
// adds " te1" after it, so two te ends recognise each other and switch to
// te's own exchange (JSON lines: the client's parameters and QP, the
// server's QP), while a perftest peer goes on in perftest's format.
const (
	versionLen    = 16
	perftestVer   = "6.06" // the protocol level te speaks (perftest 4.5-0.17 reports 6.06)
	teVersion     = perftestVer + " te1"
	minPeerVer    = 5.70 // what perftest itself requires of its peer
	maxJSONLine   = 64 << 10
	teVersionMark = " te"
)

func versionBytes(v string) []byte {
	b := make([]byte, versionLen)
	copy(b, v)
	return b
}

// peerVersion decodes a peer's version field: the string, and whether it
// is te.
func peerVersion(b []byte) (string, bool) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	v := string(b)
	return v, strings.Contains(v, teVersionMark)
}

type hello struct {
	Params Params `json:"params"`
	Info   Info   `json:"info"`
	Device string `json:"device"`
}

type reply struct {
	Info   Info   `json:"info"`
	Device string `json:"device"`
	Error  string `json:"error,omitempty"`
}

// Serve waits for one client on ln and serves it: a te client's tests
// (it sends the parameters), or a perftest client's, with p (a perftest
// server takes them from its own flags, and so does te's here; sizes is
// its -a). It returns what a perftest client reported of its bandwidth
// (te clients report nothing back).
func Serve(ctx context.Context, ln net.Listener, dev Device, p Params, sizes []int, o Options) ([]Result, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	o.logf("te perf: %s waiting on %s", dev.Name, ln.Addr())
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a client: %w", ctx.Err())
		}
		return nil, fmt.Errorf("accept: %w", err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	rd := bufio.NewReaderSize(conn, maxJSONLine)
	vb := make([]byte, versionLen)
	if _, err := io.ReadFull(rd, vb); err != nil {
		return nil, fmt.Errorf("%w %s: reading its version: %v", ErrPeer, conn.RemoteAddr(), err)
	}
	v, te := peerVersion(vb)
	if !te {
		if _, err := conn.Write(versionBytes(perftestVer)); err != nil {
			return nil, err
		}
		return servePerftest(ctx, conn, rd, v, dev, p, sizes, o)
	}
	if _, err := conn.Write(versionBytes(teVersion)); err != nil {
		return nil, err
	}
	for n := 0; ; n++ {
		h, err := readHello(rd, n > 0)
		if err != nil || h == nil {
			return nil, err
		}
		if err := serveOne(ctx, conn, rd, dev, *h, o); err != nil {
			return nil, err
		}
	}
}

// readHello reads a te client's next test; nil at a clean end after the
// first.
func readHello(rd *bufio.Reader, more bool) (*hello, error) {
	if more {
		if _, err := rd.Peek(1); errors.Is(err, io.EOF) {
			return nil, nil
		}
	}
	var h hello
	if err := ReadJSONLine(rd, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

func serveOne(ctx context.Context, conn net.Conn, rd *bufio.Reader, dev Device, h hello, o Options) error {
	p := h.Params
	if err := p.Check(); err != nil { // bytes from the network: check before use
		json.NewEncoder(conn).Encode(reply{Error: err.Error()})
		return err
	}
	e, err := openEnd(dev, p, o.Verbs)
	if err == nil {
		err = e.connect(h.Info)
	}
	if err != nil {
		json.NewEncoder(conn).Encode(reply{Error: err.Error()})
		e.Close()
		return err
	}
	defer e.Close()
	if err := json.NewEncoder(conn).Encode(reply{Info: e.info(), Device: dev.Name}); err != nil {
		return err
	}
	if err := e.serveSide(ctx, h.Info); err != nil {
		return err
	}
	// the client says when it is done with our memory
	var done reply
	if err := ReadJSONLine(rd, &done); err != nil {
		return err
	}
	if done.Error != "" {
		return fmt.Errorf("%w %s: %s", ErrPeer, h.Device, done.Error)
	}
	o.logf("te perf: served %s %s %d bytes to %s", p.Op, p.Test, p.Size, h.Device)
	return nil
}

// Connect runs the tests, one per size (p.Size when sizes is empty),
// against a server at addr: a te server, or a perftest server of the same
// test started with the same flags.
func Connect(ctx context.Context, addr string, dev Device, p Params, sizes []int, o Options) ([]Result, error) {
	var d net.Dialer
	var conn net.Conn
	var err error
	for { // the server may still be starting
		if conn, err = d.DialContext(ctx, "tcp", addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect %s: %w (is te perf or a perftest server running there?)", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	rd := bufio.NewReaderSize(conn, maxJSONLine)
	if _, err := conn.Write(versionBytes(teVersion)); err != nil {
		return nil, err
	}
	vb := make([]byte, versionLen)
	if _, err := io.ReadFull(rd, vb); err != nil {
		return nil, fmt.Errorf("%w at %s: reading its version: %v (not a te perf or perftest server?)", ErrPeer, addr, err)
	}
	v, te := peerVersion(vb)
	if !te {
		return connectPerftest(ctx, conn, rd, v, dev, p, sizes, o)
	}
	var out []Result
	for _, s := range sizesOr(p, sizes) {
		p.Size = s
		if err := p.Check(); err != nil {
			return out, err
		}
		r, err := connectOne(ctx, conn, rd, addr, dev, p, o)
		if err != nil {
			return out, err
		}
		o.report(&out, r)
	}
	return out, nil
}

func connectOne(ctx context.Context, conn net.Conn, rd *bufio.Reader, addr string, dev Device, p Params, o Options) (Result, error) {
	e, err := openEnd(dev, p, o.Verbs)
	if err != nil {
		return Result{}, err
	}
	defer e.Close()
	if err := json.NewEncoder(conn).Encode(hello{Params: p, Info: e.info(), Device: dev.Name}); err != nil {
		return Result{}, err
	}
	var rep reply
	if err := ReadJSONLine(rd, &rep); err != nil {
		return Result{}, err
	}
	if rep.Error != "" {
		return Result{}, fmt.Errorf("%w at %s: %s", ErrPeer, addr, rep.Error)
	}
	if err := e.connect(rep.Info); err != nil {
		return Result{}, err
	}
	res, err := e.clientSide(ctx, rep.Info, rep.Device)
	var fin reply
	if err != nil {
		fin.Error = err.Error()
	}
	json.NewEncoder(conn).Encode(fin)
	return res, err
}

// ReadJSONLine decodes one newline-terminated JSON value that fits rd's
// buffer (64 KiB for the readers here).
func ReadJSONLine(rd *bufio.Reader, v any) error {
	line, err := rd.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("%w sent an over-long message", ErrPeer)
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w closed the connection", ErrPeer)
		}
		return err
	}
	if err := json.Unmarshal(line, v); err != nil {
		return fmt.Errorf("%w sent a malformed message: %v", ErrPeer, err)
	}
	return nil
}
