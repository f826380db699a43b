// Package tcphs is the handshake that opens every connection of the tcp
// transport, in internal/wire frames (magic "TETH", version 1), before the
// first data frame:
//
//	initiator → target  hello      auth.Hello: proto "tcp", the initiator's
//	                               name and epoch, the target's name and the
//	                               epoch from its descriptor, nonce I
//	target → initiator  challenge  u16 status, then auth.Challenge: the
//	                               target's epoch, nonce T, proof T
//	initiator → target  answer     auth.Answer: proof I
//	target → initiator  verdict    u16 status
//
// A challenge with status Stale (the hello named another incarnation) or
// Denied (another segment's name) ends the connection; so does a verdict
// with status Denied (no or a wrong proof, with the target's cluster
// secret set). Proofs are empty when no secret is configured; package
// auth says what they cover. The initiator checks proof T before it
// answers, and sends requests only after an OK verdict; the target reads
// no request before it. A peer that holds a secret refuses one that does
// not.
//
// It is a package of its own so that tests outside package tcp (a
// target that never answers, an attacker holding connections) speak the
// real handshake.
package tcphs

import (
	"errors"
	"fmt"
	"io"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/wire"
)

// Proto is the handshake's frame protocol.
var Proto = wire.Proto{
	Name:    "tcp handshake",
	Magic:   [4]byte{'T', 'E', 'T', 'H'},
	Version: 1,
	Limit: func(t wire.Type) (int, bool) {
		switch t {
		case Hello:
			return helloMax, true
		case Challenge:
			return 2 + challengeMax, true
		case Answer:
			return answerMax, true
		case Verdict:
			return 2, true
		}
		return 0, false
	},
	TypeName: typeName,
}

func typeName(t wire.Type) string {
	switch t {
	case Hello:
		return "hello"
	case Challenge:
		return "challenge"
	case Answer:
		return "answer"
	case Verdict:
		return "verdict"
	}
	return fmt.Sprintf("frame type %d", uint8(t))
}

// Frame types.
const (
	Hello     wire.Type = 1
	Challenge wire.Type = 2
	Answer    wire.Type = 3
	Verdict   wire.Type = 4
)

// Statuses of a challenge or verdict.
const (
	StatusOK     uint16 = 0
	StatusStale  uint16 = 3 // the hello named another incarnation (epoch)
	StatusDenied uint16 = 5 // failed authentication, or another segment's name
)

const (
	// Bounds of the auth messages (version, fields, three names).
	helloMax     = 1 + auth.NonceLen + 3*(2+auth.MaxNameLen) + 16
	challengeMax = 1 + 8 + auth.NonceLen + 1 + auth.ProofLen
	answerMax    = 1 + 1 + auth.ProofLen

	// AuthProto is the protocol label proofs are bound to.
	AuthProto = "tcp"
)

// Errors; compare with errors.Is.
var (
	// ErrStale: the hello named another incarnation of the target.
	ErrStale = errors.New("tcp handshake: the target has another epoch")
	// ErrDenied wraps auth.ErrDenied: authentication failed (either way)
	// or the hello named another segment.
	ErrDenied = fmt.Errorf("tcp handshake: refused: %w", auth.ErrDenied)
	// ErrMalformed: a frame out of order or a status not defined.
	ErrMalformed = errors.New("tcp handshake: malformed")
)

// Dial runs the initiator's side on a fresh connection (the caller sets
// its deadline). It returns nil once the target accepted; the connection
// then carries data frames.
func Dial(rw io.ReadWriter, s *auth.Secret, me, target auth.Party) error {
	in := s.Initiate(AuthProto, me, target)
	if err := Proto.Write(rw, Hello, 0, auth.AppendHello(nil, in.Hello())); err != nil {
		return err
	}
	var hdr [wire.HeaderLen]byte
	h, p, err := Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return err
	}
	if h.Type != Challenge {
		return fmt.Errorf("%w: %s instead of a challenge", ErrMalformed, typeName(h.Type))
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
	if err := Proto.Write(rw, Answer, 0, auth.AppendAnswer(nil, ans)); err != nil {
		return err
	}
	h, p, err = Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return err
	}
	if h.Type != Verdict {
		return fmt.Errorf("%w: %s instead of a verdict", ErrMalformed, typeName(h.Type))
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
func Accept(rw io.ReadWriter, s *auth.Secret, me auth.Party) (auth.Party, error) {
	var hdr [wire.HeaderLen]byte
	h, p, err := Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return auth.Party{}, err
	}
	if h.Type != Hello {
		return auth.Party{}, fmt.Errorf("%w: %s instead of a hello", ErrMalformed, typeName(h.Type))
	}
	hello, rest, err := auth.ParseHello(p)
	if err != nil || len(rest) != 0 {
		return auth.Party{}, fmt.Errorf("%w: hello: %v (%d bytes left)", ErrMalformed, err, len(rest))
	}
	challenge := func(st uint16, ch auth.Challenge) error {
		var e wire.Enc
		e.U16(st)
		e.B = auth.AppendChallenge(e.B, ch)
		return Proto.Write(rw, Challenge, 0, e.B)
	}
	if hello.Target.Epoch != me.Epoch {
		challenge(StatusStale, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, ErrStale
	}
	re, err := s.Respond(AuthProto, me, hello)
	if err != nil {
		challenge(StatusDenied, auth.Challenge{Epoch: me.Epoch})
		return auth.Party{}, err
	}
	if err := challenge(StatusOK, re.Challenge()); err != nil {
		return auth.Party{}, err
	}
	h, p, err = Proto.Read(rw, hdr[:], nil)
	if err != nil {
		return auth.Party{}, err
	}
	if h.Type != Answer {
		return auth.Party{}, fmt.Errorf("%w: %s instead of an answer", ErrMalformed, typeName(h.Type))
	}
	ans, rest, err := auth.ParseAnswer(p)
	if err != nil || len(rest) != 0 {
		return auth.Party{}, fmt.Errorf("%w: answer: %v (%d bytes left)", ErrMalformed, err, len(rest))
	}
	verdict := func(st uint16) error {
		var e wire.Enc
		e.U16(st)
		return Proto.Write(rw, Verdict, 0, e.B)
	}
	if err := re.Check(ans); err != nil {
		verdict(StatusDenied)
		return auth.Party{}, err
	}
	return re.Initiator(), verdict(StatusOK)
}
