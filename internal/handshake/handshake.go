// Package handshake is the authenticated handshake that opens te's
// control and data connections (the tcp transport's, the p2p metadata
// store's, and the RDMA transport's), in internal/wire frames of the
// carrying protocol:
//
//	initiator → target  hello      auth.Hello: the protocol label, the
//	                               initiator's name and epoch, the target's
//	                               name and the epoch it expects (0: any),
//	                               nonce I
//	target → initiator  challenge  u16 status, then auth.Challenge: the
//	                               target's epoch, nonce T, proof T
//	initiator → target  answer     auth.Answer: proof I
//	target → initiator  verdict    u16 status
//
// A challenge with status Stale (the hello expected another epoch: a
// previous incarnation) or Denied (another target's name) ends the
// connection; so does a verdict with status Denied (no or a wrong proof,
// with the target's cluster secret set). Proofs are empty when no secret
// is configured; package auth says what they cover. The initiator checks
// proof T before it answers, and sends anything else only after an OK
// verdict; the target reads nothing else before it. A peer that holds a
// secret refuses one that does not.
//
// A Spec names the frame protocol and types a carrier uses; TCP is the
// tcp transport's (magic "TETH", version 1, nothing but the handshake).
// Tests outside the carrying packages (a target that never answers, an
// attacker holding connections) speak the real handshake through it.
package handshake

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/wire"
)

// Spec is how one carrier frames the handshake.
type Spec struct {
	// Proto frames the messages; its Limit must admit the four types
	// with at least MaxHello, MaxChallenge, MaxAnswer and MaxVerdict
	// bytes.
	Proto *wire.Proto
	// The frame types of the four messages.
	Hello, Challenge, Answer, Verdict wire.Type
	// Label is the protocol the proofs are bound to ("tcp", "p2p",
	// "rdma").
	Label string
}

// Payload bounds of the four messages.
const (
	MaxHello     = 1 + auth.NonceLen + 3*(2+auth.MaxNameLen) + 16
	MaxChallenge = 2 + 1 + 8 + auth.NonceLen + 1 + auth.ProofLen
	MaxAnswer    = 1 + 1 + auth.ProofLen
	MaxVerdict   = 2
)

// TCP is the tcp transport's handshake.
var TCP = Spec{Proto: &tcpProto, Hello: 1, Challenge: 2, Answer: 3, Verdict: 4, Label: "tcp"}

var tcpProto = wire.Proto{
	Name:    "tcp handshake",
	Magic:   [4]byte{'T', 'E', 'T', 'H'},
	Version: 1,
	Limit: func(t wire.Type) (int, bool) {
		switch t {
		case 1:
			return MaxHello, true
		case 2:
			return MaxChallenge, true
		case 3:
			return MaxAnswer, true
		case 4:
			return MaxVerdict, true
		}
		return 0, false
	},
	TypeName: func(t wire.Type) string {
		if t >= 1 && t <= 4 {
			return [...]string{"hello", "challenge", "answer", "verdict"}[t-1]
		}
		return fmt.Sprintf("frame type %d", uint8(t))
	},
}

func (sp *Spec) name(t wire.Type) string {
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
	return fmt.Sprintf("frame type %d", uint8(t))
}

// Statuses of a challenge or verdict.
const (
	StatusOK     uint16 = 0
	StatusStale  uint16 = 3 // the hello named another incarnation (epoch)
	StatusDenied uint16 = 5 // failed authentication, or another segment's name
)

// Errors; compare with errors.Is.
var (
	// ErrStale: the hello named another incarnation of the target.
	ErrStale = errors.New("handshake: the target has another epoch")
	// ErrDenied wraps auth.ErrDenied: authentication failed (either way)
	// or the hello named another segment.
	ErrDenied = fmt.Errorf("handshake: refused: %w", auth.ErrDenied)
	// ErrMalformed: a frame out of order or a status not defined.
	ErrMalformed = errors.New("handshake: malformed")
)

