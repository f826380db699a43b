package shm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/segment/p2p"
)

var shared = transporttest.Options{Shared: true, Remote: true}

// initiator starts an initiator engine with an shm transport and returns
// both.
func initiator(t *testing.T, size int) (*enginetest.Node, *Transport) {
	t.Helper()
	var tr *Transport
	n := transporttest.Initiator(t, shared, nil, size, func(testing.TB) engine.Transport {
		tr = New(Config{IOTimeout: 2 * time.Second})
		return tr
	})
	return n, tr
}

// target starts a target engine in this process with an shm transport and
// a p2p store.
func target(t *testing.T, size int, cfg Config) (*engine.Engine, *Transport, *engine.Memory) {
	t.Helper()
	st, err := p2p.New(context.Background(), p2p.Options{Listen: "127.0.0.1:0", PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tr := New(cfg)
	n := enginetest.NewNode(t, engine.Config{Name: st.Name(), Store: st}, 0, tr)
	mem, err := engine.AllocShared(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := n.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	return n.Engine, tr, mem
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every millisecond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// memfdMaps counts this process's mappings of te memory files.
func memfdMaps(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:te-mem")
}

// leftovers lists what a process of this transport could leave in the
// file system: the entries of /dev/shm; and the unix sockets of this
// network namespace (/proc/net/unix), where an endpoint's name shows as
// long as any socket bound to it exists.
func leftovers(t *testing.T) (shm []string, sockets string) {
	t.Helper()
	es, err := os.ReadDir("/dev/shm")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range es {
		shm = append(shm, e.Name())
	}
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	return shm, string(b)
}

// TestTargetKilledMidBatch: a target SIGKILLed while batches stream to it
// fails the initiator's tasks with ErrPeerReset within a bound, without a
// hang; the initiator unmaps everything, and nothing of the target is
// left: no /dev/shm entry, no socket.
func TestTargetKilledMidBatch(t *testing.T) {
	const blk, tasks = 1 << 20, 128
	shm0, _ := leftovers(t)
	ini, tr := initiator(t, blk*tasks)
	base := memfdMaps(t)
	tgt := transporttest.StartRemoteTarget(t, shared, blk*tasks, "127.0.0.1:0")
	e := ini.Engine
	ctx := ctxT(t, 60*time.Second)
	seg, err := e.OpenSegment(ctx, tgt.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.Peers != 1 || st.Mapped != 1 {
		t.Fatalf("after open: %+v", st)
	}
	d, _ := e.SegmentDescriptor(seg)
	pr, _ := d.Protocol("shm")
	endpoint := strings.TrimPrefix(pr.Endpoint, "@")
	if _, socks := leftovers(t); !strings.Contains(socks, endpoint) {
		t.Fatalf("the target's endpoint %s is not in /proc/net/unix", endpoint)
	}
	if got := memfdMaps(t); got != base+2 { // the region and the control page
		t.Fatalf("%d memfd mappings after open, want %d", got, base+2)
	}
	reqs := make([]engine.Request, tasks)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: ini.Mem.Bytes()[i*blk : (i+1)*blk], Target: seg, TargetAddr: tgt.Base() + uint64(i*blk)}
	}
	b, _ := e.AllocateBatch(tasks)
	var killed time.Time
	var failed error
	for i := 0; failed == nil; i++ {
		if i == 3 {
			// Kill it while this batch is being copied.
			killedAt := make(chan time.Time, 1)
			go func() {
				time.Sleep(time.Millisecond)
				tgt.Kill()
				killedAt <- time.Now()
			}()
			defer func() { <-killedAt }()
			killed = time.Now()
		}
		if !killed.IsZero() && time.Since(killed) > 10*time.Second {
			t.Fatal("batches still succeed 10s after the target was killed")
		}
		if err := e.Submit(b, reqs); err != nil {
			failed = err
			break
		}
		if err := e.Wait(ctx, b); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("Wait hung")
			}
			failed = err
		}
		for j := range tasks {
			if st, _ := e.Status(b, j); st.State != engine.StateCompleted && st.State != engine.StateFailed {
				t.Fatalf("task %d %v after Wait", j, st.State)
			}
		}
		if err := e.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
		b, _ = e.AllocateBatch(tasks)
	}
	t.Logf("first failure %v after the kill: %v", time.Since(killed), failed)
	if !errors.Is(failed, engine.ErrPeerReset) && !errors.Is(failed, engine.ErrSegmentNotFound) {
		t.Fatalf("failed with %v, want ErrPeerReset (or the segment gone)", failed)
	}
	eventually(t, 5*time.Second, "initiator unmaps the dead target", func() bool {
		st := tr.Stats()
		return st.Peers == 0 && st.Mapped == 0 && memfdMaps(t) == base
	})
	shm1, socks := leftovers(t)
	if strings.Join(shm0, ",") != strings.Join(shm1, ",") {
		t.Errorf("/dev/shm before %v, after %v", shm0, shm1)
	}
	if strings.Contains(socks, endpoint) {
		t.Errorf("the dead target's endpoint %s is still in /proc/net/unix", endpoint)
	}
}

// TestTargetRestarted: a target restarted under the same name (new
// epoch) serves the next batch, and the initiator never touches the old
// incarnation's mapping again.
func TestTargetRestarted(t *testing.T) {
	const size = 1 << 20
	ini, tr := initiator(t, size)
	e := ini.Engine
	base := memfdMaps(t)
	old := transporttest.StartRemoteTarget(t, shared, size, "127.0.0.1:0")
	ctx := ctxT(t, 60*time.Second)
	seg, err := e.OpenSegment(ctx, old.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	d0, _ := e.SegmentDescriptor(seg)
	src := ini.Mem.Bytes()[:4096]
	src[0] = 1
	if err := e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: src, Target: seg, TargetAddr: old.Base()}}); err != nil {
		t.Fatal(err)
	}
	old.Kill()
	nu := transporttest.StartRemoteTarget(t, shared, size, old.Name())
	// The initiator learns of the new epoch through the store's watch;
	// until then a transfer fails (the old peer is gone).
	src[0] = 2
	eventually(t, 20*time.Second, "a transfer to the restarted target", func() bool {
		return e.Transfer(ctx, []engine.Request{{Op: engine.Write, Local: src, Target: seg, TargetAddr: nu.Base()}}) == nil
	})
	d1, _ := e.SegmentDescriptor(seg)
	if d1.Epoch == d0.Epoch {
		t.Fatal("same epoch after restart")
	}
	got, err := nu.Read(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 2 {
		t.Fatalf("restarted target has %d, want 2", got[0])
	}
	if st := tr.Stats(); st.Peers != 1 || st.Mapped != 1 {
		t.Fatalf("after restart: %+v (want one peer, one region)", st)
	}
	if got := memfdMaps(t); got != base+2 {
		t.Fatalf("%d memfd mappings, want %d (the new target's region and control page)", got, base+2)
	}
}

