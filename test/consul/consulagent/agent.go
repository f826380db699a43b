// Package consulagent runs a real, in-memory Consul agent (`consul agent
// -dev`) for tests: on free loopback ports, in a temporary directory, with
// session_ttl_min lowered to 1 s so liveness tests are quick. It can be
// stopped and started again on the same ports to test outages.
//
// The binary is $CONSUL, else `consul` on PATH, else /usr/local/bin/consul
// (where test/consul/install.sh puts it). Without one, tests skip with a
// loud reason, except under CI=true, where they fail.
package consulagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/internal/proc"
	"github.com/rdmago/te/internal/testenv"
)

// Binary returns the path of the consul binary, or an error saying how to
// install one.
func Binary() (string, error) {
	const hint = "install it with `bash test/consul/install.sh` (builds v1.14.11 from the Go module proxy, ~10-20 min)"
	if p := os.Getenv("CONSUL"); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", fmt.Errorf("$CONSUL: %w; %s", err, hint)
		}
		return path, nil
	}
	if p, err := exec.LookPath("consul"); err == nil {
		return p, nil
	}
	const fallback = "/usr/local/bin/consul"
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", errors.New("no consul binary ($CONSUL, PATH, /usr/local/bin/consul); " + hint)
}

// Require returns the consul binary's path. Without one it skips the test
// loudly, or fails it when CI=true.
func Require(t testing.TB) string {
	t.Helper()
	p, err := Binary()
	if err != nil {
		testenv.Unavailable(t, "Consul tests cannot run: %v", err)
	}
	return p
}

// Agent is one dev agent.
type Agent struct {
	bin   string
	dir   string
	ports [6]int // http, server, serf lan, serf wan, grpc, grpc tls

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
	logf   *os.File
	runs   int
}

