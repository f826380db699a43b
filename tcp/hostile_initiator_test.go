package tcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// TestStallsAreBounded: after its handshake, a connection that sends half
// a frame header, or an out-of-range WRITE header whose payload never
// comes (the read-and-discard path), or a vector cut short, is closed
// after IOTimeout; it does not hold its slot for ever. With and without
// a cluster secret.
func TestStallsAreBounded(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("auth=", on), func(t *testing.T) {
			var s *auth.Secret
			if on {
				s = testSecret(t)
			}
			const timeout = 500 * time.Millisecond
			n := newNode(t, nil, "victim", 1<<16, Config{IOTimeout: timeout, Auth: s})
			var hb [headerLen]byte
			(&header{op: opWrite, id: 1, addr: n.base(), length: 64}).encode(hb[:])
			var out [headerLen]byte
			(&header{op: opWrite, id: 2, addr: 8, length: 1 << 20}).encode(out[:])
			for name, send := range map[string][]byte{
				"half header":                  hb[:headerLen/2],
				"one byte":                     hb[:1],
				"out-of-range WRITE, no bytes": out[:],
				"out-of-range WRITE, some":     append(out[:], make([]byte, 1000)...),
				"in-range WRITE, half payload": append(hb[:], make([]byte, 32)...),
				"WRITEV, half its entries": vecFrame(header{op: opWriteV, id: 3, addr: 2, length: 128},
					[][2]uint64{{n.base(), 64}}, nil),
				"WRITEV, half payload": vecFrame(header{op: opWriteV, id: 3, addr: 2, length: 128},
					[][2]uint64{{n.base(), 64}, {8, 64}}, make([]byte, 32)),
			} {
				r := dialRaw(t, n, n.e.Epoch(), true)
				if _, err := r.c.Write(send); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				// Generous: only a connection held for ever must fail.
				r.c.SetDeadline(time.Now().Add(30 * time.Second))
				r.closed()
				t.Logf("%s: closed after %v (IOTimeout %v)", name, time.Since(start).Round(time.Millisecond), timeout)
			}
		})
	}
}

// TestMoreThenSilence: one READ with the More flag, then nothing: the
// reply (and the pin on its region) waits at most IOTimeout for the rest
// of the burst, then goes out, so UnregisterLocalMemory succeeds within
// IOTimeout plus a margin while the client stays connected.
func TestMoreThenSilence(t *testing.T) {
	const timeout = time.Second
	n := newNode(t, nil, "victim", 1<<20, Config{IOTimeout: timeout})
	req := frame(header{op: opRead, flags: flagMore, id: 1, addr: n.base(), length: 4096}, nil)
	var r *rawConn
	var pinned time.Time
	for attempt := 0; ; attempt++ {
		r = dialRaw(t, n, n.e.Epoch(), true)
		if _, err := r.c.Write(req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond << attempt)
		err := n.e.UnregisterLocalMemory(n.buf())
		if errors.Is(err, engine.ErrMemoryBusy) {
			pinned = time.Now()
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if attempt == 6 {
			t.Fatal("the receiver never pinned the region")
		}
		r.c.Close() // not read yet: start over
		if err := n.e.RegisterLocalMemory(n.buf(), ""); err != nil {
			t.Fatal(err)
		}
	}
	for n.e.UnregisterLocalMemory(n.buf()) != nil {
		if time.Since(pinned) > timeout+10*time.Second {
			t.Fatalf("region still pinned %v after a READ with More and silence (IOTimeout %v)", time.Since(pinned), timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("unregistered %v after the first refusal (IOTimeout %v)", time.Since(pinned).Round(time.Millisecond), timeout)
	// The reply went out (unregistration waits for the pin only).
	r.c.SetDeadline(time.Now().Add(30 * time.Second))
	if h := r.reply(); h.id != 1 || h.status != statusOK || h.length != 4096 {
		t.Fatalf("reply %v", h)
	}
}

const (
	emfileEnv   = "TE_TCP_TEST_EMFILE_TARGET"
	emfileLimit = 48 // the child's RLIMIT_NOFILE
)

// runEMFILETarget is the child of TestAcceptSurvivesEMFILE: a target with
// a logger on stderr, started under a low RLIMIT_NOFILE.
func runEMFILETarget() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := engine.New(engine.Config{Name: "child", Logger: log})
	if err == nil {
		err = e.Install(New(Config{IOTimeout: 500 * time.Millisecond}))
	}
	var mem *engine.Memory
	if err == nil {
		mem, err = engine.Alloc(1 << 20)
	}
	if err == nil {
		err = e.RegisterLocalMemory(mem.Bytes(), "")
	}
	var b []byte
	if err == nil {
		b, err = segment.Marshal(e.LocalDescriptor())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s\n", b)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestAcceptSurvivesEMFILE: a target whose process runs out of file
// descriptors (RLIMIT_NOFILE lowered in a child process, more clients than
// descriptors) keeps accepting once descriptors are free again: it backs
// off and logs, instead of leaving the port listening with nobody
// accepting.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" -test.run='^$'`, emfileLimit), os.Args[0])
	cmd.Env = append(os.Environ(), emfileEnv+"=1")
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	d, err := segment.Unmarshal([]byte(strings.TrimSpace(line)))
	if err != nil {
		t.Fatal(err)
	}
	pr, _ := d.Protocol(segment.ProtoTCP)
	// More clients than the child has descriptors; each holds its
	// connection open.
	var flood []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", pr.Endpoint)
		if err != nil {
			break // backlog full
		}
		flood = append(flood, c)
	}
	// Wait until the child holds every descriptor it may open.
	fds := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		return len(ents)
	}
	for deadline := time.Now().Add(30 * time.Second); fds() < emfileLimit; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the child never ran out of descriptors (%d open):\n%s", fds(), stderr.String())
		}
	}
	time.Sleep(50 * time.Millisecond) // let its accept fail on them
	for _, c := range flood {
		c.Close()
	}
	// A real initiator is served again.
	st := enginetest.NewMemStore()
	defer st.Close()
	if err := st.Publish(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, st, "ini", 1<<16, Config{IOTimeout: 5 * time.Second})
	ctx := ctxT(t, 60*time.Second)
	for {
		seg, err := n.e.OpenSegment(ctx, "child", nil)
		if err == nil {
			err = n.e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: n.buf()[:4096], Target: seg, TargetAddr: d.Buffers[0].Addr}})
			n.e.CloseSegment(seg)
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no initiator served after the descriptor shortage: %v\nchild stderr:\n%s", err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond) // the child still drains the flood
	}
	if !strings.Contains(stderr.String(), "too many open files") {
		t.Fatalf("the accept failure was not logged:\n%s", stderr.String())
	}
	t.Logf("child log:\n%s", stderr.String())
}

