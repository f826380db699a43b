package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment"
)

const testKey = "the p2p tests' cluster secret"

func testSecret(t testing.TB) *auth.Secret {
	t.Helper()
	s, err := auth.New([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAuth: with the secret on both ends a descriptor is fetched; a peer
// without it, or with another one, gets none (ErrUnavailable wrapping
// auth.ErrDenied); a client with a secret refuses a server without one.
func TestAuth(t *testing.T) {
	good := testSecret(t)
	other, _ := auth.New([]byte(testKey + ", the wrong one"))
	for _, c := range []struct {
		name        string
		server, cli *auth.Secret
		ok          bool
	}{
		{"both hold the secret", good, good, true},
		{"auth off", nil, nil, true},
		{"client without the secret", good, nil, false},
		{"client with another secret", good, other, false},
		{"server without a secret", nil, good, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			a := newStore(t, Options{Auth: c.server})
			if err := a.Publish(ctx, desc(a.Name(), 1, 1)); err != nil {
				t.Fatal(err)
			}
			b := newStore(t, Options{Auth: c.cli})
			d, err := b.Get(ctx, a.Name())
			if c.ok {
				if err != nil || d.Name != a.Name() {
					t.Fatalf("Get = %v, %v", d, err)
				}
				return
			}
			if d != nil || !errors.Is(err, segment.ErrUnavailable) || !errors.Is(err, auth.ErrDenied) {
				t.Fatalf("Get = %v, %v; want no descriptor and ErrUnavailable wrapping auth.ErrDenied", d, err)
			}
		})
	}
}

type recorder struct {
	net.Conn
	sent bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.sent.Write(p)
	return r.Conn.Write(p)
}

// TestAuthHostile: on the raw socket of a store with a secret, a peer
// that skips the challenge, forges the answer or replays a holder's
// captured handshake gets no descriptor; the failures are logged with its
// address, rate-limited, and never with the secret.
func TestAuthHostile(t *testing.T) {
	ctx := ctxT(t)
	secret := testSecret(t)
	var logBuf testenv.Buffer
	a := newStore(t, Options{Auth: secret, Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	d := desc(a.Name(), 1, 1)
	if err := a.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	marker, _ := segment.Marshal(d)
	get := appendFrame(nil, frameGet, []byte(a.Name()))
	me := auth.Party{Name: "mallory:1", Epoch: 1}
	them := auth.Party{Name: a.Name()}
	noDescriptor := func(what string, c net.Conn) {
		t.Helper()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		rest, err := io.ReadAll(c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: connection left open", what)
		}
		if bytes.Contains(rest, marker[:20]) || bytes.Contains(rest, []byte(`"buffers"`)) {
			t.Fatalf("%s: descriptor sent", what)
		}
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", a.ListenAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	in := (*auth.Secret)(nil).Initiate("p2p", me, them)
	hello := appendFrame(nil, frameHello, auth.AppendHello(nil, in.Hello()))

	attackStart := time.Now()
	// Skip the challenge: hello then get.
	c := dial()
	c.Write(append(append([]byte(nil), hello...), get...))
	noDescriptor("get instead of an answer", c)

	// A forged answer, then get.
	c = dial()
	c.Write(hello)
	var hdr [headerLen]byte
	if _, _, err := readFrame(bufio.NewReader(c), hdr[:], segment.MaxEncodedSize); err != nil {
		t.Fatal(err)
	}
	c.Write(append(appendFrame(nil, frameAnswer, control.AppendAnswer(nil, control.StatusOK, auth.Answer{Proof: bytes.Repeat([]byte{9}, auth.ProofLen)})), get...))
	noDescriptor("forged answer", c)

	// Replay a holder's handshake.
	raw := dial()
	rec := &recorder{Conn: raw}
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	if err := handshake.Dial(control.Stream(rec, rec, &responses), secret, me, them); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	c = dial()
	c.Write(append(rec.sent.Bytes(), get...))
	noDescriptor("replayed handshake", c)

	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logBuf.String(), "te: p2p: "); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failure logged")
		}
	}
	out := logBuf.String()
	// At most one line a second (the failure log's interval).
	bound := min(1+int(time.Since(attackStart)/time.Second), 2)
	if n := strings.Count(out, "te: p2p: "); n > bound || !strings.Contains(out, "peer=127.0.0.1:") || strings.Contains(out, testKey) {
		t.Fatalf("%d lines for 3 failures in %v, or no address, or the secret:\n%s", n, time.Since(attackStart), out)
	}
	t.Logf("log:\n%s", out)
}
