package consul_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/storetest"
	"github.com/rdmago/te/test/consul/consulagent"
)

// The package's tests share one dev agent, started by the first test that
// needs it and stopped after all; tests that stop Consul start their own.
var shared struct {
	once sync.Once
	dir  string
	a    *consulagent.Agent
	err  error
}

func agent(t testing.TB) *consulagent.Agent {
	t.Helper()
	startShared(consulagent.Require(t))
	if shared.err != nil {
		t.Fatalf("consul agent: %v", shared.err)
	}
	return shared.a
}

func startShared(bin string) {
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "te-consul-test-")
		if shared.err != nil {
			return
		}
		shared.a, shared.err = consulagent.Launch(bin, shared.dir)
	})
}

// exampleAgent points $TE_METADATA, which Example reads, at the shared
// agent when the examples are to run. Without a consul binary Example is
// skipped loudly (under CI the tests fail for it: consulagent.Require).
func exampleAgent() {
	if run := flag.Lookup("test.run").Value.String(); run != "" {
		if ok, _ := regexp.MatchString(run, "Example"); !ok {
			return
		}
	}
	bin, err := consulagent.Binary()
	if err == nil {
		startShared(bin)
		err = shared.err
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "consul: SKIP Example (no agent: %v)\n", err)
		flag.Set("test.skip", "^Example$")
		return
	}
	os.Setenv("TE_METADATA", shared.a.URI("te-example"))
}

