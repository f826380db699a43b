package transporttest

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/p2p"
)

// Target is the target side of a conformance pair: an engine with one
// registered buffer, in this process or in a child process, driven through
// these methods so that the tests can check its memory either way.
type Target interface {
	// Name is the target's segment name.
	Name() string
	// Base is the address of the registered buffer.
	Base() uint64
	// Read returns a copy of n bytes at offset off of the buffer; Write
	// stores b there.
	Read(off, n int) ([]byte, error)
	Write(off int, b []byte) error
	// RegisterExtra allocates and registers a second buffer of n bytes
	// and returns its address; UnregisterExtra unregisters it (and keeps
	// it mapped); ReadExtra and WriteExtra access it.
	RegisterExtra(n int) (uint64, error)
	UnregisterExtra() error
	ReadExtra(n int) ([]byte, error)
	WriteExtra(b []byte) error
	// CloseEngine closes the target's engine (its memory stays mapped).
	CloseEngine() error
}

// Options adapt the suite to a transport.
type Options struct {
	// Shared allocates every buffer with engine.AllocShared (a transport
	// that hands memory to a peer, shm, needs it).
	Shared bool
	// Remote runs every target in a child process: the test binary,
	// started again with an environment variable that its TestMain must
	// pass to ServeTargetIfChild before anything else. Initiator and
	// target then find each other through the embedded p2p store.
	Remote bool
}

func (o Options) alloc(n int) (*engine.Memory, error) {
	if o.Shared {
		return engine.AllocShared(n)
	}
	return engine.Alloc(n)
}

// localTarget is a target engine in this process.
type localTarget struct {
	o     Options
	e     *engine.Engine
	mem   *engine.Memory
	extra *engine.Memory
}

func newLocalTarget(t testing.TB, o Options, cfg engine.Config, size int, tr engine.Transport) *localTarget {
	t.Helper()
	n := enginetest.NewNode(t, cfg, 0, tr)
	lt := &localTarget{o: o, e: n.Engine}
	var err error
	if lt.mem, err = o.alloc(size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Engine.Close()
		lt.mem.Close()
		lt.extra.Close()
	})
	if err := lt.e.RegisterLocalMemory(lt.mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	return lt
}

func (lt *localTarget) Name() string { return lt.e.Name() }
func (lt *localTarget) Base() uint64 { return engine.AddrOf(lt.mem.Bytes()) }
func (lt *localTarget) Read(off, n int) ([]byte, error) {
	return append([]byte(nil), lt.mem.Bytes()[off:off+n]...), nil
}
func (lt *localTarget) Write(off int, b []byte) error {
	copy(lt.mem.Bytes()[off:], b)
	return nil
}
func (lt *localTarget) RegisterExtra(n int) (uint64, error) {
	var err error
	if lt.extra, err = lt.o.alloc(n); err != nil {
		return 0, err
	}
	return engine.AddrOf(lt.extra.Bytes()), lt.e.RegisterLocalMemory(lt.extra.Bytes(), "")
}
func (lt *localTarget) UnregisterExtra() error { return lt.e.UnregisterLocalMemory(lt.extra.Bytes()) }
func (lt *localTarget) ReadExtra(n int) ([]byte, error) {
	return append([]byte(nil), lt.extra.Bytes()[:n]...), nil
}
func (lt *localTarget) WriteExtra(b []byte) error {
	copy(lt.extra.Bytes(), b)
	return nil
}
func (lt *localTarget) CloseEngine() error { return lt.e.Close() }

// The child protocol: the parent writes requests on the child's stdin,
// the child answers each on stdout.
//
//	request  u8 op | u64 a | u64 b | payload (op 'w', 'W': b bytes)
//	reply    u8 ok (1) or failed (0) | u64 value | u32 n | n bytes (data, or the error text)
//
// The child first sends a reply with value = buffer address and the
// segment name as data.
const childEnv = "TE_TRANSPORTTEST_TARGET"

