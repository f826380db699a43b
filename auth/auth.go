// Package auth lets only the peers of a te cluster that hold its shared
// secret connect to each other: a mutual challenge-response, HMAC-SHA256
// over fresh nonces from both sides and both parties' segment names and
// epochs, run once per connection before any lane, descriptor or queue
// pair is handed out.
//
// # Secret
//
// The secret is a file's contents (at least MinSecretLen bytes after
// trailing white space is trimmed), loaded with Load or, from the file
// named by $TE_AUTH_FILE, FromEnv. A file that others may read or write is
// refused. A nil *Secret means authentication is off: handshakes still run
// (so both ends speak one protocol) but carry no proofs, and a peer that
// holds a secret refuses a peer that does not. A Secret never prints or
// marshals its key: fmt, slog and encoding/json all see "redacted".
//
// # Handshake
//
// Three messages, whatever carries them (the tcp HELLO, the p2p metadata
// connection, the RDMA handshake):
//
//	initiator → target  Hello      proto, initiator name+epoch, target name, nonce I
//	target → initiator  Challenge  target epoch, nonce T, proof T
//	initiator → target  Answer     proof I
//
//	proof T = HMAC(secret, "te-auth v1 target"    ‖ transcript)
//	proof I = HMAC(secret, "te-auth v1 initiator" ‖ transcript)
//	transcript = proto, initiator name and epoch, target name and epoch,
//	             nonce I, nonce T (length-prefixed, unambiguous)
//
// Each side draws its nonce afresh, so a captured message is worthless on
// another connection (replay); the role labels keep a target's proof from
// being reflected as an initiator's; the names bind the proofs to the two
// parties, and the target refuses a Hello addressed to another name, so a
// proof cannot be relayed to a third peer. Proofs are compared in constant
// time (hmac.Equal). The initiator checks proof T before it sends proof I
// or any request: a target without the secret learns nothing it could
// use and receives no data.
//
// # API
//
// Initiator side:
//
//	in := secret.Initiate(proto, me, target) // target.Epoch may be 0 (unknown)
//	hello := in.Hello()                      // send: AppendHello(buf, hello)
//	// receive the Challenge (ParseChallenge)
//	answer, err := in.Finish(ch)             // err: the target failed; send nothing
//	// send: AppendAnswer(buf, answer)
//
// Target side:
//
//	h, err := ParseHello(payload)
//	re, err := secret.Respond(proto, me, h)  // err: addressed to another name
//	ch := re.Challenge()                     // send: AppendChallenge(buf, ch)
//	// receive the Answer (ParseAnswer)
//	err = re.Check(answer)                   // nil: the initiator holds the secret
//
// The Append/Parse functions give every protocol one bounded encoding of
// the three messages (fuzzed in this package); a protocol may append its
// own fields after them (internal/control frames them for every te
// connection, and logs the failures). WarnUnauthenticated is the one
// warning a listener on a non-loopback address without a secret logs.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"strings"

	"github.com/rdmago/te/internal/regfile"
)

// Sizes and limits.
const (
	// NonceLen is the size of a handshake nonce.
	NonceLen = 32
	// ProofLen is the size of a proof (HMAC-SHA256).
	ProofLen = sha256.Size
	// MinSecretLen is the shortest secret accepted.
	MinSecretLen = 16
	// MaxSecretLen bounds a secret file.
	MaxSecretLen = 4096
	// MaxNameLen bounds a name (and a proto label) in a Hello.
	MaxNameLen = 1024
	// EnvFile names the environment variable FromEnv reads.
	EnvFile = "TE_AUTH_FILE"
)

// Errors; compare with errors.Is.
var (
	// ErrDenied: the peer's proof is wrong or missing (it does not hold
	// the cluster secret, or replayed another connection's messages).
	ErrDenied = errors.New("auth: peer failed authentication")
	// ErrUnauthenticated: authentication is on here, and the peer does
	// not authenticate (it has no secret configured).
	ErrUnauthenticated = fmt.Errorf("%w: the peer has no cluster secret configured", ErrDenied)
	// ErrWrongTarget: a Hello addressed to another segment name.
	ErrWrongTarget = fmt.Errorf("%w: hello addressed to another segment", ErrDenied)
	// ErrMessage: a handshake message that does not decode.
	ErrMessage = errors.New("auth: malformed handshake message")
	// ErrNoPath: Load was given a blank path.
	ErrNoPath = errors.New("auth: blank secret file name: name a file, or give none to run without authentication")
	// ErrNotTE: the peer does not speak te's handshake (its first bytes
	// are another protocol's, or another te port's).
	ErrNotTE = errors.New("auth: the peer does not speak te")
)