const childEnv = "TE_CONSUL_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		child()
		return
	}
	flag.Parse()
	exampleAgent()
	code := m.Run()
	if shared.a != nil {
		shared.a.Stop()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// child is a process that publishes one segment and then hangs until it is
// killed, so its session is neither renewed by a live process nor destroyed.
func child() {
	addr, prefix, name := os.Getenv("TE_ADDR"), os.Getenv("TE_PREFIX"), os.Getenv("TE_NAME")
	ttl := time.Second
	if v, err := time.ParseDuration(os.Getenv("TE_TTL")); err == nil {
		ttl = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := consul.New(ctx, consul.Config{Address: addr, Prefix: prefix, SessionTTL: ttl})
	if err == nil {
		err = s.Publish(ctx, storetest.Descriptor(name, 0, 1))
	}
	cancel()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("published", s.Session())
	select {}
}

func prefix(t *testing.T) string {
	var b [6]byte
	rand.Read(b[:])
	return "te-test/" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + hex.EncodeToString(b[:])
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, cfg consul.Config) *consul.Store {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	s, err := consul.New(ctxT(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatalf("consul.New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func rawKV(t *testing.T, addr string) *api.KV {
	c, err := api.NewClient(&api.Config{Address: addr, Transport: &nonPooled})
	if err != nil {
		t.Fatal(err)
	}
	return c.KV()
}

// One transport for raw test clients, closed by TestMain's leak check
// through DisableKeepAlives: no idle connections stay behind.
var nonPooled = http1NoKeepAlive()

func TestConformance(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	storetest.Run(t, func(t *testing.T) segment.Store {
		return open(t, consul.Config{Address: a.Addr(), Prefix: p})
	}, storetest.ListsAll(), storetest.Conflicts(), storetest.Settle(10*time.Second))
}

func TestKeyLayout(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	s := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	ctx := ctxT(t, 20*time.Second)
	name := "rack 1/host-7:15001%x"
	d := storetest.Descriptor(name, 5, 1)
	if err := s.Publish(ctx, d); err != nil {
		t.Fatal(err)
	}
	key := p + "/segments/" + url.PathEscape(name)
	if s.Key(name) != key {
		t.Fatalf("Key = %q, want %q", s.Key(name), key)
	}
	kv := rawKV(t, a.Addr())
	pair, _, err := kv.Get(key, nil)
	if err != nil || pair == nil {
		t.Fatalf("raw get %s: %v %v", key, pair, err)
	}
	want, _ := segment.Marshal(d)
	if string(pair.Value) != string(want) {
		t.Fatalf("stored value %s, want segment.Marshal %s", pair.Value, want)
	}
	if pair.Session != s.Session() {
		t.Fatalf("key held by session %q, want the store's %q", pair.Session, s.Session())
	}
	if at := time.UnixMilli(int64(pair.Flags)); time.Since(at) > time.Minute || time.Since(at) < 0 {
		t.Fatalf("flags %d is not a recent publish time", pair.Flags)
	}
	keys, _, err := kv.Keys(p+"/", "", nil)
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys under %s: %v %v; want exactly one", p, keys, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != name {
		t.Fatalf("List = %v, %v", list, err)
	}
	if at, ok := s.PublishedAt(name); !ok || time.Since(at) > time.Minute {
		t.Fatalf("PublishedAt = %v, %v", at, ok)
	}

	// A key that is not a valid descriptor is refused by Get and skipped
	// by List.
	if _, err := kv.Put(&api.KVPair{Key: s.Key("junk"), Value: []byte(`{"schema":99}`)}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "junk"); !errors.Is(err, segment.ErrInvalid) {
		t.Fatalf("Get(junk) = %v, want ErrInvalid", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 1 {
		t.Fatalf("List with a junk key = %v, %v; want the one valid segment", list, err)
	}
	// A key whose descriptor names another segment is refused too.
	if _, err := kv.Put(&api.KVPair{Key: s.Key("alias"), Value: want}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "alias"); !errors.Is(err, segment.ErrInvalid) {
		t.Fatalf("Get(alias) = %v, want ErrInvalid", err)
	}
}

// Two stores cannot silently overwrite each other: a second store is
// refused. A change behind the owner's back by a writer that is not a
// store (a plain KV put, which keeps the owner's lock) is undone: the
// owner writes its descriptor again (TestOwnKeyRepaired), and its next
// publish passes its own index check.
func TestCheckAndSet(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	ctx := ctxT(t, 30*time.Second)
	s1 := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	s2 := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	const name = "cas"
	if err := s1.Publish(ctx, storetest.Descriptor(name, 1, 1)); err != nil {
		t.Fatal(err)
	}
	err := s2.Publish(ctx, storetest.Descriptor(name, 2, 1))
	if !errors.Is(err, segment.ErrConflict) {
		t.Fatalf("second writer: %v, want ErrConflict", err)
	}
	t.Logf("second writer: %v", err)

	kv := rawKV(t, a.Addr())
	other, _ := segment.Marshal(storetest.Descriptor(name, 3, 9))
	if _, err := kv.Put(&api.KVPair{Key: s1.Key(name), Value: other}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s1.Publish(ctx, storetest.Descriptor(name, 1, 2)); err != nil {
		t.Fatalf("owner after a change behind its back: %v", err)
	}
	got, err := s2.Get(ctx, name)
	if err != nil || got.Epoch != 1 || got.Version != 2 {
		t.Fatalf("the owner's publish did not land: %+v, %v", got, err)
	}
	// Still refused to the second store; the owner's Close deletes it.
	if err := s2.Publish(ctx, storetest.Descriptor(name, 2, 1)); !errors.Is(err, segment.ErrConflict) {
		t.Fatalf("second writer again: %v, want ErrConflict", err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err = s2.Get(ctx, name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("after the owner closed: %v, want ErrNotFound", err)
	}
}

// A restarted process (a new store) publishes a new epoch; watchers see it.
func TestRestartNewEpoch(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	ctx := ctxT(t, 30*time.Second)
	reader := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	ch, err := reader.Watch(ctx, "node")
	if err != nil {
		t.Fatal(err)
	}
	recv := func() *segment.Descriptor {
		t.Helper()
		select {
		case d := <-ch:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no watch report")
		}
		return nil
	}
	if d := recv(); d != nil {
		t.Fatalf("initial report %+v, want nil", d)
	}
	var epochs []uint64
	for range 2 {
		s := open(t, consul.Config{Address: a.Addr(), Prefix: p})
		d := storetest.Descriptor("node", 0, 1)
		t0 := time.Now()
		if err := s.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
		got := recv()
		t.Logf("publish -> watch report %v", time.Since(t0))
		if got == nil || got.Epoch != s.Epoch() || got.Epoch == 0 {
			t.Fatalf("watch report %+v, want epoch %#x", got, s.Epoch())
		}
		epochs = append(epochs, got.Epoch)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if d := recv(); d != nil {
			t.Fatalf("after Close: report %+v, want nil", d)
		}
	}
	if epochs[0] == epochs[1] {
		t.Fatalf("restarted store reused epoch %#x", epochs[0])
	}
}

// A process killed with SIGKILL neither renews nor destroys its session;
// Consul must remove its segment within TTL..2×TTL (+ grace).
func TestKilledOwnerExpires(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	const name = "doomed"
	const ttl = time.Second
	cmd := startChild(t, a.Addr(), p, name, ttl)
	reader := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	ctx := ctxT(t, 30*time.Second)
	if _, err := reader.Get(ctx, name); err != nil {
		t.Fatalf("child's segment not visible: %v", err)
	}
	// Let the child renew at least once, so expiry is measured from a
	// renewal and not from creation.
	time.Sleep(ttl)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	const grace = 5 * time.Second // generous: CI machines are loaded
	for {
		_, err := reader.Get(ctx, name)
		if errors.Is(err, segment.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if time.Since(killed) > 2*ttl+grace {
			t.Fatalf("killed owner's segment still present %v after SIGKILL (TTL %v)", time.Since(killed), ttl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("killed owner's segment gone %v after SIGKILL (TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)
}

// startChild runs a process that publishes name under prefix with a
// session of the given TTL and then hangs until killed.
func startChild(t *testing.T, addr, prefix, name string, ttl time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1", "TE_ADDR="+addr, "TE_PREFIX="+prefix, "TE_NAME="+name, "TE_TTL="+ttl.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "published ") {
			t.Fatalf("child: %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("child did not publish")
	}
	return cmd
}

// A process restarted under the name of one that crashed on this machine
// takes the name over at once, not after the crashed one's session TTL
// (30 s here, far longer than the test waits); while the first process
// lives, the name stays its own.
func TestRestartTakesOverFromDeadOwner(t *testing.T) {
	a := agent(t)
	p := prefix(t)
	const name = "phoenix"
	ctx := ctxT(t, 30*time.Second)
	cmd := startChild(t, a.Addr(), p, name, 30*time.Second)
	s := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	if err := s.Publish(ctx, storetest.Descriptor(name, 0, 1)); !errors.Is(err, segment.ErrConflict) {
		t.Fatalf("publish over a live owner: %v, want ErrConflict", err)
	}
	// Killed but not yet reaped: a zombie renews nothing either.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)); err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t0 := time.Now()
	if err := s.Publish(ctx, storetest.Descriptor(name, 0, 1)); err != nil {
		t.Fatalf("publish after the owner died: %v", err)
	}
	t.Logf("took the name over %v after the owner died (its TTL: 30s)", time.Since(t0).Round(time.Microsecond))
	d, err := open(t, consul.Config{Address: a.Addr(), Prefix: p}).Get(ctx, name)
	if err != nil || d.Epoch != s.Epoch() {
		t.Fatalf("after take-over: %+v, %v; want epoch %#x", d, err, s.Epoch())
	}
}

func TestURI(t *testing.T) {
	for uri, want := range map[string]consul.Config{
		"consul://":                                {},
		"consul://10.0.0.1:8500":                   {Address: "10.0.0.1:8500"},
		"consul://h:1/a/b/":                        {Address: "h:1", Prefix: "a/b"},
		"consul://h:1/p?ttl=3s&timeout=1s&wait=5s": {Address: "h:1", Prefix: "p", SessionTTL: 3 * time.Second, RequestTimeout: time.Second, WatchWait: 5 * time.Second},
	} {
		u, _ := url.Parse(uri)
		got, err := consul.ParseURI(u)
		if err != nil {
			t.Errorf("%s: %v", uri, err)
			continue
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b func(string, ...any)) bool { return true })); diff != "" {
			t.Errorf("%s (-want +got):\n%s", uri, diff)
		}
	}
	for _, uri := range []string{"consul://h/?ttl=x", "consul://h/?bogus=1", "consul://u:pw@h/", "consul://h/?ttl=1s&ttl=2s"} {
		u, _ := url.Parse(uri)
		if _, err := consul.ParseURI(u); err == nil {
			t.Errorf("%s: no error", uri)
		}
	}
}

// Consul not running at all: New fails clearly and promptly.
func TestUnreachableAtStart(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s, err := consul.Open(ctxT(t, 10*time.Second), "consul://"+addr+"/x")
	if !errors.Is(err, segment.ErrUnavailable) {
		s.Close()
		t.Fatalf("Open with no Consul = %v, want ErrUnavailable", err)
	}
	t.Logf("%v", err)
}

func TestOpenScheme(t *testing.T) {
	a := agent(t)
	s, err := consul.Open(ctxT(t, 10*time.Second), a.URI(prefix(t))+"?ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Session() == "" {
		t.Fatal("Open returned a store without a session")
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"consul://h:1/p?ttl=3s", "consul://", "consul://h/a//b", "consul://u@h/?wait=-1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		c, err := consul.ParseURI(u)
		if err != nil {
			return
		}
		if c.SessionTTL < 0 || c.RequestTimeout < 0 || c.WatchWait < 0 {
			t.Fatalf("%q: negative duration accepted: %+v", s, c)
		}
	})
}

// $CONSUL_HTTP_TOKEN_FILE naming a FIFO (or a huge file) fails at once
// with a clear error; the FIFO's open used to block New forever.
func TestTokenFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := dir + "/fifo"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := dir + "/big"
	if err := os.WriteFile(big, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	for path, want := range map[string]string{fifo: "not a regular file", big: "too large"} {
		t.Setenv("CONSUL_HTTP_TOKEN_FILE", path)
		done := make(chan error, 1)
		go func() {
			s, err := consul.New(context.Background(), consul.Config{Address: "127.0.0.1:1"})
			if s != nil {
				s.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "CONSUL_HTTP_TOKEN_FILE") {
				t.Errorf("token file %s: %v, want %q", path, err, want)
			}
		case <-time.After(time.Second):
			t.Fatalf("token file %s: New blocked for a second", path)
		}
	}
}