// Start starts a dev agent on free ports and waits until it can create
// sessions. It is stopped when the test ends.
func Start(t testing.TB) *Agent {
	t.Helper()
	a, err := Launch(Require(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// ErrFailed is returned by Start when consul exits, or logs that it cannot
// start (it then lingers for a minute before it exits), before it is ready.
var ErrFailed = errors.New("consulagent: consul failed to start")

// Launch is New and Start, retried on fresh ports when consul fails to
// start: the ports are free when New picks them, but another process
// (a parallel test package's connection, say) can take one before consul
// binds it. Every run's output stays in dir's log.
func Launch(bin, dir string) (*Agent, error) { return launch(bin, dir, (*Agent).pickPorts) }

// launch is Launch with the port picking its test replaces.
func launch(bin, dir string, pick func(*Agent) error) (*Agent, error) {
	a := &Agent{bin: bin, dir: dir}
	var err error
	for try := 0; try < 3; try++ {
		if err = pick(a); err != nil {
			return nil, err
		}
		if err = a.Start(); err == nil {
			return a, nil
		}
		if !errors.Is(err, ErrFailed) {
			break
		}
	}
	return nil, err
}

// New prepares an agent that keeps its logs in dir; Start runs it.
func New(bin, dir string) (*Agent, error) {
	a := &Agent{bin: bin, dir: dir}
	if err := a.pickPorts(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *Agent) pickPorts() error {
	ls := make([]net.Listener, 0, len(a.ports))
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range a.ports {
		// Holding every listener until all ports are picked keeps them
		// distinct. Serf also wants the UDP port of the same number; on
		// loopback that is free whenever the TCP one was.
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("consulagent: pick a port: %w", err)
		}
		ls = append(ls, l)
		a.ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return nil
}

// Addr is the agent's HTTP API address, host:port.
func (a *Agent) Addr() string { return "127.0.0.1:" + strconv.Itoa(a.ports[0]) }

// URI is a consul:// metadata URI for the agent with the given key prefix.
func (a *Agent) URI(prefix string) string { return "consul://" + a.Addr() + "/" + prefix }

// LogPath is the file the agent's output goes to.
func (a *Agent) LogPath() string { return filepath.Join(a.dir, "consul.log") }

// Start runs the agent (again, on the same ports after Stop) and waits until
// it has a leader and accepts sessions.
func (a *Agent) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return errors.New("consulagent: already running")
	}
	f, err := os.OpenFile(a.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("consulagent: %w", err)
	}
	a.runs++
	fmt.Fprintf(f, "=== run %d, ports %v\n", a.runs, a.ports)
	from, _ := f.Seek(0, io.SeekCurrent)
	p := func(i int) string { return strconv.Itoa(a.ports[i]) }
	cmd := exec.Command(a.bin, "agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", p(0), "-server-port", p(1), "-serf-lan-port", p(2), "-serf-wan-port", p(3),
		"-grpc-port", p(4), "-grpc-tls-port", p(5), "-dns-port", "-1",
		"-log-level", "warn",
		"-hcl", `session_ttl_min = "1s"`,
	)
	cmd.Dir = a.dir
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group, so a killed test run does not leave it behind
	// attached to the terminal's signals.
	proc.OwnGroup(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("consulagent: start %s: %w", a.bin, err)
	}
	a.cmd, a.logf = cmd, f
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if gone, err := a.waitReady(exited, from); err != nil {
		if !gone {
			cmd.Process.Kill()
			<-exited
		}
		a.cmd = nil
		f.Close()
		return fmt.Errorf("%w\n%s", err, a.tail())
	}
	a.exited = exited
	return nil
}

// Stop stops the agent (SIGTERM, then SIGKILL after 10 s) and waits for it.
// All its state is lost: it runs in memory. It is idempotent.
func (a *Agent) Stop() { a.stop(proc.Terminate) }

// Kill stops the agent with SIGKILL, as a crash would.
func (a *Agent) Kill() { a.stop(os.Kill) }

func (a *Agent) stop(sig os.Signal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	a.cmd.Process.Signal(sig)
	select {
	case <-a.exited:
	case <-time.After(10 * time.Second):
		a.cmd.Process.Kill()
		<-a.exited
	}
	a.cmd, a.exited = nil, nil
	a.logf.Close()
}

// Restart stops the agent and starts it again on the same ports, with empty
// state.
func (a *Agent) Restart() error {
	a.Stop()
	return a.Start()
}

// tail returns the end of the agent's log, for error messages.
func (a *Agent) tail() string {
	b, _ := os.ReadFile(a.LogPath())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return "consul log:\n" + string(b)
}

// logSays reports whether the log, from offset from on, contains s.
func (a *Agent) logSays(from int64, s string) bool {
	b, _ := os.ReadFile(a.LogPath())
	return int64(len(b)) > from && bytes.Contains(b[from:], []byte(s))
}

// waitReady returns nil once consul is ready, or why not and whether the
// error came from exited (which then has no value left).
func (a *Agent) waitReady(exited <-chan error, from int64) (gone bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + a.Addr()
	do := func(method, path, body string) (int, string, error) {
		// Each try is bounded, so one that hangs (something else on the
		// port) does not hide consul's exit or logged error.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewBufferString(body))
		if err != nil {
			return 0, "", err
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	for {
		select {
		case err := <-exited:
			return true, fmt.Errorf("%w: it exited: %v", ErrFailed, err)
		case <-ctx.Done():
			return false, errors.New("consulagent: consul not ready within 60s")
		case <-time.After(50 * time.Millisecond):
		}
		if a.logSays(from, "Error starting agent") {
			return false, fmt.Errorf("%w: it logged an error", ErrFailed)
		}
		// A leader is not enough: sessions need the agent's node to be
		// registered in the catalog, so create (and destroy) one.
		code, body, err := do("PUT", "/v1/session/create", `{"TTL":"10s","Behavior":"delete"}`)
		if err != nil || code != http.StatusOK {
			continue
		}
		var id string
		if i := bytes.Index([]byte(body), []byte(`"ID":"`)); i >= 0 {
			rest := body[i+6:]
			if j := bytes.IndexByte([]byte(rest), '"'); j > 0 {
				id = rest[:j]
			}
		}
		if id != "" {
			do("PUT", "/v1/session/destroy/"+id, "")
		}
		return false, nil
	}
}
