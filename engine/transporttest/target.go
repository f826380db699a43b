package transporttest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment/p2p"
)

// TargetInfo describes one incarnation of a target engine.
type TargetInfo struct {
	// Name is the target's segment name: in a child process, its p2p
	// store's address (host:port).
	Name  string
	Epoch uint64
	// Addr and Size are the registered buffer.
	Addr uint64
	Size int
	// Pid is the child process's id (0 for a target in this process).
	Pid int
}

// TargetConfig configures StartTarget.
type TargetConfig struct {
	// Size is the bytes of the registered buffer. Required.
	Size int
	// Listen is the child's p2p store address, host:port. Default
	// 127.0.0.1:0 (a free port; Restart keeps the port).
	Listen string
	// Ready bounds the child's start until it serves. Default 2 min.
	Ready time.Duration
	// Shared maps the child's buffers with engine.AllocShared.
	Shared bool
}

// target is what a conformance case needs of the target engine, in this
// process (localTarget) or in a child process (*Target). Addresses are the
// target's own; fill and check work on pattern positions (see Pattern).
type target interface {
	Info() TargetInfo
	// Fill writes the pattern of seed at positions pos.. into [addr, addr+n).
	Fill(addr uint64, n int, seed, pos uint64) error
	// Check compares [addr, addr+n) with the pattern of seed at pos..
	Check(addr uint64, n int, seed, pos uint64) error
	// Hash is the SHA-256 of [addr, addr+n).
	Hash(addr uint64, n int) ([32]byte, error)
	// Register maps and registers another region of size bytes.
	Register(size int) (addr uint64, err error)
	// Unregister unregisters a region from Register; its memory stays
	// mapped so Check and Hash still read it.
	Unregister(addr uint64) error
	// CloseEngine closes the target engine in an orderly way (the
	// process, if any, stays).
	CloseEngine() error
	// Kill ends the target abruptly: SIGKILL for a child process.
	Kill() error
	// Restart starts a new incarnation under the same name: a new engine
	// (new epoch) with a new transport and a new buffer of size bytes.
	Restart(size int) error
}

// Environment of a target child process.
const (
	envTest   = "TE_TRANSPORTTEST_TARGET" // t.Name() of the test that starts it (StartTarget)
	envIndex  = "TE_TRANSPORTTEST_INDEX"  // which StartTarget call of that test
	envMain   = "TE_TRANSPORTTEST_MAIN"   // serve from TestMain (StartRemoteTarget)
	envSize   = "TE_TRANSPORTTEST_SIZE"
	envListen = "TE_TRANSPORTTEST_LISTEN"
	envShared = "TE_TRANSPORTTEST_SHARED"
	// EnvTargetCPUs, set in the parent's environment, runs each target
	// child under taskset -c with its value (a CPU list): with the parent
	// under taskset on the other CPUs, initiator and target each have
	// CPUs of their own, as on hosts with idle cores. Each process's
	// GOMAXPROCS then follows its CPUs unless GOMAXPROCS is set.
	EnvTargetCPUs = "TE_TRANSPORTTEST_TARGET_CPUS"
	ctlFD         = 3 // the child's replies (stdout belongs to the testing package)
)

// ErrTargetGone: the target child process exited or stopped answering.
var ErrTargetGone = errors.New("transporttest: target process gone")

// Target is a target engine in a child process, the test binary run
// again. The child builds an engine over the embedded p2p store
// (segment/p2p) with a fresh transport, registers a buffer and answers
// commands on a pipe; it exits when the parent closes the pipe or dies.
// Methods are safe for concurrent use.
//
// StartTarget needs nothing from the package's TestMain: the child runs
// the same test up to the same StartTarget call and serves there instead
// of returning, with the factory passed there. So StartTarget must be
// called from the test (or subtest) whose name the child can select with
// -test.run, before the test does anything the child should not repeat;
// a test that starts several targets starts them all before using any.
//
// StartRemoteTarget works from any test, with the transport that TestMain
// passes to ServeTargetIfChild: the child serves from TestMain.
type Target struct {
	t     testing.TB
	name  string // t.Name()
	index int
	main  bool // served from TestMain (StartRemoteTarget)
	cfg   TargetConfig

	mu   sync.Mutex // serialises commands; guards the fields below
	cmd  *exec.Cmd
	in   io.WriteCloser
	ctl  *os.File
	rd   *bufio.Reader
	info TargetInfo
	dead bool
}

var starts struct {
	sync.Mutex
	n map[testing.TB]int
}

