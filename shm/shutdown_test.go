package shm

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
)

// TestCloseHostileBusy: 64 same-user peers each raise the busy counter of
// every region they mapped and stop, as if stuck inside a copy forever.
// The target's Close fences them all at once and returns within one
// IOTimeout (plus a margin), logging once which peers it gave up on; it
// used to wait for each in turn (two IOTimeouts each: 128 s here).
// Without the hostile counters Close neither waits nor warns.
func TestCloseHostileBusy(t *testing.T) {
	for _, hostile := range []bool{true, false} {
		const peers, timeout = 64, time.Second
		var log testenv.Buffer
		st := enginetest.NewMemStore()
		t.Cleanup(func() { st.Close() })
		ttr := New(Config{IOTimeout: timeout})
		tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st,
			Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))}, 0, ttr)
		for range 3 { // several regions: several slots per peer
			mem, err := engine.AllocShared(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { mem.Close() })
			if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
				t.Fatal(err)
			}
		}
		itr := New(Config{IOTimeout: timeout})
		enginetest.NewNode(t, engine.Config{Name: "mallory"}, 0, itr)
		d := tgt.Engine.LocalDescriptor()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for range peers {
			p, err := dialPeer(ctx, itr, d, ttr.Endpoint())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			ms := *p.maps.Load()
			if len(ms) != 3 {
				t.Fatalf("peer mapped %d regions, want 3", len(ms))
			}
			if hostile {
				for _, m := range ms {
					p.page.busy[m.slot].Store(1) // and never lowers it
				}
			}
		}
		eventually(t, 5*time.Second, "all peers served", func() bool { return ttr.Stats().Served == peers })
		start := time.Now()
		if err := tgt.Engine.Close(); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("hostile %v: target closed in %v with %d peers (IOTimeout %v)", hostile, took.Round(time.Millisecond), peers, timeout)
		if n := ttr.Stats().Served; n != 0 {
			t.Fatalf("%d peers still served after Close", n)
		}
		if !hostile {
			if took > timeout/2 || log.String() != "" {
				t.Fatalf("Close with idle peers took %v and logged:\n%s", took, log.String())
			}
			continue
		}
		if took > timeout+2*time.Second {
			t.Fatalf("Close took %v with %d stuck peers: want at most one IOTimeout (%v) and a margin", took, peers, timeout)
		}
		if l := log.String(); strings.Count(l, "gave up waiting") != 1 || !strings.Contains(l, "peers=64") || !strings.Contains(l, "pids=") {
			t.Fatalf("want one line naming the peers given up on:\n%s", l)
		}
	}
}

// TestUnmapIgnoresTargetBusy: the busy counters live in the target's
// page, which the target can write. An UNMAP for a region whose counter
// a hostile target holds up is still carried out once no copy of this
// process is inside it; the initiator's reader (and with it Close) used
// to spin forever.
func TestUnmapIgnoresTargetBusy(t *testing.T) {
	_, _, itr, _, _ := inProcessPair(t, 1<<20, Config{IOTimeout: time.Second})
	var p *peer
	itr.mu.Lock()
	for q := range itr.peers {
		p = q
	}
	itr.mu.Unlock()
	if p == nil {
		t.Fatal("no peer")
	}
	m := (*p.maps.Load())[0]
	p.page.busy[m.slot].Add(1000) // the target's doing
	done := make(chan struct{})
	go func() {
		p.removeSlot(m.slot, m.gen)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("unmap still waiting on the target's busy counter after 5 s")
	}
	if len(*p.maps.Load()) != 0 {
		t.Fatal("mapping still listed")
	}
	start := time.Now()
	p.Close()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("peer Close took %v", d)
	}
}

// TestUnregisterHostileBusy: 64 peers hold up the busy counter of one
// region; unregistering it waits for all of them together, at most one
// IOTimeout (it used to wait one IOTimeout for each in turn), disconnects
// them with one log line, and the region is gone.
func TestUnregisterHostileBusy(t *testing.T) {
	const peers, timeout = 64, time.Second
	var log testenv.Buffer
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	ttr := New(Config{IOTimeout: timeout})
	tgt := enginetest.NewNode(t, engine.Config{Name: "target", Store: st,
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelWarn}))}, 0, ttr)
	mem, err := engine.AllocShared(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	if err := tgt.Engine.RegisterLocalMemory(mem.Bytes(), ""); err != nil {
		t.Fatal(err)
	}
	itr := New(Config{IOTimeout: timeout})
	enginetest.NewNode(t, engine.Config{Name: "mallory"}, 0, itr)
	d := tgt.Engine.LocalDescriptor()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range peers {
		p, err := dialPeer(ctx, itr, d, ttr.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		m := (*p.maps.Load())[0]
		p.page.busy[m.slot].Store(1)
	}
	eventually(t, 5*time.Second, "all peers served", func() bool { return ttr.Stats().Served == peers })
	start := time.Now()
	if err := tgt.Engine.UnregisterLocalMemory(mem.Bytes()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("unregistered in %v with %d stuck peers (IOTimeout %v)", took.Round(time.Millisecond), peers, timeout)
	if took > timeout+2*time.Second {
		t.Fatalf("UnregisterLocalMemory took %v: want at most one IOTimeout (%v) and a margin", took, timeout)
	}
	if l := log.String(); strings.Count(l, "stuck inside a copy") != 1 || !strings.Contains(l, "peers=64") {
		t.Fatalf("want one line naming the peers:\n%s", l)
	}
	eventually(t, 5*time.Second, "stuck peers disconnected", func() bool { return ttr.Stats().Served == 0 })
	if ttr.Stats().Shared != 0 {
		t.Fatalf("region still shared: %+v", ttr.Stats())
	}
}
