package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/bench"
	"github.com/rdmago/te/segment"
)

// checkUnlisted sets up te bench with args and checks that its initiator
// serves nothing: its descriptor (its whole buffer) is not in the store,
// its tcp and shm listen nowhere (rdma: on loopback), not on every
// interface. check looks at the store as well.
// The bench then runs all the same.
func checkUnlisted(t *testing.T, args []string, check func(*benchEnv)) {
	t.Helper()
	c, err := parseBench(append(args, "--duration", "100ms", "--batch-size", "4", "--buffer-size", "1MiB", "--quiet"), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	env, err := setupBench(benchCtx(t), c, 1<<20, 1<<20, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, pr := range env.init.eng.LocalDescriptor().Protocols {
		if ep := pr.Endpoint; pr.Name != segment.ProtoRDMA || !strings.HasPrefix(ep, "127.0.0.1:") {
			t.Errorf("%v: the initiator's %s listens on %s (tcp and shm: nowhere; rdma: loopback)", args, pr.Name, ep)
		}
	}
	if _, err := env.init.store.Get(benchCtx(t), env.init.eng.Name()); !errors.Is(err, segment.ErrNotFound) {
		t.Errorf("%v: the initiator's descriptor is in the store: %v", args, err)
	}
	if check != nil {
		check(env)
	}
	if _, err := bench.Run(benchCtx(t), &env.Env, env.config("write", 4096)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// te bench's initiator serves nothing, with the embedded store too, even
// when the store listens on every interface.
func TestBenchInitiatorUnlisted(t *testing.T) {
	checkUnlisted(t, []string{"--metadata", "p2p"}, nil)
	_, name, _ := serveProcess(t, "--buffer-size", "1MiB")
	checkUnlisted(t, []string{"--metadata", "p2p://0.0.0.0:0", "--segment", name}, nil)
}