// startIndex numbers the StartTarget calls of one run of a test (-count
// runs it again under the same name), the same way in the parent and in
// the child.
func startIndex(t testing.TB) int {
	starts.Lock()
	defer starts.Unlock()
	if starts.n == nil {
		starts.n = map[testing.TB]int{}
	}
	i, ok := starts.n[t]
	if !ok {
		t.Cleanup(func() {
			starts.Lock()
			delete(starts.n, t)
			starts.Unlock()
		})
	}
	starts.n[t] = i + 1
	return i
}

// StartTarget starts a target child process with a transport from f and
// waits until it serves; the test's cleanup stops it. In the child process
// itself it does not return: it serves until the parent goes away.
func StartTarget(t testing.TB, f Factory, cfg TargetConfig) *Target {
	t.Helper()
	if cfg.Size <= 0 {
		t.Fatalf("transporttest: StartTarget: Size %d", cfg.Size)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Ready <= 0 {
		cfg.Ready = 2 * time.Minute
	}
	idx := startIndex(t)
	if want := os.Getenv(envTest); want != "" {
		if want != t.Name() {
			fmt.Fprintf(os.Stderr, "transporttest: target child for %q reached StartTarget in %q: call StartTarget only from the test that runs against the target\n", want, t.Name())
			os.Exit(3)
		}
		if strconv.Itoa(idx) == os.Getenv(envIndex) {
			serveChild(func() engine.Transport { return f(t) })
		}
		return &Target{t: t, name: t.Name(), index: idx, cfg: cfg, dead: true}
	}
	g := &Target{t: t, name: t.Name(), index: idx, cfg: cfg}
	t.Cleanup(g.stop)
	if err := g.spawn(cfg.Listen, cfg.Size); err != nil {
		t.Fatal(err)
	}
	return g
}

var mainTransport func() engine.Transport

// ServeTargetIfChild, called first thing in TestMain, makes the process a
// target for StartRemoteTarget when started as one: it serves with
// transports from newTransport until the parent goes away, then exits.
// Otherwise it returns at once.
func ServeTargetIfChild(newTransport func() engine.Transport) {
	mainTransport = newTransport
	if os.Getenv(envMain) != "" {
		serveChild(newTransport)
	}
}

// StartRemoteTarget starts a target child process served from TestMain
// (ServeTargetIfChild) with a buffer of size bytes (from
// engine.AllocShared when o.Shared) and its p2p store on listen
// ("127.0.0.1:0": any port); the test's cleanup stops it.
func StartRemoteTarget(t testing.TB, o Options, size int, listen string) *Target {
	t.Helper()
	if mainTransport == nil {
		t.Fatal("transporttest: StartRemoteTarget needs TestMain to call ServeTargetIfChild")
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	g := &Target{t: t, name: t.Name(), main: true, cfg: TargetConfig{Size: size, Listen: listen, Ready: 2 * time.Minute, Shared: o.Shared}}
	t.Cleanup(g.stop)
	if err := g.spawn(listen, size); err != nil {
		t.Fatal(err)
	}
	return g
}

// runPattern selects exactly the test called name with -test.run.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// spawn starts a child and reads its ready line. Called with g.mu held or
// before g is shared.
func (g *Target) spawn(listen string, size int) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("transporttest: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("transporttest: %w", err)
	}
	args := []string{"-test.run=" + runPattern(g.name), "-test.count=1", "-test.timeout=0"}
	cmd := exec.Command(exe, args...)
	if cpus := os.Getenv(EnvTargetCPUs); cpus != "" {
		cmd = exec.Command("taskset", append([]string{"-c", cpus, exe}, args...)...)
	}
	cmd.Env = append(os.Environ(), envSize+"="+strconv.Itoa(size), envListen+"="+listen)
	if g.main {
		cmd.Env = append(cmd.Env, envMain+"=1")
	} else {
		cmd.Env = append(cmd.Env, envTest+"="+g.name, envIndex+"="+strconv.Itoa(g.index))
	}
	if g.cfg.Shared {
		cmd.Env = append(cmd.Env, envShared+"=1")
	}
	cmd.ExtraFiles = []*os.File{w} // fd 3
	cmd.Stdout = os.Stderr         // the child's test output, if any
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("transporttest: %w", err)
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		in.Close()
		return fmt.Errorf("transporttest: start target: %w", err)
	}
	w.Close()
	g.cmd, g.in, g.ctl, g.rd, g.dead = cmd, in, r, bufio.NewReader(r), false
	line, err := g.reply(g.cfg.Ready)
	if err == nil {
		f := strings.Fields(line)
		var info TargetInfo
		if len(f) == 5 {
			info.Name = f[0]
			info.Epoch, err = strconv.ParseUint(f[1], 0, 64)
			if err == nil {
				info.Addr, err = strconv.ParseUint(f[2], 0, 64)
			}
			if err == nil {
				info.Size, err = strconv.Atoi(f[3])
			}
			if err == nil {
				info.Pid, err = strconv.Atoi(f[4])
			}
		} else {
			err = fmt.Errorf("malformed ready line %q", line)
		}
		g.info = info
	}
	if err != nil {
		g.reap(true)
		if errors.Is(err, ErrTargetGone) && !g.main {
			err = fmt.Errorf("%w (a child must reach StartTarget in %s: is the test selected by -test.run=%s?)", err, g.name, runPattern(g.name))
		}
		return fmt.Errorf("transporttest: target did not start: %w", err)
	}
	return nil
}

