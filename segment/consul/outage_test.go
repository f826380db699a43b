package consul_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/storetest"
	"github.com/rdmago/te/test/consul/consulagent"
)

// Consul stops and comes back (same ports, empty state, as a dev agent or a
// rebuilt cluster would): cached segments keep being served, unknown ones
// fail with ErrUnavailable, writes are kept, and on return every store
// re-registers its segments under a new session.
func TestConsulRestart(t *testing.T) {
	a := consulagent.Start(t) // this test's own agent: it is stopped
	ctx := ctxT(t, 2*time.Minute)
	cfg := consul.Config{Address: a.Addr(), Prefix: "outage", SessionTTL: time.Second, RequestTimeout: 2 * time.Second}
	owner := open(t, cfg)
	reader := open(t, cfg)

	d1 := storetest.Descriptor("seg", 0, 1)
	if err := owner.Publish(ctx, d1); err != nil {
		t.Fatal(err)
	}
	d1.Epoch = owner.Epoch()
	if _, err := reader.Get(ctx, "seg"); err != nil {
		t.Fatal(err)
	}
	watch, err := reader.Watch(ctx, "seg")
	if err != nil {
		t.Fatal(err)
	}
	if d := <-watch; d == nil || d.Version != 1 {
		t.Fatalf("first watch report %+v", d)
	}
	oldSession := owner.Session()

	// A second owner dies during the outage: its segment must be reported
	// gone once Consul is back and the re-registration grace has passed.
	doomed := open(t, cfg)
	if err := doomed.Publish(ctx, storetest.Descriptor("doomed", 0, 1)); err != nil {
		t.Fatal(err)
	}
	doomedWatch, err := reader.Watch(ctx, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	if d := <-doomedWatch; d == nil {
		t.Fatal("first watch report for doomed is nil")
	}

	a.Kill()
	if err := doomed.Close(); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Close with Consul down = %v, want ErrUnavailable", err)
	}
	stopped := time.Now()

	// Cached: served, with the outage visible in Health once noticed.
	for _, s := range []*consul.Store{reader, owner} {
		got, err := s.Get(ctx, "seg")
		if err != nil || got.Version != 1 || got.Epoch != d1.Epoch {
			t.Fatalf("cached Get during outage = %+v, %v", got, err)
		}
	}
	// Unknown: a clear, prompt error.
	t0 := time.Now()
	if _, err := reader.Get(ctx, "never-seen"); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Get of an uncached segment during outage = %v, want ErrUnavailable", err)
	} else {
		t.Logf("uncached Get during outage (%v): %v", time.Since(t0).Round(time.Millisecond), err)
	}
	if _, err := reader.List(ctx); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("List during outage = %v, want ErrUnavailable", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for reader.Health() == nil || owner.Health() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Health did not report the outage")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := owner.Health(); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Health = %v, want ErrUnavailable", err)
	}
	// Known outage: cached Gets do not wait for a timeout.
	if got, err := reader.Get(ctx, "seg"); err != nil || got.Version != 1 {
		t.Fatalf("cached Get during known outage = %+v, %v", got, err)
	}
	// A write during the outage is refused but kept.
	d2 := storetest.Descriptor("seg", d1.Epoch, 2)
	if err := owner.Publish(ctx, d2); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Publish during outage = %v, want ErrUnavailable", err)
	}
	// A new process cannot start against a dead Consul.
	if s, err := consul.New(ctx, cfg); !errors.Is(err, segment.ErrUnavailable) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("New during outage = %v, want ErrUnavailable", err)
	}
	// Stay down past the session TTL, as a real outage would.
	time.Sleep(3 * time.Second)

	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Consul down for %v", time.Since(stopped).Round(time.Millisecond))
	restarted := time.Now()

	// The owner re-registers (new session, keys re-acquired) with its
	// latest descriptor; the reader and its watch see it.
	for {
		got, err := reader.Get(ctx, "seg")
		if err == nil && got.Version == 2 && got.Epoch == d1.Epoch {
			break
		}
		if time.Since(restarted) > 15*time.Second {
			t.Fatalf("not re-registered %v after Consul returned: %+v, %v", time.Since(restarted), got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("re-registered %v after Consul returned", time.Since(restarted).Round(time.Millisecond))
	if s := owner.Session(); s == "" || s == oldSession {
		t.Fatalf("owner session %q after re-registration, old %q", s, oldSession)
	}
	select {
	case d, ok := <-watch:
		if !ok {
			t.Fatal("watch closed during outage")
		}
		if d == nil {
			t.Fatal("watch reported the segment gone although its owner re-registered within the grace")
		}
		if d.Version != 2 {
			t.Fatalf("watch reported %+v, want version 2", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("watch did not report the re-registered segment")
	}
	select {
	case d := <-doomedWatch:
		if d != nil {
			t.Fatalf("doomed: watch reported %+v, want nil", d)
		}
		t.Logf("dead owner's segment reported gone %v after Consul returned", time.Since(restarted).Round(time.Millisecond))
	case <-time.After(2*cfg.SessionTTL + cfg.RequestTimeout + 10*time.Second):
		t.Fatal("dead owner's segment not reported gone")
	}
	deadline = time.Now().Add(10 * time.Second)
	for reader.Health() != nil || owner.Health() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("Health after recovery: reader %v, owner %v", reader.Health(), owner.Health())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := reader.Get(ctx, "never-seen"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("unknown segment after recovery = %v, want ErrNotFound", err)
	}
	// The re-registered key is live-bound again: Close removes it.
	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := reader.Get(ctx, "seg"); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("after owner Close = %v, want ErrNotFound", err)
	}
}
