package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"

	"github.com/rdmago/te/internal/sock"
	"github.com/rdmago/te/internal/testenv"
)

// open opens a tracer as root, or makes the test unavailable.
func open(t *testing.T, f Filter) *Tracer {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "eBPF tracing needs root")
	}
	tr, err := Open(f)
	if errors.Is(err, ErrUnsupported) {
		testenv.Unavailable(t, "kernel: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	progs, maps := objectIDs(t, tr)
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		// The kernel frees programs and maps after an RCU grace period.
		left := 0
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			left = 0
			for _, id := range progs {
				if p, err := cebpf.NewProgramFromID(id); err == nil {
					p.Close()
					left++
				}
			}
			for _, id := range maps {
				if m, err := cebpf.NewMapFromID(id); err == nil {
					m.Close()
					left++
				}
			}
			if left == 0 || time.Now().After(deadline) {
				break
			}
		}
		if left != 0 {
			t.Errorf("%d of the tracer's programs and maps still exist 10 s after Close", left)
		}
	})
	return tr
}

// objectIDs returns the kernel ids of the tracer's programs and maps.
func objectIDs(t *testing.T, tr *Tracer) (progs []cebpf.ProgramID, maps []cebpf.MapID) {
	t.Helper()
	for _, p := range []*cebpf.Program{tr.objs.LaneState, tr.objs.LaneRetransmit, tr.objs.LaneRows} {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		progs = append(progs, id)
	}
	for _, m := range []*cebpf.Map{tr.objs.Watch, tr.objs.Ports, tr.objs.Conns, tr.objs.Events} {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		maps = append(maps, id)
	}
	return progs, maps
}

