package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const testKey = "correct horse battery staple 42"

func secret(t testing.TB, key string) *Secret {
	t.Helper()
	s, err := New([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	ini = Party{Name: "10.0.0.1:15001", Epoch: 0x1111}
	tgt = Party{Name: "10.0.0.2:15001", Epoch: 0x2222}
)

// handshake runs the three messages through their encodings and returns
// each side's verdict.
func handshake(t *testing.T, is, ts *Secret) (iniErr, tgtErr error) {
	t.Helper()
	in := is.Initiate("tcp", ini, Party{Name: tgt.Name, Epoch: tgt.Epoch})
	h, rest, err := ParseHello(AppendHello(nil, in.Hello()))
	if err != nil || len(rest) != 0 {
		t.Fatalf("hello: %v, %d bytes left", err, len(rest))
	}
	re, err := ts.Respond("tcp", tgt, h)
	if err != nil {
		t.Fatal(err)
	}
	ch, _, err := ParseChallenge(AppendChallenge(nil, re.Challenge()))
	if err != nil {
		t.Fatal(err)
	}
	ans, err := in.Finish(ch)
	if err != nil {
		return err, nil
	}
	a, _, err := ParseAnswer(AppendAnswer(nil, ans))
	if err != nil {
		t.Fatal(err)
	}
	return nil, re.Check(a)
}

func TestHandshake(t *testing.T) {
	good, other := secret(t, testKey), secret(t, testKey+"!")
	for _, c := range []struct {
		name         string
		is, ts       *Secret
		iniOK, tgtOK bool
	}{
		{"both hold the secret", good, good, true, true},
		{"auth off on both", nil, nil, true, true},
		{"wrong secret", other, good, false, true}, // the initiator catches the target first
		{"initiator without secret", nil, good, true, false},
		{"target without secret", good, nil, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ie, te := handshake(t, c.is, c.ts)
			if (ie == nil) != c.iniOK || (te == nil) != c.tgtOK {
				t.Fatalf("initiator %v, target %v", ie, te)
			}
			for _, err := range []error{ie, te} {
				if err != nil && !errors.Is(err, ErrDenied) {
					t.Fatalf("error %v does not wrap ErrDenied", err)
				}
			}
		})
	}
}

// TestWrongSecretInitiator: an initiator without the right secret that
// skips checking the target still gets refused by it.
func TestWrongSecretInitiator(t *testing.T) {
	good, other := secret(t, testKey), secret(t, testKey+"!")
	in := other.Initiate("tcp", ini, tgt)
	re, err := good.Respond("tcp", tgt, in.Hello())
	if err != nil {
		t.Fatal(err)
	}
	ch := re.Challenge()
	// Forge the answer as a target-blind attacker would: its own proof.
	forged := Answer{Proof: other.prove(labelInitiator, &in.hello, ch.Epoch, &ch.Nonce)}
	if err := re.Check(forged); !errors.Is(err, ErrDenied) {
		t.Fatalf("wrong secret accepted: %v", err)
	}
	if err := re.Check(Answer{Proof: make([]byte, ProofLen)}); !errors.Is(err, ErrDenied) {
		t.Fatalf("zero proof accepted: %v", err)
	}
	if err := re.Check(Answer{}); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("missing proof: %v", err)
	}
}

// TestReplay: an answer captured on one connection is refused on the
// next, whose target nonce differs; so is a target proof replayed to an
// initiator, and a target proof reflected as an initiator's.
func TestReplay(t *testing.T) {
	s := secret(t, testKey)
	in := s.Initiate("tcp", ini, tgt)
	re1, _ := s.Respond("tcp", tgt, in.Hello())
	ans, err := in.Finish(re1.Challenge())
	if err != nil {
		t.Fatal(err)
	}
	if err := re1.Check(ans); err != nil {
		t.Fatal(err)
	}
	// The attacker replays the captured Hello and Answer.
	re2, _ := s.Respond("tcp", tgt, in.Hello())
	if err := re2.Check(ans); !errors.Is(err, ErrDenied) {
		t.Fatalf("replayed answer accepted: %v", err)
	}
	// Reflection: the target's own proof sent back as the answer.
	if err := re2.Check(Answer{Proof: re2.Challenge().Proof}); !errors.Is(err, ErrDenied) {
		t.Fatalf("reflected proof accepted: %v", err)
	}
	// A recorded challenge replayed to a new initiator (fake target).
	in2 := s.Initiate("tcp", ini, tgt)
	if _, err := in2.Finish(re1.Challenge()); !errors.Is(err, ErrDenied) {
		t.Fatalf("replayed challenge accepted: %v", err)
	}
}

// TestBinding: a proof is bound to both names, both epochs and the
// protocol; a Hello for another target or protocol is refused.
func TestBinding(t *testing.T) {
	s := secret(t, testKey)
	in := s.Initiate("tcp", ini, tgt)
	if _, err := s.Respond("tcp", Party{Name: "elsewhere:1", Epoch: 1}, in.Hello()); !errors.Is(err, ErrWrongTarget) {
		t.Fatalf("hello to another target: %v", err)
	}
	if _, err := s.Respond("p2p", tgt, in.Hello()); !errors.Is(err, ErrWrongTarget) {
		t.Fatalf("hello of another protocol: %v", err)
	}
	re, _ := s.Respond("tcp", tgt, in.Hello())
	ch := re.Challenge()
	mutations := map[string]func(h *Hello, ep *uint64){
		"initiator name":  func(h *Hello, _ *uint64) { h.Initiator.Name += "x" },
		"initiator epoch": func(h *Hello, _ *uint64) { h.Initiator.Epoch++ },
		"target name":     func(h *Hello, _ *uint64) { h.Target.Name += "x" },
		"target epoch":    func(_ *Hello, ep *uint64) { *ep++ },
		"proto":           func(h *Hello, _ *uint64) { h.Proto = "rdma" },
		"initiator nonce": func(h *Hello, _ *uint64) { h.Nonce[0] ^= 1 },
	}
	for name, mut := range mutations {
		h, ep := in.Hello(), ch.Epoch
		mut(&h, &ep)
		p := s.prove(labelInitiator, &h, ep, &ch.Nonce)
		if err := re.Check(Answer{Proof: p}); !errors.Is(err, ErrDenied) {
			t.Errorf("%s changed, proof still accepted", name)
		}
	}
}

