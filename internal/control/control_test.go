package control

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/wire"
)

var (
	me  = auth.Party{Name: "ini", Epoch: 1}
	tgt = auth.Party{Name: "tgt", Epoch: 2}
)

// testSpec is tcp's handshake; testProto adds a message of its own (type
// 9) as a carrier would.
var (
	testSpec  = TCP
	testProto = TCP.Proto("test", func(t wire.Type) (int, bool) { return 64, t == 9 }, nil)
)

func secret(t testing.TB, k string) *auth.Secret {
	s, err := auth.New([]byte(k))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs both sides over a real loopback connection.
func run(t *testing.T, is, ts *auth.Secret, target auth.Party, vet func(*auth.Hello) error) (dialErr, acceptErr error) {
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
		_, err = testSpec.Accept(Stream(c, c, &testProto), ts, tgt, vet)
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	dialErr = testSpec.Dial(Stream(c, c, &testProto), is, me, target)
	c.Close()
	return dialErr, <-done
}

// TestHandshake: every outcome, both sides: the kinds errors.Is sees, and
// one line that names the side and the fix.
func TestHandshake(t *testing.T) {
	good, bad := secret(t, "sixteen bytes at least"), secret(t, "sixteen bytes at least, other")
	refuse := func(*auth.Hello) error { return Refuse("user 7 may not connect") }
	for _, c := range []struct {
		name            string
		is, ts          *auth.Secret
		target          auth.Party
		vet             func(*auth.Hello) error
		dial, accept    error
		dialMsg, accMsg string
	}{
		{"secret", good, good, tgt, nil, nil, nil, "", ""},
		{"no auth", nil, nil, tgt, nil, nil, nil, "", ""},
		{"initiator without secret", nil, good, tgt, nil, auth.ErrDenied, auth.ErrUnauthenticated,
			"requires the cluster secret and this side has none: set --auth-file or $TE_AUTH_FILE", "has no cluster secret and this target requires one"},
		{"wrong secret", bad, good, tgt, nil, auth.ErrDenied, auth.ErrDenied,
			"holds a different cluster secret than this side", "holds a different cluster secret than this target"},
		{"target without secret", good, nil, tgt, nil, auth.ErrDenied, auth.ErrDenied,
			"has no cluster secret and this side has one", "this target has none: start it with --auth-file"},
		{"stale epoch", good, good, auth.Party{Name: "tgt", Epoch: 9}, nil, ErrStale, ErrStale, "restarted since", "addressed epoch"},
		{"other name", good, good, auth.Party{Name: "else", Epoch: 2}, nil, auth.ErrDenied, auth.ErrWrongTarget, "is not else", "addressed \"else\""},
		{"refused by the carrier", good, good, tgt, refuse, ErrRefused, ErrRefused, "refused the connection", "user 7 may not connect"},
	} {
		t.Run(c.name, func(t *testing.T) {
			de, ae := run(t, c.is, c.ts, c.target, c.vet)
			if !errors.Is(de, c.dial) || !errors.Is(ae, c.accept) {
				t.Fatalf("dial %v (want %v), accept %v (want %v)", de, c.dial, ae, c.accept)
			}
			for _, e := range []struct {
				err  error
				want string
			}{{de, c.dialMsg}, {ae, c.accMsg}} {
				if e.err == nil {
					continue
				}
				msg := e.err.Error()
				if !strings.Contains(msg, e.want) || strings.Contains(msg, "\n") || strings.Count(msg, "handshake") > 1 {
					t.Errorf("error %q: want one line containing %q", msg, e.want)
				}
			}
		})
	}
}

// TestNotTE: a peer whose first bytes are not te's is told at once, not
// after the handshake's timeout, even when it sends fewer bytes than a
// frame header and then nothing; another te port is named.
func TestNotTE(t *testing.T) {
	for _, c := range []struct {
		name, send, want string
	}{
		{"ssh banner", "SSH-2.0-OpenSSH_9.2\r\n", `its first bytes are "SSH-"`},
		{"three bytes then silence", "+OK", `its first bytes are "+OK"`},
		{"another te port", "TEMD\x03\x06\x00\x00\x00\x00\x00\x00", "te's p2p metadata port, not te's tcp data port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := tcpPair(t)
			go func() {
				io.CopyN(io.Discard, b, wire.HeaderLen) // the start of the hello
				b.Write([]byte(c.send))
			}()
			a.SetDeadline(time.Now().Add(30 * time.Second))
			start := time.Now()
			err := testSpec.Dial(Stream(a, a, &testProto), nil, me, tgt)
			if !errors.Is(err, auth.ErrNotTE) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("dial: %v; want auth.ErrNotTE saying %q", err, c.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %v", d)
			}
			if w, _, _ := What(err); w != "peer does not speak te" {
				t.Fatalf("logged as %q", w)
			}
		})
	}
}

