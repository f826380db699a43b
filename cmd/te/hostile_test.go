package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
	"github.com/rdmago/te/shm"
	"github.com/rdmago/te/tcp"
)

const testSecret = "te cmd tests: a cluster secret nobody else knows"

// secretFile writes the cluster secret to a 0600 file.
func secretFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// stopped kills a te serve and returns its stderr (read only once it has
// exited: the exec package's copier writes it until then).
func stopped(srv *exec.Cmd, stderr *bytes.Buffer) string {
	srv.Process.Kill()
	srv.Wait()
	return stderr.String()
}

// fetch gets a te serve's descriptor as any client would.
func fetch(t *testing.T, name string, s *auth.Secret) *segment.Descriptor {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := p2p.New(ctx, p2p.Options{Auth: s})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d, err := st.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// hold opens n connections to addr and keeps them open until the test
// ends; with handshake set, each first completes the tcp handshake (the
// epoch is public) and then sends nothing.
func hold(t *testing.T, addr string, n int, hs func(c net.Conn) error) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	var held, failed int
	for range 16 {
		wg.Go(func() {
			for range work {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				if hs != nil {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					if err := hs(c); err != nil {
						mu.Lock()
						failed++
						mu.Unlock()
						continue
					}
					c.SetDeadline(time.Time{})
				}
				mu.Lock()
				held++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("attacker: %d connections opened to %s (%d failed)", held, addr, failed)
}

// TestDataPortLockout: an attacker that completes the handshake on 4200
// connections (more than MaxConns, 4096) and then sends nothing cannot
// lock a real initiator out: te bench --verify passes while it holds them.
func TestDataPortLockout(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB")
	d := fetch(t, name, nil)
	pr, _ := d.Protocol(segment.ProtoTCP)
	hold(t, pr.Endpoint, 4200, func(c net.Conn) error {
		return control.TCP.Dial(control.Stream(c, c, control.TCP.Frames()), nil, auth.Party{Name: "mallory", Epoch: 1}, auth.Party{Name: d.Name, Epoch: d.Epoch})
	})
	_, stderr, code := runTE(t, "bench", "--segment", name, "--duration", "1", "--batch-size", "16", "--verify", "--quiet")
	if code != 0 {
		t.Fatalf("te bench with the attacker's connections held: exit %d\n%s\nte serve:\n%s", code, stderr, stopped(srv, srvErr))
	}
}

// TestDataPortLockoutAuth: with a cluster secret the attacker cannot
// complete the handshake; its 4200 silent connections still lock nobody
// out, and te bench --verify with the secret passes.
func TestDataPortLockoutAuth(t *testing.T) {
	sf := secretFile(t)
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB", "--auth-file", sf)
	s, err := auth.Load(sf)
	if err != nil {
		t.Fatal(err)
	}
	d := fetch(t, name, s)
	pr, _ := d.Protocol(segment.ProtoTCP)
	hold(t, pr.Endpoint, 4200, nil)
	_, stderr, code := runTE(t, "bench", "--segment", name, "--duration", "1", "--batch-size", "16", "--verify", "--quiet", "--auth-file", sf)
	if code != 0 {
		t.Fatalf("te bench with the attacker's connections held: exit %d\n%s\nte serve:\n%s", code, stderr, stopped(srv, srvErr))
	}
}

// TestMetadataPortLockout: 1100 idle connections to te serve's p2p port
// (more than its 1024) do not stop te bench from fetching the descriptor.
func TestMetadataPortLockout(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB")
	hold(t, name, 1100, nil)
	_, stderr, code := runTE(t, "bench", "--segment", name, "--duration", "1", "--batch-size", "16", "--verify", "--quiet")
	if code != 0 {
		t.Fatalf("te bench with the p2p port's slots held: exit %d\n%s\nte serve:\n%s", code, stderr, stopped(srv, srvErr))
	}
}

// TestAuthCLI: te serve with --auth-file serves only initiators with the
// secret: te bench and te segments without it fail (denied), with it they
// work; the secret appears in no output, --json included.
func TestAuthCLI(t *testing.T) {
	sf := secretFile(t)
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB", "--auth-file", sf)
	var all strings.Builder
	out, stderr, code := runTE(t, "bench", "--segment", name, "--duration", "1", "--batch-size", "8", "--quiet")
	all.WriteString(out + stderr)
	if code != 1 || !strings.Contains(stderr, "authentication") {
		t.Fatalf("te bench without the secret: exit %d\n%s", code, stderr)
	}
	out, stderr, code = runTE(t, "segments", name)
	all.WriteString(out + stderr)
	if code != 1 || !strings.Contains(stderr, "authentication") {
		t.Fatalf("te segments without the secret: exit %d\n%s", code, stderr)
	}
	out, stderr, code = runTE(t, "bench", "--segment", name, "--duration", "1", "--batch-size", "8", "--verify", "--json", "--auth-file", sf)
	all.WriteString(out + stderr)
	if code != 0 {
		t.Fatalf("te bench with the secret: exit %d\n%s", code, stderr)
	}
	if rs := decodeReport[map[string]any](t, "bench", []byte(out)); len(rs) == 0 || rs[0]["auth"] != true {
		t.Fatalf("--json: %v\n%s", rs, out)
	}
	t.Setenv(auth.EnvFile, sf)
	out, stderr, code = runTE(t, "segments", "--json", name) // the secret from $TE_AUTH_FILE
	all.WriteString(out + stderr)
	if code != 0 || !strings.Contains(out, name) {
		t.Fatalf("te segments with the secret: exit %d\n%s%s", code, out, stderr)
	}
	serveLog := stopped(srv, srvErr)
	all.WriteString(serveLog)
	if strings.Contains(all.String(), testSecret) || strings.Contains(all.String(), "nobody else knows") {
		t.Fatal("the secret was printed")
	}
	if !strings.Contains(serveLog, "peer failed authentication") {
		t.Fatalf("te serve logged no failed handshake:\n%s", serveLog)
	}
}

// TestUnauthenticatedWarning: te serve on all interfaces without a secret
// warns once; with one it does not.
func TestUnauthenticatedWarning(t *testing.T) {
	srv, _, srvErr := serveProcess(t, "--buffer-size", "1MiB", "--metadata", "p2p://0.0.0.0:0")
	srv.Process.Kill()
	srv.Wait()
	if n := strings.Count(srvErr.String(), "without authentication"); n < 1 {
		t.Fatalf("no warning:\n%s", srvErr.String())
	}
	srv, _, srvErr = serveProcess(t, "--buffer-size", "1MiB", "--metadata", "p2p://0.0.0.0:0", "--auth-file", secretFile(t))
	srv.Process.Kill()
	srv.Wait()
	if strings.Contains(srvErr.String(), "without authentication") {
		t.Fatalf("warned with a secret:\n%s", srvErr.String())
	}
}

// TestAuthMessages: te serve says authentication is on and prints a te
// bench line that works as printed; an initiator without the secret or
// with another one gets one line that names the fix; the target logs
// every failed authentication with the peer's address (three wrong-secret
// attempts more than a second apart: three lines).
func TestAuthMessages(t *testing.T) {
	sf := secretFile(t)
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB", "--auth-file", sf)
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("another secret of enough length\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		args []string
		want string
	}{
		{nil, "the target requires the cluster secret and this side has none: set --auth-file or $TE_AUTH_FILE"},
		{[]string{"--auth-file", other}, "holds a different cluster secret than this side: use the same secret file on both (--auth-file or $TE_AUTH_FILE)"},
		{[]string{"--auth-file", other}, "holds a different cluster secret"},
	} {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // past the log's one line a second
		}
		_, stderr, code := runTE(t, append([]string{"bench", "--segment", name, "--duration", "1", "--quiet"}, c.args...)...)
		msg := strings.TrimSpace(stderr)
		if code != 1 || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") || strings.Count(msg, "authentication") > 1 {
			t.Fatalf("te bench %v: exit %d, want one line saying %q:\n%s", c.args, code, c.want, stderr)
		}
	}
	log := stopped(srv, srvErr)
	if !strings.Contains(log, "te serve: authentication on") {
		t.Fatalf("te serve does not say authentication is on:\n%s", log)
	}
	if n := strings.Count(log, "peer failed authentication"); n != 3 || !strings.Contains(log, "peer=127.0.0.1:") {
		t.Fatalf("%d failures logged, want 3 with the peer's address:\n%s", n, log)
	}
	_, line, ok := strings.Cut(log, "run: te bench ")
	line, _, _ = strings.Cut(line, "\n")
	if !ok || !strings.Contains(line, "--auth-file "+sf) {
		t.Fatalf("the te bench line lacks --auth-file %s:\n%s", sf, log)
	}
	// The line as printed, against a fresh target with the same secret.
	_, name2, _ := serveProcess(t, "--buffer-size", "16MiB", "--auth-file", sf)
	args := append(strings.Fields(strings.Replace(line, name, name2, 1)), "--duration", "1", "--quiet")
	if _, stderr, code := runTE(t, append([]string{"bench"}, args...)...); code != 0 {
		t.Fatalf("te bench %v: exit %d\n%s", args, code, stderr)
	}
}

// shmHoldEnv starts this test binary as a hostile shm peer (see
// holdSHM): ENDPOINT,NAME,EPOCH,N.
const shmHoldEnv = "TE_TEST_SHM_HOLD"

// holdSHM is a hostile same-user process: it opens N connections to the
// shm socket ENDPOINT of segment NAME, each past the handshake and then
// idle (a silent one is dropped at the handshake's timeout), prints
// "held N" and keeps them until its stdin closes.
func holdSHM(spec string) {
	f := strings.Split(spec, ",")
	n, _ := strconv.Atoi(f[3])
	epoch, _ := strconv.ParseUint(f[2], 10, 64)
	var conns []*net.UnixConn
	for range n {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: f[0], Net: "unixpacket"})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := control.SHM.Dial(control.Packet(c, control.SHM.Frames(), make([]byte, 1<<16)), nil,
			auth.Party{Name: "mallory", Epoch: 1}, auth.Party{Name: f[1], Epoch: epoch}); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		c.SetDeadline(time.Time{})
	}
	fmt.Println("held", len(conns))
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// shmServed counts the connections process pid serves on the unix
// socket endpoint: its descriptors that are connected sockets bound to
// that name (an accepted socket carries its listener's name).
func shmServed(t *testing.T, pid int, endpoint string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(l)
		if len(f) == 8 && f[5] == "03" && strings.TrimPrefix(f[7], "@") == strings.TrimPrefix(endpoint, "@") {
			ours["socket:["+f[6]+"]"] = true
		}
	}
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && ours[l] {
			n++
		}
	}
	return n
}