// ServeTargetIfChild turns the process into a conformance target when the
// suite started it as one (Options.Remote): it serves the parent's
// requests until its stdin closes, then exits. Otherwise it returns at
// once. Call it first thing in TestMain, with a factory for the
// transport under test.
func ServeTargetIfChild(newTransport func() engine.Transport) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	err := serveTarget(spec, newTransport)
	if err != nil {
		fmt.Fprintln(os.Stderr, "transporttest target:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveTarget(spec string, newTransport func() engine.Transport) error {
	// spec: size,shared,listen
	f := strings.SplitN(spec, ",", 3)
	if len(f) != 3 {
		return fmt.Errorf("bad %s=%q", childEnv, spec)
	}
	size, err := strconv.Atoi(f[0])
	if err != nil {
		return err
	}
	o := Options{Shared: f[1] == "1"}
	st, err := p2p.New(context.Background(), p2p.Options{Listen: f[2], PollInterval: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	defer st.Close()
	e, err := engine.New(engine.Config{Name: st.Name(), Store: st})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.Install(newTransport()); err != nil {
		return err
	}
	lt := &localTarget{o: o, e: e}
	if lt.mem, err = o.alloc(size); err != nil {
		return err
	}
	if err := e.RegisterLocalMemory(lt.mem.Bytes(), "cpu:0"); err != nil {
		return err
	}
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	reply := func(v uint64, data []byte, err error) error {
		ok := byte(1)
		if err != nil {
			ok, data = 0, []byte(err.Error())
		}
		var h [13]byte
		h[0] = ok
		binary.LittleEndian.PutUint64(h[1:], v)
		binary.LittleEndian.PutUint32(h[9:], uint32(len(data)))
		out.Write(h[:])
		out.Write(data)
		return out.Flush()
	}
	if err := reply(lt.Base(), []byte(lt.Name()), nil); err != nil {
		return err
	}
	for {
		var h [17]byte
		if _, err := io.ReadFull(in, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		a, b := int(binary.LittleEndian.Uint64(h[1:])), int(binary.LittleEndian.Uint64(h[9:]))
		var v uint64
		var data []byte
		var rerr error
		switch h[0] {
		case 'r':
			if a < 0 || b < 0 || a+b > size {
				rerr = fmt.Errorf("read [%d, %d) outside %d bytes", a, a+b, size)
				break
			}
			data, rerr = lt.Read(a, b)
		case 'w', 'W':
			data = make([]byte, b)
			if _, err := io.ReadFull(in, data); err != nil {
				return err
			}
			if h[0] == 'W' {
				rerr = lt.WriteExtra(data)
			} else if a < 0 || a+b > size {
				rerr = fmt.Errorf("write [%d, %d) outside %d bytes", a, a+b, size)
			} else {
				rerr = lt.Write(a, data)
			}
			data = nil
		case 'x':
			v, rerr = lt.RegisterExtra(a)
		case 'u':
			rerr = lt.UnregisterExtra()
		case 'R':
			data, rerr = lt.ReadExtra(a)
		case 'c':
			rerr = lt.CloseEngine()
		default:
			return fmt.Errorf("unknown request %q", h[0])
		}
		if err := reply(v, data, rerr); err != nil {
			return err
		}
	}
}

// RemoteTarget is a target engine in a child process.
type RemoteTarget struct {
	Cmd  *exec.Cmd
	mu   sync.Mutex
	in   io.WriteCloser
	out  *bufio.Reader
	name string
	base uint64
}

// StartRemoteTarget starts the test binary as a target (see
// ServeTargetIfChild) with a buffer of size bytes, its p2p store
// listening on listen ("127.0.0.1:0" for any port). The child is killed
// when the test ends.
func StartRemoteTarget(t testing.TB, o Options, size int, listen string) *RemoteTarget {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shared := "0"
	if o.Shared {
		shared = "1"
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%s,%s", childEnv, size, shared, listen))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rt := &RemoteTarget{Cmd: cmd, in: in, out: bufio.NewReaderSize(outp, 1<<20)}
	t.Cleanup(func() { rt.Kill() })
	v, name, err := rt.reply()
	if err != nil {
		t.Fatalf("target child: %v", err)
	}
	rt.base, rt.name = v, string(name)
	return rt
}

// Kill ends the child with SIGKILL and reaps it.
func (rt *RemoteTarget) Kill() {
	if rt.Cmd.ProcessState != nil {
		return
	}
	rt.Cmd.Process.Kill() // SIGKILL
	rt.in.Close()
	rt.Cmd.Wait()
}

func (rt *RemoteTarget) reply() (uint64, []byte, error) {
	var h [13]byte
	if _, err := io.ReadFull(rt.out, h[:]); err != nil {
		return 0, nil, fmt.Errorf("target child: %w", err)
	}
	data := make([]byte, binary.LittleEndian.Uint32(h[9:]))
	if _, err := io.ReadFull(rt.out, data); err != nil {
		return 0, nil, fmt.Errorf("target child: %w", err)
	}
	if h[0] != 1 {
		return 0, nil, fmt.Errorf("target child: %s", data)
	}
	return binary.LittleEndian.Uint64(h[1:]), data, nil
}

func (rt *RemoteTarget) call(op byte, a, b int, payload []byte) (uint64, []byte, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var h [17]byte
	h[0] = op
	binary.LittleEndian.PutUint64(h[1:], uint64(a))
	binary.LittleEndian.PutUint64(h[9:], uint64(b))
	if _, err := rt.in.Write(append(h[:], payload...)); err != nil {
		return 0, nil, fmt.Errorf("target child: %w", err)
	}
	return rt.reply()
}

// Name is the child's segment name (its p2p address).
func (rt *RemoteTarget) Name() string { return rt.name }

// Base is the address of the child's buffer.
func (rt *RemoteTarget) Base() uint64 { return rt.base }

// Read reads the child's buffer.
func (rt *RemoteTarget) Read(off, n int) ([]byte, error) {
	_, d, err := rt.call('r', off, n, nil)
	return d, err
}

// Write writes the child's buffer.
func (rt *RemoteTarget) Write(off int, b []byte) error {
	_, _, err := rt.call('w', off, len(b), b)
	return err
}

// RegisterExtra registers a second buffer in the child.
func (rt *RemoteTarget) RegisterExtra(n int) (uint64, error) {
	v, _, err := rt.call('x', n, 0, nil)
	return v, err
}

// UnregisterExtra unregisters it.
func (rt *RemoteTarget) UnregisterExtra() error {
	_, _, err := rt.call('u', 0, 0, nil)
	return err
}

// ReadExtra reads it.
func (rt *RemoteTarget) ReadExtra(n int) ([]byte, error) {
	_, d, err := rt.call('R', n, 0, nil)
	return d, err
}

// WriteExtra writes it.
func (rt *RemoteTarget) WriteExtra(b []byte) error {
	_, _, err := rt.call('W', 0, len(b), b)
	return err
}

// CloseEngine closes the child's engine.
func (rt *RemoteTarget) CloseEngine() error {
	_, _, err := rt.call('c', 0, 0, nil)
	return err
}

// Initiator starts the initiator side for the suite: an engine with one
// registered buffer of size bytes and a fresh transport from f, using st
// as its store (nil: a p2p store of its own, for remote targets).
func Initiator(t testing.TB, o Options, st segment.Store, size int, f Factory) *enginetest.Node {
	t.Helper()
	name := "initiator"
	if st == nil {
		ps, err := p2p.New(context.Background(), p2p.Options{Listen: "127.0.0.1:0", PollInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ps.Close() })
		st, name = ps, ps.Name()
	}
	n := enginetest.NewNode(t, engine.Config{Name: name, Store: st}, 0, f(t))
	mem, err := o.alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Engine.Close()
		mem.Close()
	})
	if err := n.Engine.RegisterLocalMemory(mem.Bytes(), "cpu:0"); err != nil {
		t.Fatal(err)
	}
	n.Mem = mem
	return n
}
