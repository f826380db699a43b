// Package control is the one handshake that opens every te connection:
// the tcp transport's lanes, the p2p store's metadata connections, the
// RDMA transport's control connections (all stream sockets) and the shm
// transport's SEQPACKET sockets. Each carrier frames it in internal/wire
// frames of its own protocol (magic, version, frame types) and carries
// its own messages after it:
//
//	initiator → target  hello      auth.Hello: the protocol label, the
//	                               initiator's name and epoch, the target's
//	                               name and the epoch it expects (0: any),
//	                               nonce I
//	target → initiator  challenge  u16 status, then auth.Challenge: the
//	                               target's epoch, nonce T, proof T
//	initiator → target  answer     u16 status, then auth.Answer: proof I
//	target → initiator  verdict    u16 status
//
// A challenge whose status is not OK ends the connection: Stale (the hello
// expected another epoch: a previous incarnation), WrongTarget (another
// segment's name or protocol), Refused (the carrier's own reason, such as
// another user on shm), WrongPort (the hello came in another te carrier's
// frames: the target answers in them, naming its own carrier's label, so
// an initiator given the wrong te port says which port it reached). The initiator checks proof T before it answers; when
// the check fails it answers with status Denied and no proof (so the target
// can log why) and ends the connection. A verdict Denied means the target
// found no or a wrong proof I. The initiator sends its protocol's messages
// only after an OK verdict; the target reads nothing else before it. A
// peer that holds a secret refuses one that does not. Proofs are empty when
// no secret is configured; package auth says what they cover.
//
// Errors are one line each, say which side lacks the secret (or holds
// another), and match the public vocabulary: auth.ErrDenied for every
// failed authentication, auth.ErrNotTE for a peer whose first bytes are
// not te's (found as soon as they arrive). The package also holds the
// rate-limited log every target writes failed handshakes to (Log).
package control

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/wire"
)

// Spec is how one carrier frames the handshake: its frames' magic and
// version, and the four messages' frame types (the carrier's own messages
// take the other types).
type Spec struct {
	// Label is the protocol the proofs are bound to ("tcp", "p2p",
	// "rdma", "shm").
	Label   string
	Magic   [4]byte
	Version uint8
	// Name is what the port is, for errors ("te's tcp data port").
	Name string
	// The frame types of the four messages.
	Hello, Challenge, Answer, Verdict wire.Type
}

// The handshakes of te's carriers.
var (
	TCP  = Spec{Label: "tcp", Magic: [4]byte{'T', 'E', 'T', 'H'}, Version: 2, Name: "te's tcp data port", Hello: 1, Challenge: 2, Answer: 3, Verdict: 4}
	P2P  = Spec{Label: "p2p", Magic: [4]byte{'T', 'E', 'M', 'D'}, Version: 3, Name: "te's p2p metadata port", Hello: 5, Challenge: 6, Answer: 7, Verdict: 8}
	RDMA = Spec{Label: "rdma", Magic: [4]byte{'T', 'E', 'R', 'H'}, Version: 3, Name: "te's rdma control port", Hello: 5, Challenge: 6, Answer: 7, Verdict: 8}
	SHM  = Spec{Label: "shm", Magic: [4]byte{'T', 'S', 'H', 'M'}, Version: 2, Name: "te's shm socket", Hello: 1, Challenge: 2, Answer: 3, Verdict: 10}

	carriers = []*Spec{&TCP, &P2P, &RDMA, &SHM}
)

// Payload bounds of the four messages: the only place they are defined.
const (
	MaxHello     = 1 + auth.NonceLen + 3*(2+auth.MaxNameLen) + 16
	MaxChallenge = 2 + 1 + 8 + auth.NonceLen + 1 + auth.ProofLen
	MaxAnswer    = 2 + 1 + 1 + auth.ProofLen
	MaxVerdict   = 2
)

// Bound returns the payload bound of t when it is one of the handshake's
// frame types.
func (sp *Spec) Bound(t wire.Type) (int, bool) {
	switch t {
	case sp.Hello:
		return MaxHello, true
	case sp.Challenge:
		return MaxChallenge, true
	case sp.Answer:
		return MaxAnswer, true
	case sp.Verdict:
		return MaxVerdict, true
	}
	return 0, false
}

// TypeName names t when it is a handshake frame type, else "".
func (sp *Spec) TypeName(t wire.Type) string {
	switch t {
	case sp.Hello:
		return "hello"
	case sp.Challenge:
		return "challenge"
	case sp.Answer:
		return "answer"
	case sp.Verdict:
		return "verdict"
	}
	return ""
}