func TestNoncesFresh(t *testing.T) {
	s := secret(t, testKey)
	a, b := s.Initiate("tcp", ini, tgt).Hello().Nonce, s.Initiate("tcp", ini, tgt).Hello().Nonce
	if a == b || a == (Nonce{}) {
		t.Fatal("nonces repeat")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	s, err := Load(write("good", testKey+"\n", 0o600))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.key, []byte(testKey)) {
		t.Fatal("trailing newline kept in the key")
	}
	for _, c := range []struct{ name, content, want string }{
		{"short", "tooshort\n", "at least"},
		{"long", strings.Repeat("k", MaxSecretLen+1), "too large"},
		{"readable", testKey, "others may read"},
	} {
		mode := os.FileMode(0o600)
		if c.name == "readable" {
			mode = 0o644
		}
		if _, err := Load(write(c.name, c.content, mode)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Load(dir); err == nil {
		t.Error("a directory loaded as a secret")
	}
	for _, blank := range []string{"", " ", "\t \n"} {
		if _, err := Load(blank); !errors.Is(err, ErrNoPath) {
			t.Errorf("Load(%q): %v, want ErrNoPath", blank, err)
		}
		// Blank means unset, as in the CLI.
		t.Setenv(EnvFile, blank)
		if s, err := FromEnv(); s != nil || err != nil || EnvPath() != "" {
			t.Fatalf("$%s=%q: %v %v, path %q", EnvFile, blank, s, err, EnvPath())
		}
	}
	t.Setenv(EnvFile, filepath.Join(dir, "good"))
	if s, err := FromEnv(); s == nil || err != nil {
		t.Fatalf("set: %v %v", s, err)
	}
	t.Setenv(EnvFile, filepath.Join(dir, "short"))
	if _, err := FromEnv(); err == nil || !strings.Contains(err.Error(), EnvFile) {
		t.Fatalf("bad file: %v", err)
	}
}

// TestLoadFIFO: a FIFO (or device) named as the secret file is refused
// at once; opening a FIFO without a writer used to block forever.
func TestLoadFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero"} {
		done := make(chan error, 1)
		go func() {
			_, err := Load(p)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), p) {
				t.Errorf("Load(%s): %v", p, err)
			}
		case <-time.After(time.Second):
			t.Fatalf("Load(%s) blocked for a second", p)
		}
	}
}

// TestRedacted: the key never shows, whatever prints the secret.
func TestRedacted(t *testing.T) {
	s := secret(t, testKey)
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "secret", s)
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("x", "secret", s)
	js, _ := json.Marshal(struct{ S *Secret }{s})
	out := fmt.Sprintf("%v %+v %#v %s %x %q %d", s, s, s, s, s, s, s) + logged.String() + string(js)
	if strings.Contains(out, testKey) || strings.Contains(out, fmt.Sprintf("%x", testKey)) || strings.Contains(out, "correct") {
		t.Fatalf("secret printed: %s", out)
	}
	if !strings.Contains(out, "redacted") {
		t.Fatalf("no redaction marker: %s", out)
	}
}

func TestParseRejects(t *testing.T) {
	s := secret(t, testKey)
	h := AppendHello(nil, s.Initiate("tcp", ini, tgt).Hello())
	for i := range h {
		if _, _, err := ParseHello(h[:i]); !errors.Is(err, ErrMessage) {
			t.Fatalf("hello cut at %d: %v", i, err)
		}
	}
	bad := append([]byte(nil), h...)
	bad[0] = 9
	if _, _, err := ParseHello(bad); !errors.Is(err, ErrMessage) {
		t.Fatalf("version: %v", err)
	}
	long := AppendHello(nil, Hello{Proto: "tcp", Initiator: Party{Name: strings.Repeat("n", MaxNameLen+1)}})
	if _, _, err := ParseHello(long); !errors.Is(err, ErrMessage) {
		t.Fatalf("long name: %v", err)
	}
	if _, _, err := ParseChallenge(AppendChallenge(nil, Challenge{Proof: make([]byte, 5)})); !errors.Is(err, ErrMessage) {
		t.Fatalf("odd proof: %v", err)
	}
	if _, _, err := ParseAnswer([]byte{msgVersion, ProofLen, 1, 2}); !errors.Is(err, ErrMessage) {
		t.Fatalf("short proof: %v", err)
	}
	a, rest, err := ParseAnswer(append(AppendAnswer(nil, Answer{}), 7, 8))
	if err != nil || a.Proof != nil || !bytes.Equal(rest, []byte{7, 8}) {
		t.Fatalf("answer with trailer: %v %v %v", a, rest, err)
	}
}

func TestWarnUnauthenticated(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	any4 := &net.TCPAddr{IP: net.IPv4zero, Port: 1}
	if WarnUnauthenticated(log, "tcp", lo, nil) || WarnUnauthenticated(log, "tcp", any4, secret(t, testKey)) {
		t.Fatal("warned on loopback or with a secret")
	}
	if !WarnUnauthenticated(log, "tcp", any4, nil) || !strings.Contains(out.String(), EnvFile) {
		t.Fatalf("no warning for 0.0.0.0 without a secret: %q", out.String())
	}
}