// silent opens n connections to the shm socket endpoint that say
// nothing, kept until the test ends (the target drops them at its
// handshake timeout).
func silent(t *testing.T, endpoint string, n int) {
	for range n {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: endpoint, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
}

// TestSHMLockout: five (or more) same-user processes hold 1280
// connections to te serve's shm socket past the handshake (256 each, its
// per-process bound; 1024 in all is its total), so te serve serves 1024
// shm connections, and before each run the test adds 256 silent ones; yet
// te bench --verify passes over shm, the default run (which says shm
// carried bytes), --protocol shm and --protocol tcp,shm: the target
// admits shm connections per process and evicts the longest-waiting.
// They used to fail with "too many peers".
func TestSHMLockout(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--buffer-size", "16MiB")
	d := fetch(t, name, nil)
	pr, ok := d.Protocol(segment.ProtoSHM)
	if !ok {
		t.Fatalf("te serve offers no shm: %+v", d.Protocols)
	}
	// Hostile processes of 256 connections each until te serve serves its
	// limit: five at least (1280 connections), more if a loaded target
	// dropped handshakes that ran past its timeout.
	const each = shm.DefaultMaxConnsPerSource
	procs, held := 0, 0
	for held < shm.DefaultMaxConns {
		if procs == 10 {
			t.Fatalf("%d processes hold %d shm connections, te serve serves %d, want its limit %d: the test does not hold what it means to\nte serve:\n%s",
				procs, procs*each, held, shm.DefaultMaxConns, stopped(srv, srvErr))
		}
		hold := exec.Command(os.Args[0])
		hold.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%s,%d,%d", shmHoldEnv, pr.Endpoint, d.Name, d.Epoch, each))
		stdin, err := hold.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := hold.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := hold.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stdin.Close()
			hold.Wait()
		})
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != fmt.Sprintf("held %d\n", each) {
			t.Fatalf("hostile process: %q", line)
		}
		if procs++; procs < 5 {
			continue
		}
		// Evicted connections close as the target gets to them.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			held = shmServed(t, srv.Process.Pid, pr.Endpoint)
			if held >= shm.DefaultMaxConns || time.Now().After(deadline) {
				break
			}
		}
	}
	t.Logf("%d processes hold %d shm connections; te serve serves %d", procs, procs*each, held)
	for _, args := range [][]string{
		{"--json"},
		{"--protocol", "shm"},
		{"--protocol", "tcp,shm"},
	} {
		args = append([]string{"bench", "--segment", name, "--duration", "1", "--batch-size", "16", "--verify"}, args...)
		silent(t, pr.Endpoint, shm.DefaultMaxConnsPerSource)
		out, stderr, code := runTE(t, args...)
		if code != 0 {
			t.Fatalf("te %v with %d shm connections served: exit %d\n%s\nte serve:\n%s", args, held, code, stderr, stopped(srv, srvErr))
		}
		if args[len(args)-1] != "--json" {
			if !strings.Contains(out, "over shm:") || !strings.Contains(out, "verify: true") {
				t.Fatalf("te %v:\n%s", args, out)
			}
			continue
		}
		// The default run says which transports carried the bytes: both.
		var protos []string
		for _, r := range decodeReport[map[string]any](t, "bench", []byte(out)) {
			if r["verified"] != true || r["bytes"].(float64) <= 0 {
				t.Fatalf("te %v: %v", args, r)
			}
			protos = append(protos, r["protocol"].(string))
		}
		if !slices.Equal(protos, []string{"tcp", "shm"}) || strings.Contains(stderr, "does not reach") {
			t.Fatalf("te %v: bytes over %v, want tcp and shm\n%s", args, protos, stderr)
		}
	}
}

