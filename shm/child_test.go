package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/segment/p2p"
)

// Child roles besides the conformance target (transporttest): the test
// binary started again with childRole set runs one of them and reports on
// stdout, one line per event.
const childRole = "TE_SHM_TEST_CHILD"

// runChildIfAsked runs a child role and exits, or returns when the
// process is not a child.
func runChildIfAsked() {
	spec := os.Getenv(childRole)
	if spec == "" {
		return
	}
	role, target, _ := strings.Cut(spec, ",")
	var err error
	switch role {
	case "writer":
		err = childWriter(target)
	case "stranger":
		err = childStranger(target)
	case "busy":
		err = childBusy(target)
	case "noteallocs":
		err = childNoteAllocs(target)

	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childNode(shmTransport *Transport) (*engine.Engine, *engine.Memory, func(), error) {
	st, err := p2p.New(context.Background(), p2p.Options{Listen: "127.0.0.1:0", PollInterval: 20 * time.Millisecond})
	if err != nil {
		return nil, nil, nil, err
	}
	e, err := engine.New(engine.Config{Name: st.Name(), Store: st})
	if err != nil {
		st.Close()
		return nil, nil, nil, err
	}
	if err := e.Install(shmTransport); err != nil {
		return nil, nil, nil, err
	}
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := e.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		return nil, nil, nil, err
	}
	return e, mem, func() { e.Close(); mem.Close(); st.Close() }, nil
}

// childWriter opens the target over shm and writes to it in a loop,
// printing "connected" and then "wrote" after the first batch, until it is
// killed.
func childWriter(target string) error {
	e, mem, done, err := childNode(New(Config{}))
	if err != nil {
		return err
	}
	defer done()
	ctx := context.Background()
	seg, err := e.OpenSegment(ctx, target, &engine.OpenOptions{Transport: "shm"})
	if err != nil {
		return err
	}
	fmt.Println("connected")
	d, err := e.SegmentDescriptor(seg)
	if err != nil {
		return err
	}
	addr := d.Buffers[0].Addr
	for i := 0; ; i++ {
		if err := e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: mem.Bytes()[:64<<10], Target: seg, TargetAddr: addr}}); err != nil {
			return err
		}
		if i == 0 {
			fmt.Println("wrote")
		}
	}
}

// childBusy is a hostile same-user initiator for tests outside this
// package (cmd/te starts this test binary with TE_SHM_TEST_CHILD=busy,NAME):
// it opens 64 shm connections to the p2p segment NAME, raises the busy
// counter of every region each maps, prints "held 64" and never lowers
// them, until it is killed.
func childBusy(target string) error {
	tr := New(Config{})
	_, _, done, err := childNode(tr)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := p2p.New(ctx, p2p.Options{Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := st.Get(ctx, target)
	if err != nil {
		return err
	}
	pr, ok := d.Protocol("shm")
	if !ok {
		return fmt.Errorf("%s offers no shm", target)
	}
	const conns = 64
	for range conns {
		p, err := dialPeer(ctx, tr, d, pr.Endpoint)
		if err != nil {
			return err
		}
		for _, m := range *p.maps.Load() {
			p.page.busy[m.slot].Store(1)
		}
	}
	fmt.Println("held", conns)
	select {}
}

// childStranger runs as another user: the engine must not choose shm for
// the target, and a direct handshake must be refused.
func childStranger(target string) error {
	tr := New(Config{})
	e, _, done, err := childNode(tr)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = e.OpenSegment(ctx, target, nil)
	fmt.Printf("open: %v\n", errors.Is(err, engine.ErrNoTransport))
	st, err := p2p.New(ctx, p2p.Options{Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer st.Close()
	d, err := st.Get(ctx, target)
	if err != nil {
		return err
	}
	pr, _ := d.Protocol("shm")
	p, err := dialPeer(ctx, tr, d, pr.Endpoint)
	if err == nil {
		p.Close()
		fmt.Println("dial: connected")
		return nil
	}
	fmt.Printf("dial: refused=%v %v\n", errors.Is(err, ErrRefused), err)
	return nil
}

// child is a running child role.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

// startChild runs this test binary (exe: os.Executable unless given) in
// a role; cmd may be adjusted by adjust before it starts.
func startChild(t *testing.T, exe, role, target string, adjust func(*exec.Cmd)) *child {
	t.Helper()
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childRole+"="+role+","+target)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if adjust != nil {
		adjust(cmd)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(c.kill)
	return c
}

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
}

// expect waits for the child's next line and checks its prefix.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("child ended before %q", prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("child said %q, want %q", l, prefix)
		}
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not say %q within 30s", prefix)
	}
	return ""
}

// copyExecutable copies the test binary into a fresh directory every
// user may enter, so that a child can run as another user.
func copyExecutable(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "shm-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "shm.test")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
