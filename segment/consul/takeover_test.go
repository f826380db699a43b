package consul

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/storetest"
	"github.com/rdmago/te/test/consul/consulagent"
)

// TestTakeOverWhileSettling: the crashed owner's session end takes a while
// to settle (here its one-second lock-delay: Consul refuses to lock the
// key again for that long after ending the session, without changing the
// key's index). The restarted process must still take its name over,
// waiting on Consul's state, not give up after a fixed number of tries.
func TestTakeOverWhileSettling(t *testing.T) {
	a := consulagent.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const prefix, name = "settle", "phoenix"

	// A process of this machine that is gone: start it, note its start
	// time, kill and reap it.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	dead := self()
	dead.pid = sleeper.Process.Pid
	dead.start, _, _ = procStat(dead.pid)
	sleeper.Process.Kill()
	sleeper.Wait()
	if !self().provesGone(dead) {
		t.Fatalf("the reaped process %d is not provably gone", dead.pid)
	}

	// Its session holds the key, with a lock-delay.
	c, err := api.NewClient(&api.Config{Address: a.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	sid, _, err := c.Session().Create(&api.SessionEntry{Name: dead.sessionName(), TTL: "30s",
		Behavior: api.SessionBehaviorDelete, LockDelay: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	val, err := segment.Marshal(storetest.Descriptor(name, 7, 1))
	if err != nil {
		t.Fatal(err)
	}
	key := prefix + "/segments/" + name
	if ok, _, err := c.KV().Acquire(&api.KVPair{Key: key, Value: val, Session: sid}, nil); err != nil || !ok {
		t.Fatalf("acquire %s: %v %v", key, ok, err)
	}

	s, err := New(ctx, Config{Address: a.Addr(), Prefix: prefix, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Now()
	if err := s.Publish(ctx, storetest.Descriptor(name, 0, 1)); err != nil {
		t.Fatalf("publish after the owner died: %v", err)
	}
	t.Logf("took the name over %v after the dead owner's session (lock-delay 1s)", time.Since(t0).Round(time.Millisecond))
	p, _, err := c.KV().Get(key, nil)
	if err != nil || p == nil || p.Session != s.Session() {
		t.Fatalf("key after take-over: %+v, %v", p, err)
	}
}
