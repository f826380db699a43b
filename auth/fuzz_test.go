package auth

import (
	"bytes"
	"testing"
)

// The three decoders read bytes from unauthenticated peers: they must
// never panic, and what decodes must re-encode to the bytes consumed.

func FuzzParseHello(f *testing.F) {
	f.Add(AppendHello(nil, (*Secret)(nil).Initiate("tcp", ini, tgt).Hello()))
	f.Add([]byte{msgVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, rest, err := ParseHello(b)
		if err != nil {
			return
		}
		if len(h.Proto) > MaxNameLen || len(h.Initiator.Name) > MaxNameLen || len(h.Target.Name) > MaxNameLen {
			t.Fatal("name over the bound accepted")
		}
		if enc := AppendHello(nil, h); !bytes.Equal(enc, b[:len(b)-len(rest)]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzParseChallenge(f *testing.F) {
	s, _ := New([]byte(testKey))
	re, _ := s.Respond("tcp", tgt, s.Initiate("tcp", ini, tgt).Hello())
	f.Add(AppendChallenge(nil, re.Challenge()))
	f.Add(AppendChallenge(nil, Challenge{Epoch: 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, rest, err := ParseChallenge(b)
		if err != nil {
			return
		}
		if len(c.Proof) != 0 && len(c.Proof) != ProofLen {
			t.Fatalf("proof of %d bytes accepted", len(c.Proof))
		}
		if enc := AppendChallenge(nil, c); !bytes.Equal(enc, b[:len(b)-len(rest)]) {
			t.Fatalf("re-encoding differs")
		}
		// A random challenge never passes an initiator's check.
		if _, err := s.Initiate("tcp", ini, tgt).Finish(c); err == nil {
			t.Fatal("forged challenge accepted")
		}
	})
}

func FuzzParseAnswer(f *testing.F) {
	s, _ := New([]byte(testKey))
	f.Add(AppendAnswer(nil, Answer{Proof: bytes.Repeat([]byte{1}, ProofLen)}))
	f.Add(AppendAnswer(nil, Answer{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, rest, err := ParseAnswer(b)
		if err != nil {
			return
		}
		if enc := AppendAnswer(nil, a); !bytes.Equal(enc, b[:len(b)-len(rest)]) {
			t.Fatalf("re-encoding differs")
		}
		re, _ := s.Respond("tcp", tgt, s.Initiate("tcp", ini, tgt).Hello())
		if re.Check(a) == nil {
			t.Fatal("forged answer accepted")
		}
	})
}