// Secret is a loaded cluster secret; nil means authentication is off.
type Secret struct {
	key []byte
}

// New returns a secret holding a copy of key.
func New(key []byte) (*Secret, error) {
	if len(key) < MinSecretLen {
		return nil, fmt.Errorf("auth: secret of %d bytes, want at least %d", len(key), MinSecretLen)
	}
	if len(key) > MaxSecretLen {
		return nil, fmt.Errorf("auth: secret of %d bytes, want at most %d", len(key), MaxSecretLen)
	}
	return &Secret{key: bytes.Clone(key)}, nil
}

// Load reads a secret from a file. Trailing white space (a final newline)
// is not part of it. Only a regular file is read (a FIFO or device fails
// at once instead of blocking), and one that group or others may read or
// write is refused, as is one shorter than MinSecretLen or longer than
// MaxSecretLen. A blank path is an error: to run without a secret, load
// none.
func Load(path string) (*Secret, error) {
	if strings.TrimSpace(path) == "" {
		return nil, ErrNoPath
	}
	b, fi, err := regfile.Read(path, MaxSecretLen)
	defer clear(b)
	switch {
	case fi != nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("auth: secret file %s has mode %v: others may read it (chmod 600)", path, fi.Mode().Perm())
	case errors.Is(err, regfile.ErrNotRegular):
		return nil, fmt.Errorf("auth: secret file: %w: name a regular file of at least %d bytes, mode 0600", err, MinSecretLen)
	case errors.Is(err, regfile.ErrTooLarge):
		return nil, fmt.Errorf("auth: secret file: %w", err)
	case err != nil:
		return nil, fmt.Errorf("auth: secret file: %w", err)
	}
	s, err := New(bytes.TrimRight(b, " \t\r\n"))
	if err != nil {
		return nil, fmt.Errorf("auth: secret file %s: %w", path, err)
	}
	return s, nil
}

// EnvPath returns the secret file named by $TE_AUTH_FILE, "" when it is
// unset or blank (blank means unset, here and in FromEnv).
func EnvPath() string { return strings.TrimSpace(os.Getenv(EnvFile)) }

// FromEnv loads the secret named by $TE_AUTH_FILE; nil, nil when it is
// unset or blank.
func FromEnv() (*Secret, error) {
	p := EnvPath()
	if p == "" {
		return nil, nil
	}
	s, err := Load(p)
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", EnvFile, err)
	}
	return s, nil
}

// Enabled reports whether s holds a secret (authentication is on).
func (s *Secret) Enabled() bool { return s != nil }

// String never shows the key.
func (s *Secret) String() string {
	if s == nil {
		return "auth.Secret(none)"
	}
	return "auth.Secret(redacted)"
}

// GoString never shows the key (%#v).
func (s *Secret) GoString() string { return s.String() }

// Format never shows the key, whatever the verb (%x, %+v, ...).
func (s *Secret) Format(f fmt.State, _ rune) { fmt.Fprint(f, s.String()) }