// TestPeerKilled: an initiator SIGKILLed while it writes leaves nothing in
// the target: its connection and control page go, and unregistering the
// memory it wrote is not held up.
func TestPeerKilled(t *testing.T) {
	e, tr, mem := target(t, 1<<20, Config{IOTimeout: 30 * time.Second})
	base := memfdMaps(t)
	shm0, _ := leftovers(t)
	c := startChild(t, "", "writer", e.Name(), nil)
	c.expect(t, "connected")
	c.expect(t, "wrote")
	if st := tr.Stats(); st.Served != 1 {
		t.Fatalf("serving %d initiators, want 1", st.Served)
	}
	if got := memfdMaps(t); got != base+2 {
		t.Fatalf("%d memfd mappings while serving, want %d (the control page, and its note ring mapped apart)", got, base+2)
	}
	c.kill()
	eventually(t, 5*time.Second, "target drops the dead initiator", func() bool {
		return tr.Stats().Served == 0 && memfdMaps(t) == base
	})
	start := time.Now()
	if err := e.UnregisterLocalMemory(mem.Bytes()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("unregistering took %v: the dead peer held it up", d)
	}
	if shm1, _ := leftovers(t); strings.Join(shm0, ",") != strings.Join(shm1, ",") {
		t.Errorf("/dev/shm before %v, after %v", shm0, shm1)
	}
}

// TestOtherUserRefused: a process of another user neither chooses shm for
// the target nor gets through a direct handshake.
func TestOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "running a peer as another user needs root (euid %d)", os.Geteuid())
	}
	e, tr, _ := target(t, 1<<20, Config{})
	exe := copyExecutable(t)
	c := startChild(t, exe, "stranger", e.Name(), func(cmd *exec.Cmd) {
		testenv.RunAs(cmd, 65534, 65534) // nobody
		cmd.Dir = os.TempDir()
	})
	if l := c.expect(t, "open:"); l != "open: true" {
		t.Errorf("another user's engine: %q, want it to find no usable transport", l)
	}
	if l := c.expect(t, "dial:"); !strings.HasPrefix(l, "dial: refused=true") {
		t.Errorf("another user's handshake: %q, want refused", l)
	}
	// The refused connections close (asynchronously) and stay closed.
	eventually(t, 5*time.Second, "refused connections closed", func() bool { return tr.Stats().Served == 0 })
}