// TestIOErrors: a peer that leaves or stalls is said to, with the cause
// still comparable.
func TestIOErrors(t *testing.T) {
	a, b := tcpPair(t)
	b.Close()
	err := testSpec.Dial(Stream(a, a, &testProto), nil, me, tgt)
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "closed the connection") {
		t.Fatalf("closed peer: %v", err)
	}
	a, _ = tcpPair(t)
	a.SetDeadline(time.Now().Add(50 * time.Millisecond))
	_, err = testSpec.Accept(Stream(a, a, &testProto), nil, tgt, nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "timed out waiting for the hello") {
		t.Fatalf("stalled peer: %v", err)
	}
	if w, _, _ := What(err); w != "peer timed out in the handshake" {
		t.Fatalf("logged as %q", w)
	}
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestLogRateLimited: at most one line per interval; the next line counts
// the failures not written; stale epochs and local closes are no failures.
func TestLogRateLimited(t *testing.T) {
	var out bytes.Buffer
	l := NewLog(slog.New(slog.NewTextHandler(&out, nil)), "tcp", 300*time.Millisecond)
	// A stepped clock: the flood falls inside the interval however slowly
	// a loaded machine (or qemu-user) runs it.
	clock := time.Unix(1e9, 0)
	l.rl.SetClock(func() time.Time { return clock })
	peer := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4242}
	denied := fail(auth.ErrDenied, "x")
	if l.Failed(peer, ErrStale) || l.Failed(peer, net.ErrClosed) {
		t.Fatal("logged a stale epoch or a local close")
	}
	if !l.Failed(peer, denied) {
		t.Fatal("first failure not logged")
	}
	for range 1000 {
		if l.Failed(peer, denied) {
			t.Fatal("flood logged")
		}
	}
	if n := strings.Count(out.String(), "\n"); n != 1 || !strings.Contains(out.String(), "peer=192.0.2.7:4242") || !strings.Contains(out.String(), "peer failed authentication") {
		t.Fatalf("%d lines: %s", n, out.String())
	}
	clock = clock.Add(400 * time.Millisecond)
	l.Failed(peer, fail(ErrClosed, "y"))
	if !strings.Contains(out.String(), "not_logged_since_last=1000") || !strings.Contains(out.String(), "peer closed the connection during the handshake") {
		t.Fatalf("dropped count or closed peer missing: %s", out.String())
	}
}

// TestBounds: a hello with every name at its longest fits MaxHello, and
// the carrier's Limit admits it.
func TestBounds(t *testing.T) {
	long := strings.Repeat("n", auth.MaxNameLen)
	in := (*auth.Secret)(nil).Initiate(long, auth.Party{Name: long, Epoch: 1}, auth.Party{Name: long})
	if n := len(auth.AppendHello(nil, in.Hello())); n > MaxHello {
		t.Fatalf("hello of %d bytes, MaxHello %d", n, MaxHello)
	}
	s := secret(t, "sixteen bytes at least")
	re, err := s.Respond("test", tgt, s.Initiate("test", me, tgt).Hello())
	if err != nil {
		t.Fatal(err)
	}
	if n := 2 + len(auth.AppendChallenge(nil, re.Challenge())); n != MaxChallenge {
		t.Fatalf("challenge of %d bytes, MaxChallenge %d", n, MaxChallenge)
	}
	if n := len(answer(0, auth.Answer{Proof: make([]byte, auth.ProofLen)})); n != MaxAnswer {
		t.Fatalf("answer of %d bytes, MaxAnswer %d", n, MaxAnswer)
	}
	for _, ty := range []wire.Type{1, 2, 3, 4, 9} {
		if n, ok := testProto.Limit(ty); !ok || n < MaxVerdict {
			t.Fatalf("type %d: %d %v", ty, n, ok)
		}
	}
	if _, ok := testProto.Limit(5); ok {
		t.Fatal("type 5 admitted")
	}
}