// reply reads one answer line within d: the text after "ok", or an error.
func (g *Target) reply(d time.Duration) (string, error) {
	g.ctl.SetReadDeadline(time.Now().Add(d))
	line, err := g.rd.ReadString('\n')
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("%w: no answer within %v", ErrTargetGone, d)
		}
		return "", fmt.Errorf("%w: %v", ErrTargetGone, err)
	}
	line = strings.TrimSuffix(line, "\n")
	if rest, ok := strings.CutPrefix(line, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("transporttest: target: %s", strings.TrimPrefix(line, "err "))
}

// do sends one command and returns its answer.
func (g *Target) do(format string, args ...any) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead {
		return "", ErrTargetGone
	}
	if _, err := fmt.Fprintf(g.in, format+"\n", args...); err != nil {
		return "", fmt.Errorf("%w: %v", ErrTargetGone, err)
	}
	return g.reply(2 * time.Minute)
}

// reap ends the child (SIGKILL when kill is set, else by closing its
// stdin, then SIGKILL after 10 s) and waits for it. Called with g.mu held.
func (g *Target) reap(kill bool) {
	if g.cmd == nil {
		return
	}
	if kill {
		g.cmd.Process.Kill()
	}
	g.in.Close()
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			g.cmd.Process.Kill()
		}
	}()
	g.cmd.Wait()
	close(done)
	g.ctl.Close()
	g.cmd, g.dead = nil, true
}

func (g *Target) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reap(false)
}

// Info returns the current incarnation.
func (g *Target) Info() TargetInfo {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.info
}

// Name is the target's segment name.
func (g *Target) Name() string { return g.Info().Name }

// Base is the address of the target's buffer.
func (g *Target) Base() uint64 { return g.Info().Addr }

// Read returns a copy of n bytes at offset off of the target's buffer.
func (g *Target) Read(off, n int) ([]byte, error) {
	s, err := g.do("read %d %d", g.Base()+uint64(off), n)
	if err != nil {
		return nil, err
	}
	return hex.DecodeString(s)
}

// Fill writes the pattern of seed at positions pos.. into [addr, addr+n)
// of the target's memory.
func (g *Target) Fill(addr uint64, n int, seed, pos uint64) error {
	_, err := g.do("fill %d %d %d %d", addr, n, seed, pos)
	return err
}

// Check compares [addr, addr+n) of the target's memory with the pattern
// of seed at positions pos..
func (g *Target) Check(addr uint64, n int, seed, pos uint64) error {
	_, err := g.do("check %d %d %d %d", addr, n, seed, pos)
	return err
}

// Hash returns the SHA-256 of [addr, addr+n) of the target's memory.
func (g *Target) Hash(addr uint64, n int) ([32]byte, error) {
	var h [32]byte
	s, err := g.do("hash %d %d", addr, n)
	if err != nil {
		return h, err
	}
	if n, err := hex.Decode(h[:], []byte(s)); err != nil || n != len(h) {
		return h, fmt.Errorf("transporttest: target: bad hash %q", s)
	}
	return h, nil
}

// Register maps and registers another region in the target.
func (g *Target) Register(size int) (uint64, error) {
	s, err := g.do("register %d", size)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(s, 0, 64)
}

// Unregister unregisters a region from Register (it stays mapped).
func (g *Target) Unregister(addr uint64) error {
	_, err := g.do("unregister %d", addr)
	return err
}

// CloseEngine closes the child's engine; the process stays.
func (g *Target) CloseEngine() error {
	_, err := g.do("close")
	return err
}

// Kill sends the child SIGKILL and reaps it.
func (g *Target) Kill() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return ErrTargetGone
	}
	g.reap(true)
	return nil
}

// Restart kills the child if it still runs and starts a new one on the
// same p2p address (so the same segment name) with a buffer of size bytes.
func (g *Target) Restart(size int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reap(true)
	return g.spawn(g.info.Name, size)
}

