package auth

import (
	"encoding/binary"
	"fmt"
)

// Encoding of the three messages, version 1, big-endian:
//
//	Hello      u8 version | nonce[32] | str proto | str initiator name |
//	           u64 initiator epoch | str target name | u64 target epoch
//	Challenge  u8 version | u64 target epoch | nonce[32] | u8 n | proof[n]
//	Answer     u8 version | u8 n | proof[n]
//
// str is u16 length then bytes (at most MaxNameLen); n is 0 (no secret) or
// ProofLen. The Parse functions return what follows the message, for the
// carrying protocol's own fields.
const msgVersion = 1

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendHello appends h's encoding to b. Names longer than MaxNameLen are
// the caller's error; they are refused by ParseHello.
func AppendHello(b []byte, h Hello) []byte {
	b = append(b, msgVersion)
	b = append(b, h.Nonce[:]...)
	b = appendStr(b, h.Proto)
	b = appendStr(b, h.Initiator.Name)
	b = binary.BigEndian.AppendUint64(b, h.Initiator.Epoch)
	b = appendStr(b, h.Target.Name)
	return binary.BigEndian.AppendUint64(b, h.Target.Epoch)
}

// AppendChallenge appends c's encoding to b.
func AppendChallenge(b []byte, c Challenge) []byte {
	b = append(b, msgVersion)
	b = binary.BigEndian.AppendUint64(b, c.Epoch)
	b = append(b, c.Nonce[:]...)
	b = append(b, byte(len(c.Proof)))
	return append(b, c.Proof...)
}

// AppendAnswer appends a's encoding to b.
func AppendAnswer(b []byte, a Answer) []byte {
	b = append(b, msgVersion, byte(len(a.Proof)))
	return append(b, a.Proof...)
}

// dec reads fields off a message, remembering the first error.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMessage, what)
	}
	d.b = nil
}

func (d *dec) bytes(n int, what string) []byte {
	if d.err != nil || len(d.b) < n {
		d.fail("short " + what)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u8(what string) byte {
	if v := d.bytes(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (d *dec) u64(what string) uint64 {
	if v := d.bytes(8, what); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *dec) str(what string) string {
	l := d.bytes(2, what)
	if l == nil {
		return ""
	}
	n := int(binary.BigEndian.Uint16(l))
	if n > MaxNameLen {
		d.fail(fmt.Sprintf("%s of %d bytes (at most %d)", what, n, MaxNameLen))
		return ""
	}
	return string(d.bytes(n, what))
}

func (d *dec) version() {
	if v := d.u8("version"); d.err == nil && v != msgVersion {
		d.fail(fmt.Sprintf("version %d, want %d", v, msgVersion))
	}
}

func (d *dec) proof() []byte {
	n := d.u8("proof length")
	if d.err != nil {
		return nil
	}
	if n != 0 && n != ProofLen {
		d.fail(fmt.Sprintf("proof of %d bytes", n))
		return nil
	}
	p := d.bytes(int(n), "proof")
	if n == 0 || d.err != nil {
		return nil
	}
	return append([]byte(nil), p...)
}

// ParseHello decodes a Hello from the start of b.
func ParseHello(b []byte) (Hello, []byte, error) {
	d := dec{b: b}
	var h Hello
	d.version()
	copy(h.Nonce[:], d.bytes(NonceLen, "nonce"))
	h.Proto = d.str("proto")
	h.Initiator.Name = d.str("initiator name")
	h.Initiator.Epoch = d.u64("initiator epoch")
	h.Target.Name = d.str("target name")
	h.Target.Epoch = d.u64("target epoch")
	if d.err != nil {
		return Hello{}, nil, d.err
	}
	return h, d.b, nil
}

// ParseChallenge decodes a Challenge from the start of b.
func ParseChallenge(b []byte) (Challenge, []byte, error) {
	d := dec{b: b}
	var c Challenge
	d.version()
	c.Epoch = d.u64("epoch")
	copy(c.Nonce[:], d.bytes(NonceLen, "nonce"))
	c.Proof = d.proof()
	if d.err != nil {
		return Challenge{}, nil, d.err
	}
	return c, d.b, nil
}

// ParseAnswer decodes an Answer from the start of b.
func ParseAnswer(b []byte) (Answer, []byte, error) {
	d := dec{b: b}
	d.version()
	a := Answer{Proof: d.proof()}
	if d.err != nil {
		return Answer{}, nil, d.err
	}
	return a, d.b, nil
}