// FuzzAccept feeds arbitrary initiator bytes to the target's side: no
// panic, and with a secret set nothing but a holder gets through.
func FuzzAccept(f *testing.F) {
	s := secret(f, "the fuzz target's cluster secret")
	var rec bytes.Buffer
	in := (*auth.Secret)(nil).Initiate(testSpec.Label, me, tgt)
	rec.Write(testProto.Append(nil, testSpec.Hello, 0, auth.AppendHello(nil, in.Hello())))
	rec.Write(testProto.Append(nil, testSpec.Answer, 0, answer(StatusOK, auth.Answer{})))
	f.Add(rec.Bytes(), false)
	f.Add(rec.Bytes(), true)
	f.Fuzz(func(t *testing.T, b []byte, withSecret bool) {
		var ts *auth.Secret
		if withSecret {
			ts = s
		}
		_, err := testSpec.Accept(Stream(bytes.NewReader(b), io.Discard, &testProto), ts, tgt, nil)
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
	ok := append(testProto.Append(nil, testSpec.Challenge, 0, e), testProto.Append(nil, testSpec.Verdict, 0, []byte{0, 0})...)
	f.Add(ok, false)
	f.Add(ok, true)
	f.Fuzz(func(t *testing.T, b []byte, withSecret bool) {
		var is *auth.Secret
		if withSecret {
			is = s
		}
		if err := testSpec.Dial(Stream(bytes.NewReader(b), io.Discard, &testProto), is, me, tgt); err == nil && withSecret {
			t.Fatal("a stream of fixed bytes passed the initiator's check")
		}
	})
}

// TestPeerNamesQuoted: the names in a hostile hello (each at the longest
// a hello carries, full of terminal control sequences) reach the
// target's error quoted and cut: no control byte, a bounded line.
func TestPeerNamesQuoted(t *testing.T) {
	evil := strings.Repeat("\x1b]0;pwned\x07\x1b", auth.MaxNameLen)[:auth.MaxNameLen]
	for _, c := range []struct {
		name   string
		secret *auth.Secret // the initiator's
		target string
		want   error
	}{
		{"another segment", nil, evil, auth.ErrWrongTarget},
		{"another secret", secret(t, "sixteen bytes at least"), tgt.Name, auth.ErrDenied},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := tcpPair(t)
			a.SetDeadline(time.Now().Add(30 * time.Second))
			b.SetDeadline(time.Now().Add(30 * time.Second))
			go testSpec.Dial(Stream(b, b, &testProto), c.secret, auth.Party{Name: evil, Epoch: 1}, auth.Party{Name: c.target})
			_, err := testSpec.Accept(Stream(a, a, &testProto), nil, tgt, nil)
			if !errors.Is(err, c.want) {
				t.Fatalf("accept: %v, want %v", err, c.want)
			}
			msg := err.Error()
			if i := strings.IndexFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 || len(msg) > 2*4*maxPeerName+300 || !strings.Contains(msg, "more bytes") {
				t.Fatalf("%d bytes, control byte at %d: %q", len(msg), i, msg)
			}
		})
	}
}

// TestWrongPort: an initiator that reached another te carrier's port (a
// p2p store's get on te's tcp data port, the likeliest mix-up of the two
// ports te serve prints) is told which port it reached, in its own frames,
// and the target logs which one the initiator wanted.
func TestWrongPort(t *testing.T) {
	for _, c := range []struct{ dial, accept *Spec }{{&P2P, &TCP}, {&TCP, &P2P}, {&RDMA, &TCP}, {&P2P, &RDMA}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			s, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer s.Close()
			s.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = c.accept.Accept(Stream(s, s, c.accept.Frames()), nil, tgt, nil)
			done <- err
		}()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		dialErr := c.dial.Dial(Stream(conn, conn, c.dial.Frames()), nil, me, tgt)
		acceptErr := <-done
		conn.Close()
		ln.Close()
		want := "the peer is " + c.accept.Name + ", not " + c.dial.Name + ": check the address"
		if !errors.Is(dialErr, auth.ErrNotTE) || !strings.HasSuffix(dialErr.Error(), want) {
			t.Errorf("%s dialing %s: %v; want auth.ErrNotTE ending %q", c.dial.Label, c.accept.Label, dialErr, want)
		}
		if want := "the initiator speaks to " + c.dial.Name + ", and this is " + c.accept.Name + ": it was given the wrong address"; !errors.Is(acceptErr, auth.ErrNotTE) || !strings.HasSuffix(acceptErr.Error(), want) {
			t.Errorf("%s accepting %s: %v; want auth.ErrNotTE saying %q", c.accept.Label, c.dial.Label, acceptErr, want)
		}
	}
}