// connPair is a loopback TCP connection made through ln.
func connPair(t *testing.T, ln net.Listener) (client, server *net.TCPConn) {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func port(a net.Addr) uint16 { return uint16(a.(*net.TCPAddr).Port) }

func cookie(t *testing.T, c *net.TCPConn) uint64 {
	t.Helper()
	ck, err := sock.Cookie(c)
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// send writes n bytes to w in 64 KiB writes.
func send(w io.Writer, n int) error {
	buf := make([]byte, 64<<10)
	for n > 0 {
		k, err := w.Write(buf[:min(n, len(buf))])
		if err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// waitConn polls Snapshot until the connection with cookie ck satisfies ok.
func waitConn(t *testing.T, tr *Tracer, ck uint64, what string, ok func(Conn) bool) Conn {
	t.Helper()
	var last Conn
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		cs, err := tr.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(cs, func(c Conn) bool { return c.Cookie == ck }); i >= 0 {
			last = cs[i]
			if ok(last) {
				return last
			}
		}
	}
	t.Fatalf("connection %d never had %s; last seen %+v", ck, what, last)
	return last
}

// TestBytesExact: the counters of a known transfer equal the bytes moved
// (the SYN adds one to the dialler's acknowledged bytes), in each
// direction, and the RTT is plausible for loopback.
func TestBytesExact(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	tr := open(t, Filter{Ports: []uint16{port(ln.Addr())}})
	c, s := connPair(t, ln)
	const up, down = 24<<20 + 12345, 3<<20 + 777
	errc := make(chan error, 1)
	go func() { errc <- send(c, up) }()
	if _, err := io.CopyN(io.Discard, s, up); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	go func() { errc <- send(s, down) }()
	if _, err := io.CopyN(io.Discard, c, down); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	cc := waitConn(t, tr, cookie(t, c), "all its bytes acknowledged", func(x Conn) bool { return x.BytesAcked == up+1 })
	sc := waitConn(t, tr, cookie(t, s), "all its bytes acknowledged", func(x Conn) bool { return x.BytesAcked == down })
	if cc.BytesReceived != down || sc.BytesReceived != up {
		t.Errorf("received: client %d (want %d), server %d (want %d)", cc.BytesReceived, down, sc.BytesReceived, up)
	}
	if cc.BytesSent < up || cc.BytesSent-cc.BytesRetrans > up || sc.BytesSent < down {
		t.Errorf("sent: client %d (%d retransmitted), server %d; moved %d and %d", cc.BytesSent, cc.BytesRetrans, sc.BytesSent, up, down)
	}
	if cc.Local != sc.Remote || cc.Remote != sc.Local || cc.Remote.Port() != port(ln.Addr()) {
		t.Errorf("addresses: client %v->%v, server %v->%v", cc.Local, cc.Remote, sc.Local, sc.Remote)
	}
	for _, x := range []Conn{cc, sc} {
		if x.State != Established || x.Closed || x.Inode == 0 {
			t.Errorf("connection %+v: want ESTABLISHED, open, with an inode", x)
		}
		// Loopback on a busy 2-core machine: well under a second.
		if x.SRTT <= 0 || x.SRTT > time.Second || x.MinRTT <= 0 || x.MinRTT > x.SRTT+x.RTTVar*4 {
			t.Errorf("RTT of %v: srtt %v rttvar %v min %v", x.Local, x.SRTT, x.RTTVar, x.MinRTT)
		}
		if x.Idle > 10*time.Second {
			t.Errorf("idle %v right after a transfer", x.Idle)
		}
	}
	t.Logf("client %+v", cc)
}

// TestFilters: only the connections the filter selects appear, for each
// kind of filter.
func TestFilters(t *testing.T) {
	lnA, lnB := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
	a1, a2 := connPair(t, lnA)
	b1, b2 := connPair(t, lnB)
	ch := startDialChild(t, lnB)
	ours := map[uint64]string{cookie(t, a1): "a1", cookie(t, a2): "a2", cookie(t, b1): "b1", cookie(t, b2): "b2",
		ch.cookie: "child", cookie(t, ch.peer): "child's peer"}

	check := func(name string, f Filter, want ...string) {
		t.Helper()
		tr := open(t, f)
		defer tr.Close()
		cs, err := tr.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range cs {
			if n, ok := ours[c.Cookie]; ok {
				got = append(got, n)
			} else if !f.all() {
				t.Errorf("%s: connection %v->%v (cookie %d) is not ours", name, c.Local, c.Remote, c.Cookie)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: traced %q, want %q", name, got, want)
		}
	}
	check("port A", Filter{Ports: []uint16{port(lnA.Addr())}}, "a1", "a2")
	check("port B", Filter{Ports: []uint16{port(lnB.Addr())}}, "b1", "b2", "child", "child's peer")
	check("cookies", Filter{Cookies: []uint64{cookie(t, a1), cookie(t, b2)}}, "a1", "b2")
	check("this process", Filter{PID: os.Getpid()}, "a1", "a2", "b1", "b2", "child's peer")
	check("child process", Filter{PID: ch.cmd.Process.Pid}, "child")
	check("everything", Filter{}, "a1", "a2", "b1", "b2", "child", "child's peer")
	if ch.cgroup == "" {
		testenv.Unavailable(t, "no cgroup v2 hierarchy mounted: the cgroup filter is untested")
	}
	// The child was moved into its own cgroup before it dialled.
	check("child's cgroup", Filter{Cgroup: ch.cgroup}, "child")
}

const dialChildEnv = "TE_EBPF_DIAL_CHILD"

// dialChild is the child process of startDialChild: it waits for a line on
// stdin, dials the address in its environment, sends 1 MiB, prints its
// socket cookie and holds the connection until stdin closes.
func dialChild() {
	r := bufio.NewReader(os.Stdin)
	r.ReadString('\n')
	c, err := net.Dial("tcp", os.Getenv(dialChildEnv))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	send(c, 1<<20)
	ck, err := sock.Cookie(c.(*net.TCPConn))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(ck)
	io.Copy(io.Discard, r)
	c.Close()
}

type child struct {
	cmd    *exec.Cmd
	cookie uint64       // of the child's connection
	peer   *net.TCPConn // its accepted side, here
	cgroup string       // the cgroup v2 directory it runs in; "" if none
}

// startDialChild starts a process that connects to ln from a cgroup v2 of
// its own (where the hierarchy is mounted).
func startDialChild(t *testing.T, ln net.Listener) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), dialChildEnv+"="+ln.Addr().String())
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
		if ch.cgroup != "" {
			os.Remove(ch.cgroup)
		}
	})
	if root := cgroup2Root(); root != "" {
		dir := filepath.Join(root, fmt.Sprintf("te-ebpf-test-%d", os.Getpid()))
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			t.Fatal(err)
		}
		ch.cgroup = dir
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}
	io.WriteString(stdin, "go\n")
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ch.peer = peer.(*net.TCPConn)
	t.Cleanup(func() { peer.Close() })
	if _, err := io.CopyN(io.Discard, peer, 1<<20); err != nil {
		t.Fatal(err)
	}
	line, rerr := bufio.NewReader(out).ReadString('\n')
	if ch.cookie, err = strconv.ParseUint(strings.TrimSpace(line), 10, 64); err != nil {
		t.Fatalf("child said %q (%v): %v", line, rerr, err)
	}
	return ch
}

// cgroup2Root is where the cgroup v2 hierarchy is mounted, or "".
func cgroup2Root() string {
	b, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	return ""
}