// serveChild is the target child process: it never returns.
func serveChild(newTransport func() engine.Transport) {
	ctl := os.NewFile(ctlFD, "transporttest-ctl")
	die := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		fmt.Fprintf(os.Stderr, "transporttest: target child: %s\n", msg)
		if ctl != nil {
			fmt.Fprintf(ctl, "err %s\n", msg)
		}
		os.Exit(2)
	}
	if ctl == nil {
		die("no control pipe on fd %d", ctlFD)
	}
	size, err := strconv.Atoi(os.Getenv(envSize))
	if err != nil || size <= 0 {
		die("bad %s=%q", envSize, os.Getenv(envSize))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	st, err := p2p.New(ctx, p2p.Options{Listen: os.Getenv(envListen)})
	cancel()
	if err != nil {
		die("p2p store: %v", err)
	}
	e, err := engine.New(engine.Config{Name: st.Name(), Store: st})
	if err != nil {
		die("engine: %v", err)
	}
	if err := e.Install(newTransport()); err != nil {
		die("install: %v", err)
	}
	c := &child{e: e, alloc: Options{Shared: os.Getenv(envShared) != ""}.alloc}
	main, err := c.register(size)
	if err != nil {
		die("%v", err)
	}
	fmt.Fprintf(ctl, "ok %s %#x %#x %d %d\n", st.Name(), e.Epoch(), main, size, os.Getpid())
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		out, err := c.command(strings.Fields(sc.Text()))
		if err != nil {
			fmt.Fprintf(ctl, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(ctl, "ok %s\n", out)
		}
	}
	// The parent closed the pipe or died.
	e.Close()
	st.Close()
	os.Exit(0)
}

// child is the target child's state.
type child struct {
	e     *engine.Engine
	alloc func(int) (*engine.Memory, error)
	mems  []*engine.Memory // every region, unregistered ones included
}

func (c *child) register(size int) (uint64, error) {
	m, err := c.alloc(size)
	if err != nil {
		return 0, err
	}
	if err := c.e.RegisterLocalMemory(m.Bytes(), "cpu:0"); err != nil {
		m.Close()
		return 0, err
	}
	c.mems = append(c.mems, m)
	return engine.AddrOf(m.Bytes()), nil
}

// mem returns [addr, addr+n) of one of the child's regions.
func (c *child) mem(addr uint64, n int) ([]byte, error) {
	for _, m := range c.mems {
		b := m.Bytes()
		base := engine.AddrOf(b)
		if addr >= base && n >= 0 && addr-base+uint64(n) <= uint64(len(b)) {
			return b[addr-base : addr-base+uint64(n)], nil
		}
	}
	return nil, fmt.Errorf("[%#x, +%d) is in no region of the target", addr, n)
}

func (c *child) command(f []string) (string, error) {
	if len(f) == 0 {
		return "", errors.New("empty command")
	}
	nums := make([]uint64, len(f)-1)
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return "", fmt.Errorf("%s: argument %q: %v", f[0], s, err)
		}
		nums[i] = v
	}
	arg := func(n int) error {
		if len(nums) != n {
			return fmt.Errorf("%s takes %d arguments", f[0], n)
		}
		return nil
	}
	switch f[0] {
	case "fill", "check":
		if err := arg(4); err != nil {
			return "", err
		}
		b, err := c.mem(nums[0], int(nums[1]))
		if err != nil {
			return "", err
		}
		if f[0] == "fill" {
			Pattern(b, nums[2], nums[3])
			return "", nil
		}
		return "", CheckPattern(b, nums[2], nums[3])
	case "hash", "read":
		if err := arg(2); err != nil {
			return "", err
		}
		b, err := c.mem(nums[0], int(nums[1]))
		if err != nil {
			return "", err
		}
		if f[0] == "read" {
			return hex.EncodeToString(b), nil
		}
		h := sha256.Sum256(b)
		return hex.EncodeToString(h[:]), nil
	case "register":
		if err := arg(1); err != nil {
			return "", err
		}
		a, err := c.register(int(nums[0]))
		return fmt.Sprintf("%#x", a), err
	case "unregister":
		if err := arg(1); err != nil {
			return "", err
		}
		b, err := c.mem(nums[0], 1)
		if err != nil {
			return "", err
		}
		return "", c.e.UnregisterLocalMemory(b[:1:1])
	case "close":
		return "", c.e.Close()
	case "countnotes":
		// BenchNotifyRemote's counter: from now on, each notification
		// received stores its arrival time and the count so far at
		// [addr, addr+16).
		if err := arg(1); err != nil {
			return "", err
		}
		b, err := c.mem(nums[0], 16)
		if err != nil {
			return "", err
		}
		var count uint64
		go receiveNotes(c.e, func(n int) {
			count += uint64(n)
			binary.LittleEndian.PutUint64(b, uint64(time.Now().UnixNano()))
			binary.LittleEndian.PutUint64(b[8:], count)
		})
		return "", nil
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}
