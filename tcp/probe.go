package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
)

// ProbeStep names a step of Probe, in the order Probe takes them.
type ProbeStep uint8

// Probe's steps.
const (
	ProbeDial      ProbeStep = iota + 1 // TCP connect to the endpoint
	ProbeHandshake                      // hello .. verdict (internal/control)
	ProbeRange                          // the target's answer to a READ of the probe range
	ProbeTransfer                       // WRITE, READ back, compare, restore
)

func (s ProbeStep) String() string {
	switch s {
	case ProbeDial:
		return "dial"
	case ProbeHandshake:
		return "hello"
	case ProbeRange:
		return "range"
	case ProbeTransfer:
		return "probe"
	}
	return fmt.Sprintf("ProbeStep(%d)", uint8(s))
}

// ProbeError is a failed Probe: the step it stopped at and why. It
// unwraps to the cause (ErrConnection, ErrTimeout, driver.ErrPeerReset,
// driver.ErrOutOfRange, auth.ErrDenied, auth.ErrNotTE, ...).
type ProbeError struct {
	Step ProbeStep
	Err  error
}

func (e *ProbeError) Error() string { return e.Step.String() + ": " + e.Err.Error() }
func (e *ProbeError) Unwrap() error { return e.Err }

// ProbeConfig says what one Probe connection checks.
type ProbeConfig struct {
	// Endpoint is the target's tcp endpoint (its descriptor's).
	Endpoint string
	// Self names the prober in the hello; Target the segment and the
	// epoch it is expected to have.
	Self, Target auth.Party
	Auth         *auth.Secret
	// Addr and Len are the target range the probe reads, overwrites with
	// a pattern, reads back and then restores. Len 0 stops after the
	// handshake.
	Addr uint64
	Len  int
	// Pattern seeds the bytes written, so concurrent probes of one
	// target write different bytes.
	Pattern byte
	// Timeout bounds each step (default DefaultDialTimeout).
	Timeout time.Duration
}

// ProbeResult is what a Probe saw, as far as it got.
type ProbeResult struct {
	Local, Remote netip.AddrPort
	Dial          time.Duration // connect
	Handshake     time.Duration // hello to verdict
	RTT           time.Duration // the READ of the range: request to last byte
	Verified      int           // bytes written, read back and compared
}

// Probe opens one connection to a tcp target as a lane does (dial, then
// te's handshake), then asks for the probe range (READ), writes a pattern
// there, reads it back, compares and writes the original bytes back. Each
// step is bounded by cfg.Timeout, so a peer that accepts and never
// answers fails at the handshake instead of hanging. It allocates: it is
// a diagnostic, not a data path. A failure is a *ProbeError.
func Probe(ctx context.Context, cfg ProbeConfig) (ProbeResult, error) {
	var res ProbeResult
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	fail := func(s ProbeStep, err error) (ProbeResult, error) {
		return res, &ProbeError{Step: s, Err: err}
	}
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, timeout)
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", cfg.Endpoint)
	timedOut := dctx.Err() == context.DeadlineExceeded && ctx.Err() == nil
	cancel()
	if err != nil {
		if timedOut {
			return fail(ProbeDial, control.Mark(fmt.Errorf("no answer to connect within %v: %w", timeout, err), ErrTimeout))
		}
		return fail(ProbeDial, control.Mark(err, ErrConnection))
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	res.Dial = time.Since(start)
	tc := c.(*net.TCPConn)
	res.Local = tc.LocalAddr().(*net.TCPAddr).AddrPort()
	res.Remote = tc.RemoteAddr().(*net.TCPAddr).AddrPort()

	start = time.Now()
	tc.SetDeadline(start.Add(timeout))
	if err := dialHandshake(tc, cfg.Auth, cfg.Self, cfg.Target); err != nil {
		if isTimeout(err) {
			err = control.Mark(fmt.Errorf("no handshake answer within %v: the peer accepts connections but does not serve them: %w", timeout, err), ErrTimeout)
		}
		return fail(ProbeHandshake, err)
	}
	res.Handshake = time.Since(start)
	if cfg.Len <= 0 {
		return res, nil
	}

	p := &prober{c: tc, timeout: timeout}
	start = time.Now()
	orig, err := p.read(cfg.Addr, cfg.Len)
	if err != nil {
		return fail(ProbeRange, err)
	}
	res.RTT = time.Since(start)
	pat := make([]byte, cfg.Len)
	for i := range pat {
		pat[i] = cfg.Pattern + byte(i*7) ^ 0xa5
	}
	if bytes.Equal(pat, orig) {
		for i := range pat {
			pat[i] ^= 0xff
		}
	}
	if err := p.write(cfg.Addr, pat); err != nil {
		return fail(ProbeTransfer, fmt.Errorf("WRITE: %w", err))
	}
	back, err := p.read(cfg.Addr, cfg.Len)
	if err != nil {
		return fail(ProbeTransfer, fmt.Errorf("READ back: %w", err))
	}
	werr := p.write(cfg.Addr, orig)
	if i := firstDiff(back, pat); i >= 0 {
		return fail(ProbeTransfer, fmt.Errorf("%w: READ back differs from the WRITE at byte %d of %d (%#02x, wrote %#02x): another writer of that range, or a broken target", ErrProtocol, i, len(pat), back[i], pat[i]))
	}
	if werr != nil {
		return fail(ProbeTransfer, fmt.Errorf("restoring the original bytes: %w", werr))
	}
	res.Verified = len(pat)
	return res, nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// prober speaks the data frames of frame.go, one request at a time.
type prober struct {
	c       *net.TCPConn
	timeout time.Duration
	id      uint64
	hb      [headerLen]byte
}

func (p *prober) roundTrip(o op, addr uint64, payload []byte, n int) (header, error) {
	// Version 2 framing: every target since version 2 serves it.
	p.id++
	h := header{legacy: true, op: o, id: p.id, addr: addr, length: uint64(n)}
	h.encode(p.hb[:])
	p.c.SetDeadline(time.Now().Add(p.timeout))
	msg := append(p.hb[:], payload...)
	if _, err := p.c.Write(msg); err != nil {
		return header{}, p.ioErr("send", err)
	}
	if _, err := io.ReadFull(p.c, p.hb[:]); err != nil {
		return header{}, p.ioErr("reply", err)
	}
	r, err := decodeHeader(p.hb[:])
	if err != nil {
		return header{}, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if r.op != o|opReply || r.id != h.id {
		return header{}, fmt.Errorf("%w: reply %v to request %v", ErrProtocol, r, h)
	}
	if err := statusErr(r.status); err != nil {
		return r, fmt.Errorf("%w (%#x, %d bytes)", err, addr, n)
	}
	return r, nil
}

func (p *prober) ioErr(what string, err error) error {
	if isTimeout(err) {
		return control.Mark(fmt.Errorf("%s: no answer within %v", what, p.timeout), ErrTimeout)
	}
	return control.Mark(fmt.Errorf("%s: %w", what, err), ErrConnection)
}

func (p *prober) read(addr uint64, n int) ([]byte, error) {
	r, err := p.roundTrip(opRead, addr, nil, n)
	if err != nil {
		return nil, err
	}
	if r.length != uint64(n) {
		return nil, fmt.Errorf("%w: READ of %d bytes answered with %d", ErrProtocol, n, r.length)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(p.c, b); err != nil {
		return nil, p.ioErr("READ payload", err)
	}
	return b, nil
}

func (p *prober) write(addr uint64, b []byte) error {
	_, err := p.roundTrip(opWrite, addr, b, len(b))
	return err
}
