package handshake

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
)

var (
	me  = auth.Party{Name: "ini", Epoch: 1}
	tgt = auth.Party{Name: "tgt", Epoch: 2}
)

func secret(t testing.TB, k string) *auth.Secret {
	s, err := auth.New([]byte(k))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs both sides over a real loopback connection.
func run(t *testing.T, is, ts *auth.Secret, target auth.Party) (dialErr, acceptErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = TCP.Accept(c, ts, tgt)
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	dialErr = TCP.Dial(c, is, me, target)
	c.Close()
	return dialErr, <-done
}

func TestHandshake(t *testing.T) {
	good, bad := secret(t, "sixteen bytes at least"), secret(t, "sixteen bytes at least, other")
	for _, c := range []struct {
		name         string
		is, ts       *auth.Secret
		target       auth.Party
		dial, accept error
	}{
		{"secret", good, good, tgt, nil, nil},
		{"no auth", nil, nil, tgt, nil, nil},
		{"initiator without secret", nil, good, tgt, ErrDenied, auth.ErrUnauthenticated},
		{"wrong secret", bad, good, tgt, ErrDenied, io.EOF},
		{"target without secret", good, nil, tgt, ErrDenied, io.EOF},
		{"stale epoch", good, good, auth.Party{Name: "tgt", Epoch: 9}, ErrStale, ErrStale},
		{"other name", good, good, auth.Party{Name: "else", Epoch: 2}, ErrDenied, auth.ErrWrongTarget},
	} {
		t.Run(c.name, func(t *testing.T) {
			de, ae := run(t, c.is, c.ts, c.target)
			if !errors.Is(de, c.dial) || !errors.Is(ae, c.accept) && !(c.accept == io.EOF && errors.Is(ae, io.ErrUnexpectedEOF)) {
				t.Fatalf("dial %v (want %v), accept %v (want %v)", de, c.dial, ae, c.accept)
			}
		})
	}
}

// stream is a peer that sends fixed bytes and swallows what it is sent.
type stream struct {
	io.Reader
	io.Writer
}

// FuzzAccept feeds arbitrary initiator bytes to the target's side: no
// panic, and with a secret set nothing but a holder gets through.
func FuzzAccept(f *testing.F) {
	s := secret(f, "the fuzz target's cluster secret")
	var rec bytes.Buffer
	in := (*auth.Secret)(nil).Initiate(TCP.Label, me, tgt)
	rec.Write(TCP.Proto.Append(nil, TCP.Hello, 0, auth.AppendHello(nil, in.Hello())))
	rec.Write(TCP.Proto.Append(nil, TCP.Answer, 0, auth.AppendAnswer(nil, auth.Answer{})))
	f.Add(rec.Bytes(), false)
	f.Add(rec.Bytes(), true)
	f.Fuzz(func(t *testing.T, b []byte, withSecret bool) {
		var ts *auth.Secret
		if withSecret {
			ts = s
		}
		_, err := TCP.Accept(stream{bytes.NewReader(b), io.Discard}, ts, tgt)
		if err == nil && withSecret {
			t.Fatal("a stream of fixed bytes passed authentication")
		}
	})
}

// FuzzDial feeds arbitrary target bytes to the initiator's side: no
// panic, and with a secret set no fixed answer passes.
func FuzzDial(f *testing.F) {
	s := secret(f, "the fuzz target's cluster secret")
	var e []byte
	e = append(e, 0, 0)
	e = auth.AppendChallenge(e, auth.Challenge{Epoch: 2})
	ok := append(TCP.Proto.Append(nil, TCP.Challenge, 0, e), TCP.Proto.Append(nil, TCP.Verdict, 0, []byte{0, 0})...)
	f.Add(ok, false)
	f.Add(ok, true)
	f.Fuzz(func(t *testing.T, b []byte, withSecret bool) {
		var is *auth.Secret
		if withSecret {
			is = s
		}
		if err := TCP.Dial(stream{bytes.NewReader(b), io.Discard}, is, me, tgt); err == nil && withSecret {
			t.Fatal("a stream of fixed bytes passed the initiator's check")
		}
	})
}