// Proto returns the carrier's frame protocol: the handshake's four
// messages and those limit admits (typeName names them; either may be
// nil).
func (sp *Spec) Proto(name string, limit func(wire.Type) (int, bool), typeName func(wire.Type) string) wire.Proto {
	return wire.Proto{
		Name:    name,
		Magic:   sp.Magic,
		Version: sp.Version,
		Limit: func(t wire.Type) (int, bool) {
			if n, ok := sp.Bound(t); ok {
				return n, true
			}
			if limit == nil {
				return 0, false
			}
			return limit(t)
		},
		TypeName: func(t wire.Type) string {
			if n := sp.TypeName(t); n != "" {
				return n
			}
			if typeName != nil {
				return typeName(t)
			}
			return fmt.Sprintf("type %d", uint8(t))
		},
	}
}

// Frames is the carrier's frame protocol with the handshake's messages
// only: what a test's raw peer speaks until the handshake is done.
func (sp *Spec) Frames() *wire.Proto {
	p := sp.Proto(sp.Label+" handshake", nil, nil)
	return &p
}

func (sp *Spec) name(t wire.Type) string {
	if n := sp.TypeName(t); n != "" {
		return n
	}
	return fmt.Sprintf("frame of type %d", uint8(t))
}

// Statuses of a challenge, an answer or a verdict.
const (
	StatusOK          uint16 = 0
	StatusStale       uint16 = 3 // the hello named another incarnation (epoch)
	StatusDenied      uint16 = 5 // failed authentication
	StatusWrongTarget uint16 = 6 // the hello named another segment or protocol
	StatusRefused     uint16 = 7 // the carrier's own refusal (Refuse)
	StatusWrongPort   uint16 = 8 // the hello was another carrier's; the label of this one follows
)

// Errors of the handshake; compare with errors.Is. Failed authentication
// matches auth.ErrDenied, a peer that does not speak te auth.ErrNotTE.
var (
	// ErrStale: the hello named another incarnation of the target.
	ErrStale = errors.New("the target has another epoch (it restarted)")
	// ErrMalformed: a frame out of order or a status not defined.
	ErrMalformed = errors.New("malformed handshake")
	// ErrRefused: the target refused for a reason of its carrier (Refuse).
	ErrRefused = errors.New("the target refused the connection")
	// ErrClosed: the peer closed or reset the connection during the
	// handshake.
	ErrClosed = errors.New("the peer closed the connection during the handshake")
)

// Error is a handshake failure: one line that says what happened and,
// where it can, what to do. It matches its Kind (one of the errors above,
// auth.ErrDenied, auth.ErrUnauthenticated, auth.ErrWrongTarget,
// auth.ErrNotTE) and the cause below it (a timeout, a reset), whose text
// it does not repeat.
type Error struct {
	Msg   string
	Kind  error
	Cause error
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}

func fail(kind error, format string, args ...any) *Error {
	return &Error{Msg: fmt.Sprintf(format, args...), Kind: kind}
}

// Fixes named in the errors.
const (
	fixSecret = "--auth-file or $" + auth.EnvFile
)

// Refuse returns an error that Accept's vet function gives to refuse an
// initiator for a carrier's own reason; the initiator's Dial then fails
// with ErrRefused and the reason.
func Refuse(format string, args ...any) error {
	return fail(ErrRefused, format, args...)
}

// Conn carries whole frames of one carrier's protocol.
type Conn interface {
	WriteFrame(t wire.Type, payload []byte) error
	// ReadFrame returns a payload that stays valid until the next call.
	ReadFrame() (wire.Header, []byte, error)
}

// Stream frames a stream socket: r is read frame by frame (it may be
// the connection or a bufio.Reader on it), w written one frame per Write.
func Stream(r io.Reader, w io.Writer, p *wire.Proto) Conn {
	return &stream{r: r, w: w, p: p}
}

type stream struct {
	r   io.Reader
	w   io.Writer
	p   *wire.Proto
	hdr [wire.HeaderLen]byte
}

func (s *stream) WriteFrame(t wire.Type, payload []byte) error {
	return s.p.Write(s.w, t, 0, payload)
}

func (s *stream) ReadFrame() (wire.Header, []byte, error) {
	return s.p.Read(s.r, s.hdr[:], nil)
}