// authPair is a target and an initiator node over one store, each with
// its own secret (nil: none).
func authPair(t *testing.T, tgtSecret, iniSecret *auth.Secret, log *slog.Logger) (tgt, ini *node, st *enginetest.MemStore) {
	t.Helper()
	st = enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	tr := New(Config{Auth: tgtSecret, IOTimeout: 2 * time.Second})
	nn := enginetest.NewNode(t, engine.Config{Name: "target", Store: st, Logger: log, MetadataTimeout: 2 * time.Second}, 1<<16, tr)
	tgt = &node{e: nn.Engine, mem: nn.Mem, tr: tr}
	ini = newNode(t, st, "initiator", 1<<16, Config{Auth: iniSecret, IOTimeout: 2 * time.Second})
	return tgt, ini, st
}

// TestAuth: with the secret on both sides transfers work; an initiator
// without the secret, or with another one, gets no lane (OpenSegment
// fails with ErrDenied) and no byte of memory; an initiator with a
// secret refuses a target without one.
func TestAuth(t *testing.T) {
	good := testSecret(t)
	other, _ := auth.New([]byte(testKey + " but not quite"))
	for _, c := range []struct {
		name     string
		tgt, ini *auth.Secret
		ok       bool
	}{
		{"both hold the secret", good, good, true},
		{"auth off", nil, nil, true},
		{"initiator without the secret", good, nil, false},
		{"initiator with another secret", good, other, false},
		{"target without a secret", nil, good, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tgt, ini, _ := authPair(t, c.tgt, c.ini, nil)
			fill(t, tgt.buf())
			want := bytes.Clone(tgt.buf())
			seg, err := ini.e.OpenSegment(ctxT(t, 10*time.Second), "target", nil)
			if !c.ok {
				if !errors.Is(err, ErrDenied) || !errors.Is(err, auth.ErrDenied) {
					t.Fatalf("open: %v, want ErrDenied", err)
				}
				if !bytes.Equal(tgt.buf(), want) {
					t.Fatal("memory changed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fill(t, ini.buf())
			if err := ini.e.Transfer(ctxT(t, 10*time.Second), []engine.Request{{Op: engine.Write, Local: ini.buf()[:4096], Target: seg, TargetAddr: tgt.base()}}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tgt.buf()[:4096], ini.buf()[:4096]) {
				t.Fatal("data differs")
			}
		})
	}
}

// recorder keeps what one side of a connection wrote.
type recorder struct {
	net.Conn
	sent bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.sent.Write(p)
	return r.Conn.Write(p)
}

// TestAuthHostile: a peer without the secret tries what it can on the
// raw socket (skip the challenge and send requests, forge the answer,
// replay a holder's captured handshake): each gets the connection closed,
// no reply to any request and no byte of memory. Failures are logged with
// the peer's address, rate-limited.
func TestAuthHostile(t *testing.T) {
	secret := testSecret(t)
	var logBuf testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	tgt, _, _ := authPair(t, secret, secret, log)
	fill(t, tgt.buf())
	want := bytes.Clone(tgt.buf())
	write := frame(header{op: opWrite, id: 1, addr: tgt.base(), length: 64}, bytes.Repeat([]byte{0xEE}, 64))
	read := frame(header{op: opRead, id: 2, addr: tgt.base(), length: 64}, nil)
	me := auth.Party{Name: "mallory", Epoch: 1}
	them := auth.Party{Name: "target", Epoch: tgt.e.Epoch()}

	// noService: the target closes c, and nothing it sent after the
	// handshake frames is a data reply.
	noService := func(what string, c net.Conn, br *bufio.Reader) {
		t.Helper()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		rest, err := io.ReadAll(br)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: connection left open", what)
		}
		if len(rest) > 0 && !bytes.HasPrefix(rest, handshakeProto.Magic[:]) {
			t.Fatalf("%s: target sent %d bytes that are no handshake frame", what, len(rest))
		}
		if !bytes.Equal(tgt.buf(), want) {
			t.Fatalf("%s: memory changed", what)
		}
	}
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", tgt.tr.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	var hdr [wire.HeaderLen]byte

	attackStart := time.Now()
	// 1. Skip the challenge: hello, then requests straight away.
	c, br := dial()
	in := (*auth.Secret)(nil).Initiate("tcp", me, them)
	c.Write(append(append(handshakeProto.Append(nil, hsHello, 0, auth.AppendHello(nil, in.Hello())), write...), read...))
	noService("requests instead of an answer", c, br)

	// 2. An empty answer (no secret), then requests.
	c, br = dial()
	c.Write(handshakeProto.Append(nil, hsHello, 0, auth.AppendHello(nil, in.Hello())))
	if _, _, err := handshakeProto.Read(br, hdr[:], nil); err != nil {
		t.Fatal(err)
	}
	c.Write(append(append(handshakeProto.Append(nil, hsAnswer, 0, control.AppendAnswer(nil, control.StatusOK, auth.Answer{})), write...), read...))
	noService("empty answer", c, br)

	// 3. A forged answer: a random proof.
	c, br = dial()
	c.Write(handshakeProto.Append(nil, hsHello, 0, auth.AppendHello(nil, in.Hello())))
	if _, _, err := handshakeProto.Read(br, hdr[:], nil); err != nil {
		t.Fatal(err)
	}
	c.Write(append(handshakeProto.Append(nil, hsAnswer, 0, control.AppendAnswer(nil, control.StatusOK, auth.Answer{Proof: bytes.Repeat([]byte{7}, auth.ProofLen)})), write...))
	noService("forged answer", c, br)

	// 4. Replay: record a holder's whole handshake, then send the same
	// bytes on a new connection.
	raw, err := net.Dial("tcp", tgt.tr.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Conn: raw}
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	if err := dialHandshake(rec, secret, me, them); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	c, br = dial()
	c.Write(append(rec.sent.Bytes(), write...))
	noService("replayed handshake", c, br)

	// 5. Another segment's name (a relay): refused at the challenge.
	c, br = dial()
	err = dialHandshake(c, secret, me, auth.Party{Name: "someone-else", Epoch: tgt.e.Epoch()})
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("hello for another name: %v", err)
	}
	noService("hello for another name", c, br)

	// Logged with the peer's address, at most one line a second.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logBuf.String(), "te: tcp: "); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no failure logged:\n%s", logBuf.String())
		}
	}
	// At most one line a second (the failure log's interval).
	bound := 1 + int(time.Since(attackStart)/time.Second)
	lines := strings.Count(logBuf.String(), "te: tcp: ")
	if !strings.Contains(logBuf.String(), "peer=127.0.0.1:") || lines > min(bound, 4) {
		t.Fatalf("%d lines for 5 failures in %v, or no peer address:\n%s", lines, time.Since(attackStart), logBuf.String())
	}
	if strings.Contains(logBuf.String(), testKey) {
		t.Fatal("the secret is in the log")
	}
	t.Logf("log:\n%s", logBuf.String())
}

// TestWarnUnauthenticated: a listener on all interfaces without a secret
// logs one warning; with a secret, or on loopback, none.
func TestWarnUnauthenticated(t *testing.T) {
	for _, c := range []struct {
		listen string
		secret *auth.Secret
		warn   bool
	}{
		{"0.0.0.0:0", nil, true},
		{"0.0.0.0:0", testSecret(t), false},
		{"127.0.0.1:0", nil, false},
	} {
		var logBuf testenv.Buffer
		log := slog.New(slog.NewTextHandler(&logBuf, nil))
		e, err := engine.New(engine.Config{Name: "w", Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		err = e.Install(New(Config{Listen: c.listen, Auth: c.secret}))
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(logBuf.String(), "without authentication"); got != map[bool]int{true: 1}[c.warn] {
			t.Errorf("listen %s, secret %v: %d warnings:\n%s", c.listen, c.secret, got, logBuf.String())
		}
	}
}
