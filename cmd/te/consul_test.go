package main

import (
	"bytes"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/rdmago/te/test/consul/consulagent"
)

// rawKV is a Consul KV client of the test's own, as another writer.
func rawKV(t *testing.T, a *consulagent.Agent) *api.KV {
	t.Helper()
	c, err := api.NewClient(&api.Config{Address: a.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	return c.KV()
}

// A te serve watches its own Consul key: overwritten with garbage, then
// deleted by someone else, it is published again each time, and te
// serve says so on stderr.
func TestServeRepairsOwnConsulKey(t *testing.T) {
	a := consulagent.Start(t)
	const prefix, name = "te-guard", "guarded-target"
	srv, got, srvErr := serveProcess(t, "--buffer-size", "1MiB", "--metadata", a.URI(prefix), "--name", name)
	if got != name {
		t.Fatalf("te serve named its segment %q", got)
	}
	kv := rawKV(t, a)
	key := prefix + "/segments/" + url.PathEscape(name)
	orig, _, err := kv.Get(key, nil)
	if err != nil || orig == nil {
		t.Fatalf("te serve's key %s: %+v, %v", key, orig, err)
	}
	republished := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			p, _, err := kv.Get(key, nil)
			if err == nil && p != nil && bytes.Equal(p.Value, orig.Value) && p.Session == orig.Session {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s: key %s not republished in 15 s: %+v, %v\nte serve:\n%s", what, key, p, err, stopped(srv, srvErr))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := kv.Put(&api.KVPair{Key: key, Value: []byte("garbage")}, nil); err != nil {
		t.Fatal(err)
	}
	republished("an overwrite with garbage")
	if _, err := kv.Delete(key, nil); err != nil {
		t.Fatal(err)
	}
	republished("a delete")
	// A reader sees a working segment: te bench over it passes.
	_, stderr, code := runTE(t, "bench", "--metadata", a.URI(prefix), "--segment", name, "--duration", "200ms", "--batch-size", "4", "--verify", "--quiet")
	if code != 0 {
		t.Fatalf("te bench after the repairs: exit %d\n%s", code, stderr)
	}
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	log := srvErr.String()
	if !strings.Contains(log, "changed by another writer") || !strings.Contains(log, "disappeared") {
		t.Fatalf("te serve did not log the changes:\n%s", log)
	}
	t.Logf("te serve:\n%s", log)
}

// 2000 unreadable keys under the prefix cost te segments one line on
// stderr (count and first names), not one line per key; the readable
// segment is still listed.
func TestSegmentsUnreadableKeysSummarized(t *testing.T) {
	a := consulagent.Start(t)
	const prefix = "te-junk"
	srv, name, _ := serveProcess(t, "--buffer-size", "1MiB", "--metadata", a.URI(prefix), "--name", "readable")
	defer srv.Process.Kill()
	kv := rawKV(t, a)
	const junk = 2000
	for i := 0; i < junk; {
		var ops api.KVTxnOps
		for ; i < junk && len(ops) < 64; i++ {
			ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: fmt.Sprintf("%s/segments/junk-%05d", prefix, i), Value: []byte("\x1b[2Jnot a descriptor")})
		}
		if ok, resp, _, err := kv.Txn(ops, nil); err != nil || !ok {
			t.Fatalf("junk: %v %v", err, resp)
		}
	}
	out, stderr, code := runTE(t, "segments", "--metadata", a.URI(prefix))
	if code != 0 || !strings.Contains(out, name) {
		t.Fatalf("te segments: exit %d\n%s\n%s", code, out, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 || !strings.Contains(stderr, fmt.Sprintf("%d unreadable keys", junk)) || !strings.Contains(stderr, "junk-00000") {
		t.Fatalf("te segments wrote %d lines on stderr, want one summary:\n%.3000s", len(lines), stderr)
	}
	if strings.ContainsRune(stderr, 0x1b) {
		t.Fatalf("control characters on stderr: %q", stderr)
	}
	t.Logf("stderr: %s", stderr)
}

// With Consul metadata, te bench publishes no key of its own: only the
// target's is there while it runs (it used to publish its whole buffer and
// listen on every interface).
func TestBenchInitiatorUnlistedConsul(t *testing.T) {
	a := consulagent.Start(t)
	const prefix = "te-unlisted"
	_, name, _ := serveProcess(t, "--buffer-size", "1MiB", "--metadata", a.URI(prefix), "--name", "served")
	kv := rawKV(t, a)
	checkUnlisted(t, []string{"--metadata", a.URI(prefix), "--segment", name}, func(*benchEnv) {
		keys, _, err := kv.Keys(prefix+"/", "", nil)
		if err != nil || len(keys) != 1 || !strings.HasSuffix(keys[0], "/served") {
			t.Errorf("keys in Consul while te bench runs: %v, %v; want te serve's alone", keys, err)
		}
	})
}