// Dial runs the initiator's side on a fresh connection (the caller bounds
// it with a deadline). It returns nil once the target accepted; the
// connection then carries the protocol's own messages.
func (sp *Spec) Dial(c Conn, s *auth.Secret, me, target auth.Party) error {
	in := s.Initiate(sp.Label, me, target)
	if err := c.WriteFrame(sp.Hello, auth.AppendHello(nil, in.Hello())); err != nil {
		return sp.ioError(err, "sending the hello")
	}
	h, p, err := c.ReadFrame()
	if err != nil {
		return sp.ioError(err, waitChallenge)
	}
	if h.Type != sp.Challenge {
		return fail(ErrMalformed, "%s handshake: the target sent a %s instead of a challenge", sp.Label, sp.name(h.Type))
	}
	st, p, err := status(p)
	if err != nil {
		return sp.malformed("challenge", err)
	}
	switch st {
	case StatusOK:
	case StatusStale:
		return fail(ErrStale, "%s handshake: the target restarted since its descriptor was read (another epoch)", sp.Label)
	case StatusWrongTarget:
		return fail(auth.ErrWrongTarget, "%s handshake: the peer is not %s (it serves another segment): check the segment name and its address", sp.Label, target.Name)
	case StatusDenied:
		return fail(auth.ErrDenied, "%s handshake: authentication failed: the target refused this initiator", sp.Label)
	case StatusRefused:
		return fail(ErrRefused, "%s handshake: the target refused the connection", sp.Label)
	case StatusWrongPort:
		port := "another te port"
		for _, c := range carriers {
			if c.Label == string(p) && c != sp {
				port = c.Name
			}
		}
		return fail(auth.ErrNotTE, "%s handshake: the peer is %s, not %s: check the address", sp.Label, port, sp.Name)
	default:
		return fail(ErrMalformed, "%s handshake: challenge status %d", sp.Label, st)
	}
	ch, rest, err := auth.ParseChallenge(p)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d bytes after the challenge", len(rest))
	}
	if err != nil {
		return sp.malformed("challenge", err)
	}
	ans, err := in.Finish(ch)
	if err != nil {
		// The target does not hold our secret: tell it why (so it can
		// log it) and send nothing else.
		c.WriteFrame(sp.Answer, answer(StatusDenied, auth.Answer{}))
		if errors.Is(err, auth.ErrUnauthenticated) {
			return fail(auth.ErrUnauthenticated, "%s handshake: authentication failed: the target has no cluster secret and this side has one: give the target the same secret (%s), or neither side one", sp.Label, fixSecret)
		}
		return fail(auth.ErrDenied, "%s handshake: authentication failed: the target holds a different cluster secret than this side: use the same secret file on both (%s)", sp.Label, fixSecret)
	}
	if err := c.WriteFrame(sp.Answer, answer(StatusOK, ans)); err != nil {
		return sp.ioError(err, "sending the answer")
	}
	h, p, err = c.ReadFrame()
	if err != nil {
		return sp.ioError(err, "waiting for the verdict")
	}
	if h.Type != sp.Verdict {
		return fail(ErrMalformed, "%s handshake: the target sent a %s instead of a verdict", sp.Label, sp.name(h.Type))
	}
	st, p, err = status(p)
	if err == nil && len(p) != 0 {
		err = fmt.Errorf("%d bytes after the verdict", len(p))
	}
	if err != nil {
		return sp.malformed("verdict", err)
	}
	switch st {
	case StatusOK:
		return nil
	case StatusDenied:
		if s == nil {
			return fail(auth.ErrDenied, "%s handshake: authentication failed: the target requires the cluster secret and this side has none: set %s to the target's secret file", sp.Label, fixSecret)
		}
		return fail(auth.ErrDenied, "%s handshake: authentication failed: the target did not accept this side's proof", sp.Label)
	case StatusRefused:
		return fail(ErrRefused, "%s handshake: the target refused the connection", sp.Label)
	}
	return fail(ErrMalformed, "%s handshake: verdict status %d", sp.Label, st)
}