// LogValue never shows the key.
func (s *Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON never shows the key.
func (s *Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// MarshalText never shows the key.
func (s *Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Party is one end of a handshake: a segment (or store) name and its
// epoch.
type Party struct {
	Name  string
	Epoch uint64
}

// Nonce is a handshake nonce.
type Nonce [NonceLen]byte

func newNonce() Nonce {
	var n Nonce
	rand.Read(n[:]) // never fails (crypto/rand since Go 1.24)
	return n
}

// Hello is the initiator's first message.
type Hello struct {
	Proto     string // the protocol ("tcp", "p2p", "rdma"): proofs differ per protocol
	Initiator Party
	Target    Party // Epoch: what the initiator expects, 0 when unknown
	Nonce     Nonce
}

// Challenge is the target's answer to a Hello.
type Challenge struct {
	Epoch uint64 // the target's epoch, part of the transcript
	Nonce Nonce
	Proof []byte // empty when the target has no secret
}

// Answer is the initiator's proof.
type Answer struct {
	Proof []byte // empty when the initiator has no secret
}

const (
	labelTarget    = "te-auth v1 target"
	labelInitiator = "te-auth v1 initiator"
)

// prove computes HMAC(key, label ‖ transcript).
func (s *Secret) prove(label string, h *Hello, targetEpoch uint64, nt *Nonce) []byte {
	m := hmac.New(sha256.New, s.key)
	writeStr(m, label)
	writeStr(m, h.Proto)
	writeStr(m, h.Initiator.Name)
	writeU64(m, h.Initiator.Epoch)
	writeStr(m, h.Target.Name)
	writeU64(m, targetEpoch)
	m.Write(h.Nonce[:])
	m.Write(nt[:])
	return m.Sum(make([]byte, 0, ProofLen))
}

func writeStr(m hash.Hash, s string) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(len(s)))
	m.Write(b[:])
	m.Write([]byte(s))
}

func writeU64(m hash.Hash, v uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	m.Write(b[:])
}

// Initiator is the initiating side of one handshake.
type Initiator struct {
	s     *Secret
	hello Hello
}

// Initiate starts a handshake from me to target over proto with a fresh
// nonce. s may be nil (authentication off).
func (s *Secret) Initiate(proto string, me, target Party) *Initiator {
	return &Initiator{s: s, hello: Hello{Proto: proto, Initiator: me, Target: target, Nonce: newNonce()}}
}

// Hello returns the message to send first.
func (in *Initiator) Hello() Hello { return in.hello }

// Finish checks the target's challenge and returns the answer to send.
// With a secret, a challenge without a valid proof fails with ErrDenied
// (ErrUnauthenticated when it has none): the caller must then drop the
// connection without sending anything. Without a secret the answer is
// empty and the challenge's proof is not checked (the initiator cannot).
func (in *Initiator) Finish(ch Challenge) (Answer, error) {
	if in.s == nil {
		return Answer{}, nil
	}
	if len(ch.Proof) == 0 {
		return Answer{}, fmt.Errorf("target %s: %w", in.hello.Target.Name, ErrUnauthenticated)
	}
	want := in.s.prove(labelTarget, &in.hello, ch.Epoch, &ch.Nonce)
	if !hmac.Equal(want, ch.Proof) {
		return Answer{}, fmt.Errorf("target %s: %w: wrong proof", in.hello.Target.Name, ErrDenied)
	}
	return Answer{Proof: in.s.prove(labelInitiator, &in.hello, ch.Epoch, &ch.Nonce)}, nil
}

// Responder is the target side of one handshake.
type Responder struct {
	s     *Secret
	hello Hello
	ch    Challenge
}

// Respond answers a Hello received by me (the target) with a fresh
// nonce. It fails with ErrWrongTarget when the Hello names another target
// (or another protocol). s may be nil (authentication off).
func (s *Secret) Respond(proto string, me Party, h Hello) (*Responder, error) {
	if h.Proto != proto {
		return nil, fmt.Errorf("%w: protocol %q, this is %q", ErrWrongTarget, h.Proto, proto)
	}
	if h.Target.Name != me.Name {
		return nil, fmt.Errorf("%w: addressed to %q, this is %q", ErrWrongTarget, h.Target.Name, me.Name)
	}
	r := &Responder{s: s, hello: h, ch: Challenge{Epoch: me.Epoch, Nonce: newNonce()}}
	if s != nil {
		r.ch.Proof = s.prove(labelTarget, &r.hello, me.Epoch, &r.ch.Nonce)
	}
	return r, nil
}

// Challenge returns the message to send in reply to the Hello.
func (r *Responder) Challenge() Challenge { return r.ch }

// Initiator returns the initiator as its Hello named it (authenticated
// only once Check has returned nil).
func (r *Responder) Initiator() Party { return r.hello.Initiator }

// Check verifies the initiator's answer: nil when it holds the secret (or
// authentication is off here), else ErrDenied or ErrUnauthenticated.
func (r *Responder) Check(a Answer) error {
	if r.s == nil {
		return nil
	}
	if len(a.Proof) == 0 {
		return ErrUnauthenticated
	}
	want := r.s.prove(labelInitiator, &r.hello, r.ch.Epoch, &r.ch.Nonce)
	if !hmac.Equal(want, a.Proof) {
		return fmt.Errorf("%w: wrong proof", ErrDenied)
	}
	return nil
}