// TestBenchFallsBackToTCP: a same-host target whose shm server refuses
// the initiator (it demands a secret the initiator lacks; tcp does not)
// is measured over tcp by the default te bench, which says that shm did
// not reach it and which transport carried the bytes; it used to fail
// in its shm turn.
func TestBenchFallsBackToTCP(t *testing.T) {
	st, err := p2p.New(benchCtx(t), p2p.Options{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	secret, err := auth.New([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	tgt := enginetest.NewNode(t, engine.Config{Name: st.Name(), Store: st}, 0, tcp.New(tcp.Config{}), shm.New(shm.Config{Secret: secret}))
	mem, err := engine.AllocShared(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	tgt.Mem = mem // closed after the engine
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		args := []string{"bench", "--segment", st.Name(), "--duration", "300ms", "--batch-size", "4", "--verify"}
		if json {
			args = append(args, "--json")
		}
		out, stderr, code := runTE(t, args...)
		if code != 0 || !strings.Contains(stderr, "te bench: shm does not reach "+st.Name()) || !strings.Contains(stderr, "measuring over tcp") {
			t.Fatalf("te %v: exit %d\n%s\n%s", args, code, out, stderr)
		}
		if !json {
			if !strings.Contains(out, "result: write 64KiB over tcp:") || strings.Contains(out, "over shm") || !strings.Contains(out, "verify: true") {
				t.Fatalf("te %v:\n%s", args, out)
			}
			continue
		}
		rs := decodeReport[map[string]any](t, "bench", []byte(out))
		if len(rs) != 1 || rs[0]["protocol"] != "tcp" || rs[0]["verified"] != true || rs[0]["bytes"].(float64) <= 0 {
			t.Fatalf("te %v: results %v", args, rs)
		}
	}
}