// Accept runs the target's side on a fresh connection (the caller bounds
// it with a deadline). vet, when not nil, sees the hello before any
// challenge: an error from Refuse refuses the initiator (status Refused),
// any other error makes the hello malformed. Accept returns the hello's
// initiator once it proved the secret (or none is set). Nothing of the
// target is exposed before it returns nil.
func (sp *Spec) Accept(c Conn, s *auth.Secret, me auth.Party, vet func(*auth.Hello) error) (auth.Party, error) {
	h, p, err := c.ReadFrame()
	if err != nil {
		sp.tellWrongPort(c, err)
		return auth.Party{}, sp.ioError(err, waitHello)
	}
	if h.Type != sp.Hello {
		return auth.Party{}, fail(ErrMalformed, "%s handshake: the initiator sent a %s instead of a hello", sp.Label, sp.name(h.Type))
	}
	hello, rest, err := auth.ParseHello(p)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d bytes after the hello", len(rest))
	}
	if err != nil {
		return auth.Party{}, sp.malformed("hello", err)
	}
	challenge := func(st uint16, ch auth.Challenge) error {
		b := append(make([]byte, 0, MaxChallenge), byte(st>>8), byte(st))
		return c.WriteFrame(sp.Challenge, auth.AppendChallenge(b, ch))
	}
	if vet != nil {
		if err := vet(&hello); err != nil {
			var e *Error
			if errors.As(err, &e) && e.Kind == ErrRefused {
				challenge(StatusRefused, auth.Challenge{Epoch: me.Epoch})
				return auth.Party{}, err
			}
			return auth.Party{}, sp.malformed("hello", err)
		}
	}
	if hello.Target.Epoch != 0 && hello.Target.Epoch != me.Epoch {
		challenge(StatusStale, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, fail(ErrStale, "%s handshake: the initiator %s addressed epoch %#x, this is %#x", sp.Label, peerName(hello.Initiator.Name), hello.Target.Epoch, me.Epoch)
	}
	re, err := s.Respond(sp.Label, me, hello)
	if err != nil {
		challenge(StatusWrongTarget, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, fail(auth.ErrWrongTarget, "%s handshake: the initiator %s addressed %s (%s), this is %q (%s)", sp.Label, peerName(hello.Initiator.Name), peerName(hello.Target.Name), peerName(hello.Proto), me.Name, sp.Label)
	}
	if err := challenge(StatusOK, re.Challenge()); err != nil {
		return auth.Party{}, sp.ioError(err, "sending the challenge")
	}
	h, p, err = c.ReadFrame()
	if err != nil {
		if s == nil && errors.Is(err, io.EOF) {
			// An initiator with a secret drops a target without one.
			return auth.Party{}, fail(ErrClosed, "%s handshake: the initiator %s closed the connection after the challenge (an initiator with a cluster secret leaves a target without one: give this target %s)", sp.Label, peerName(hello.Initiator.Name), fixSecret)
		}
		return auth.Party{}, sp.ioError(err, "waiting for the answer")
	}
	if h.Type != sp.Answer {
		return auth.Party{}, fail(ErrMalformed, "%s handshake: the initiator sent a %s instead of an answer", sp.Label, sp.name(h.Type))
	}
	st, p, err := status(p)
	var ans auth.Answer
	if err == nil {
		ans, rest, err = auth.ParseAnswer(p)
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("%d bytes after the answer", len(rest))
		}
	}
	if err != nil {
		return auth.Party{}, sp.malformed("answer", err)
	}
	verdict := func(st uint16) error {
		return c.WriteFrame(sp.Verdict, []byte{byte(st >> 8), byte(st)})
	}
	switch st {
	case StatusOK:
	case StatusDenied:
		if s == nil {
			return auth.Party{}, fail(auth.ErrDenied, "%s handshake: authentication failed: the initiator %s holds a cluster secret and this target has none: start it with %s", sp.Label, peerName(hello.Initiator.Name), fixSecret)
		}
		return auth.Party{}, fail(auth.ErrDenied, "%s handshake: authentication failed: the initiator %s holds a different cluster secret than this target", sp.Label, peerName(hello.Initiator.Name))
	default:
		return auth.Party{}, fail(ErrMalformed, "%s handshake: answer status %d", sp.Label, st)
	}
	if err := re.Check(ans); err != nil {
		verdict(StatusDenied)
		if errors.Is(err, auth.ErrUnauthenticated) {
			return auth.Party{}, fail(auth.ErrUnauthenticated, "%s handshake: authentication failed: the initiator %s has no cluster secret and this target requires one (the initiator needs %s)", sp.Label, peerName(hello.Initiator.Name), fixSecret)
		}
		return auth.Party{}, fail(auth.ErrDenied, "%s handshake: authentication failed: the initiator %s sent a wrong proof (a replayed or forged handshake)", sp.Label, peerName(hello.Initiator.Name))
	}
	if err := verdict(StatusOK); err != nil {
		return auth.Party{}, sp.ioError(err, "sending the verdict")
	}
	return re.Initiator(), nil
}

// AppendAnswer appends an answer's payload (status, then a) to b; a raw
// peer in tests builds its answers with it.
func AppendAnswer(b []byte, st uint16, a auth.Answer) []byte {
	return auth.AppendAnswer(append(b, byte(st>>8), byte(st)), a)
}

// What a side was doing when the connection failed.
const (
	waitHello     = "waiting for the hello"
	waitChallenge = "waiting for the challenge"
)