// Dial runs the initiator's side on a fresh connection (the caller sets
// its deadline). It returns nil once the target accepted; the connection
// then carries data frames.
func (sp *Spec) Dial(rw io.ReadWriter, s *auth.Secret, me, target auth.Party) error {
	in := s.Initiate(sp.Label, me, target)
	if err := sp.Proto.Write(rw, sp.Hello, 0, auth.AppendHello(nil, in.Hello())); err != nil {
		return err
	}
	var hdr [wire.HeaderLen]byte
	h, p, err := sp.Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return err
	}
	if h.Type != sp.Challenge {
		return fmt.Errorf("%w: %s instead of a challenge", ErrMalformed, sp.name(h.Type))
	}
	d := wire.NewDec(p)
	st := d.U16()
	if err := d.Err(); err != nil {
		return err
	}
	switch st {
	case StatusOK:
	case StatusStale:
		return ErrStale
	case StatusDenied:
		return ErrDenied
	default:
		return fmt.Errorf("%w: challenge status %d", ErrMalformed, st)
	}
	ch, rest, err := auth.ParseChallenge(p[2:])
	if err != nil || len(rest) != 0 {
		return fmt.Errorf("%w: challenge: %v (%d bytes left)", ErrMalformed, err, len(rest))
	}
	ans, err := in.Finish(ch)
	if err != nil {
		// The target does not hold the secret: nothing more is sent.
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	if err := sp.Proto.Write(rw, sp.Answer, 0, auth.AppendAnswer(nil, ans)); err != nil {
		return err
	}
	h, p, err = sp.Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return err
	}
	if h.Type != sp.Verdict {
		return fmt.Errorf("%w: %s instead of a verdict", ErrMalformed, sp.name(h.Type))
	}
	d = wire.NewDec(p)
	st = d.U16()
	if err := d.Finish(); err != nil {
		return err
	}
	switch st {
	case StatusOK:
		return nil
	case StatusDenied:
		return ErrDenied
	}
	return fmt.Errorf("%w: verdict status %d", ErrMalformed, st)
}

// Accept runs the target's side on a fresh connection (the caller sets
// its deadline). It returns the initiator as it named itself once it
// proved the secret (or none is set); ErrStale when it addressed another
// incarnation; an error wrapping auth.ErrDenied when it failed
// authentication or named another segment. Nothing of the target is
// exposed before it returns nil.
func (sp *Spec) Accept(rw io.ReadWriter, s *auth.Secret, me auth.Party) (auth.Party, error) {
	var hdr [wire.HeaderLen]byte
	h, p, err := sp.Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return auth.Party{}, err
	}
	if h.Type != sp.Hello {
		return auth.Party{}, fmt.Errorf("%w: %s instead of a hello", ErrMalformed, sp.name(h.Type))
	}
	hello, rest, err := auth.ParseHello(p)
	if err != nil || len(rest) != 0 {
		return auth.Party{}, fmt.Errorf("%w: hello: %v (%d bytes left)", ErrMalformed, err, len(rest))
	}
	challenge := func(st uint16, ch auth.Challenge) error {
		var e wire.Enc
		e.U16(st)
		e.B = auth.AppendChallenge(e.B, ch)
		return sp.Proto.Write(rw, sp.Challenge, 0, e.B)
	}
	if hello.Target.Epoch != 0 && hello.Target.Epoch != me.Epoch {
		challenge(StatusStale, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, ErrStale
	}
	re, err := s.Respond(sp.Label, me, hello)
	if err != nil {
		challenge(StatusDenied, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, err
	}
	if err := challenge(StatusOK, re.Challenge()); err != nil {
		return auth.Party{}, err
	}
	h, p, err = sp.Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return auth.Party{}, err
	}
	if h.Type != sp.Answer {
		return auth.Party{}, fmt.Errorf("%w: %s instead of an answer", ErrMalformed, sp.name(h.Type))
	}
	ans, rest, err := auth.ParseAnswer(p)
	if err != nil || len(rest) != 0 {
		return auth.Party{}, fmt.Errorf("%w: answer: %v (%d bytes left)", ErrMalformed, err, len(rest))
	}
	verdict := func(st uint16) error {
		var e wire.Enc
		e.U16(st)
		return sp.Proto.Write(rw, sp.Verdict, 0, e.B)
	}
	if err := re.Check(ans); err != nil {
		verdict(StatusDenied)
		return auth.Party{}, err
	}
	return re.Initiator(), verdict(StatusOK)
}