func answer(st uint16, a auth.Answer) []byte {
	return AppendAnswer(make([]byte, 0, MaxAnswer), st, a)
}

// status splits a message's leading u16 status off.
func status(p []byte) (uint16, []byte, error) {
	if len(p) < 2 {
		return 0, nil, fmt.Errorf("%d bytes, no status", len(p))
	}
	return uint16(p[0])<<8 | uint16(p[1]), p[2:], nil
}

func (sp *Spec) malformed(what string, err error) error {
	return &Error{Msg: fmt.Sprintf("%s handshake: malformed %s: %v", sp.Label, what, err), Kind: ErrMalformed, Cause: err}
}

// ioError says what a read or write failure during the handshake means:
// a peer of another protocol (on the first frame read; later, a peer
// that broke the handshake), a peer that left, one that stalled.
func (sp *Spec) ioError(err error, doing string) error {
	var me *wire.MagicError
	first := doing == waitHello || doing == waitChallenge
	switch {
	case errors.As(err, &me) && first:
		return &Error{Msg: sp.Label + " handshake: " + sp.notTE(me.Got, doing == waitHello), Kind: auth.ErrNotTE, Cause: err}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isReset(err):
		return &Error{Msg: fmt.Sprintf("%s handshake: the peer closed the connection %s", sp.Label, doing), Kind: ErrClosed, Cause: err}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &Error{Msg: fmt.Sprintf("%s handshake: timed out %s (a stalled peer, or one that is not te)", sp.Label, doing), Kind: os.ErrDeadlineExceeded, Cause: err}
	case errors.Is(err, net.ErrClosed):
		return err // closed here: not the peer's doing
	case errors.Is(err, wire.ErrFrame):
		return &Error{Msg: fmt.Sprintf("%s handshake: %s: %v", sp.Label, doing, err), Kind: ErrMalformed, Cause: err}
	}
	return &Error{Msg: fmt.Sprintf("%s handshake: %s: %v", sp.Label, doing, err), Kind: ErrClosed, Cause: err}
}

// tellWrongPort answers an initiator whose first bytes were another te
// carrier's magic in that carrier's frames: a challenge with status
// WrongPort and this carrier's label, so the initiator says which port it
// reached instead of seeing the connection close. Stream carriers only
// (a SEQPACKET socket is not reached by mistake for a TCP port).
func (sp *Spec) tellWrongPort(c Conn, err error) {
	var me *wire.MagicError
	s, ok := c.(*stream)
	if !ok || !errors.As(err, &me) || len(me.Got) != 4 {
		return
	}
	for _, o := range carriers {
		if o.Magic == [4]byte(me.Got) && o.Magic != sp.Magic {
			b := append([]byte{byte(StatusWrongPort >> 8), byte(StatusWrongPort)}, sp.Label...)
			o.Frames().Write(s.w, o.Challenge, 0, b)
			return
		}
	}
}

// notTE says what a peer whose first bytes are got is: another te port
// (or, to a target, an initiator of another te port given this one's
// address), or not te at all.
func (sp *Spec) notTE(got []byte, target bool) string {
	for _, c := range carriers {
		if len(got) == 4 && [4]byte(got) == c.Magic && c.Magic != sp.Magic {
			if target {
				return "the initiator speaks to " + c.Name + ", and this is " + sp.Name + ": it was given the wrong address"
			}
			return "the peer is " + c.Name + ", not " + sp.Name + ": check the address"
		}
	}
	return fmt.Sprintf("the peer does not speak te (its first bytes are %q): is this a te port?", got)
}

// maxPeerName is how many bytes of a name from a hello an error keeps.
const maxPeerName = 128

// peerName quotes a name a peer chose (an initiator's, the target it
// addressed, its protocol label) for an error: control characters
// escaped, cut past maxPeerName bytes with a count, so a hostile hello
// cannot write to a terminal or a log line through the target's errors.
func peerName(s string) string {
	if len(s) <= maxPeerName {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s…(%d more bytes)", strconv.Quote(strings.ToValidUTF8(s[:maxPeerName], "")), len(s)-maxPeerName)
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}

// Mark returns err with its message unchanged that also matches kind: a
// carrier maps a handshake failure onto its own vocabulary (a stale epoch
// onto engine.ErrPeerReset, a closed connection onto a retryable error)
// without repeating either text.
func Mark(err error, kind error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: kind}
}

type marked struct{ err, kind error }

func (m *marked) Error() string   { return m.err.Error() }
func (m *marked) Unwrap() []error { return []error{m.err, m.kind} }
