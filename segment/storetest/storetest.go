// Package storetest is the conformance suite every segment.Store runs.
//
// A backend's test calls Run with a constructor for fresh stores; each store
// stands for one process. Backends differ in what they can see, so the
// suite asks for capabilities instead of assuming a central server:
//
//   - every store can publish, update, unpublish and Get its own segments
//     and those of another store it is told the name of;
//   - ListsAll: List enumerates segments published through other stores too
//     (a central store such as Consul); without it, List need only include
//     the store's own segments;
//   - Watch: Watch reports changes (all current backends);
//   - Conflicts: two stores publishing the same name is detected and the
//     second gets segment.ErrConflict (a shared namespace); stores whose
//     names are bound to their owner (p2p) cannot collide.
//
// The contract the suite checks, beyond the segment.Store doc comments:
//
//   - Get returns a copy: changing it never changes the store.
//   - Publish of an invalid descriptor fails with segment.ErrInvalid.
//   - Unpublish of a name the store never published fails with
//     segment.ErrNotFound.
//   - After the owner closes its store, Get from another store fails with
//     segment.ErrNotFound or segment.ErrUnavailable (a vanished owner may be
//     either), within the backend's Settle time.
//   - Watch's first report is the segment's state when Watch starts: its
//     descriptor, or nil when absent. Later reports differ from the previous
//     one in Epoch or Version or presence; intermediate versions may be
//     coalesced. The channel closes when ctx ends or the store is closed.
//   - After Close, every method fails with segment.ErrClosed; Close is
//     idempotent.
//   - A cancelled context makes Get fail with an error that wraps ctx.Err().
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/rdmago/te/segment"
)

// Option changes how Run treats a backend.
type Option func(*config)

type config struct {
	listsAll  bool
	watch     bool
	conflicts bool
	settle    time.Duration
	name      func(s segment.Store, i int) string
}

// ListsAll says List enumerates segments published through any store.
func ListsAll() Option { return func(c *config) { c.listsAll = true } }

// NoWatch says the backend does not implement Watch; the watch tests are
// skipped.
func NoWatch() Option { return func(c *config) { c.watch = false } }

// Conflicts says two stores publishing one name must conflict.
func Conflicts() Option { return func(c *config) { c.conflicts = true } }

// Settle bounds how long a change may take to become visible through
// another store or a Watch (default 10 s). It is a deadline for waiting, not
// a performance assertion.
func Settle(d time.Duration) Option { return func(c *config) { c.settle = d } }

// Names sets how segment names are made: name(s, i) is a name store s may
// publish as its i-th segment. Backends that bind names to their owner (p2p:
// the owner's address) must set it; the default is a random name shared by
// no other run.
func Names(name func(s segment.Store, i int) string) Option {
	return func(c *config) { c.name = name }
}

// Run runs the conformance suite. newStore must return a fresh, open store
// (a new process); the suite closes every store it makes. Tests that need a
// clean namespace make their own names, so stores may share a backend.
func Run(t *testing.T, newStore func(t *testing.T) segment.Store, opts ...Option) {
	c := &config{watch: true, settle: 10 * time.Second}
	for _, o := range opts {
		o(c)
	}
	if c.name == nil {
		run := randomWord()
		var mu sync.Mutex
		ids := map[segment.Store]int{}
		c.name = func(s segment.Store, i int) string {
			mu.Lock()
			id, ok := ids[s]
			if !ok {
				id = len(ids)
				ids[s] = id
			}
			mu.Unlock()
			return fmt.Sprintf("storetest-%s/store-%d/seg %d", run, id, i)
		}
	}
	h := &harness{cfg: c, newStore: newStore}
	t.Run("PublishGet", h.publishGet)
	t.Run("GetUnknown", h.getUnknown)
	t.Run("Update", h.update)
	t.Run("GetReturnsCopy", h.getReturnsCopy)
	t.Run("Unpublish", h.unpublish)
	t.Run("Invalid", h.invalid)
	t.Run("CloseRemoves", h.closeRemoves)
	t.Run("Closed", h.closed)
	t.Run("CancelledContext", h.cancelled)
	t.Run("List", h.list)
	t.Run("Concurrent", h.concurrent)
	t.Run("Watch", func(t *testing.T) {
		if !c.watch {
			t.Skip("backend does not implement Watch")
		}
		h.watch(t)
	})
	t.Run("WatchEndsOnClose", func(t *testing.T) {
		if !c.watch {
			t.Skip("backend does not implement Watch")
		}
		h.watchEndsOnClose(t)
	})
	t.Run("Conflict", func(t *testing.T) {
		if !c.conflicts {
			t.Skip("names are bound to their owner: no conflicts possible")
		}
		h.conflict(t)
	})
}

type harness struct {
	cfg      *config
	newStore func(t *testing.T) segment.Store
}

func randomWord() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return fmt.Sprintf("%016x", binary.LittleEndian.Uint64(b[:]))
}

// Descriptor returns a valid sample descriptor named name, with a nonzero
// epoch and the given version. Backends' own tests may use it.
func Descriptor(name string, epoch, version uint64) *segment.Descriptor {
	return &segment.Descriptor{
		Name: name, Epoch: epoch, Version: version,
		Protocols: []segment.Protocol{
			{Name: segment.ProtoTCP, Endpoint: "127.0.0.1:15002", TCP: &segment.TCP{Wire: 2,
				Extra: map[string]json.RawMessage{"lanes": json.RawMessage("4")}}},
			{Name: segment.ProtoRDMA, Endpoint: "127.0.0.1:15003", RDMA: &segment.RDMA{
				Devices: []segment.Device{{Name: "rxe0", Port: 1, GID: "fe80::1", MTU: 4096}},
				RKeys:   [][]uint32{{0x1000 + uint32(version)}, {0x2000}},
			}},
		},
		Buffers: []segment.Buffer{
			{Addr: 0x7f0000000000, Length: 1 << 20, Location: "cpu:0"},
			{Addr: 0x7f0000200000, Length: 64 << 10, Location: "cpu:0"},
		},
	}
}

func (h *harness) store(t *testing.T) segment.Store {
	t.Helper()
	s := h.newStore(t)
	t.Cleanup(func() { s.Close() })
	return s
}

func (h *harness) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), h.cfg.settle+20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls get on s until it returns want (or, with want nil, an
// error matched by gone), or fails the test after the settle time.
func (h *harness) eventually(t *testing.T, s segment.Store, name string, want *segment.Descriptor, gone ...error) {
	t.Helper()
	deadline := time.Now().Add(h.cfg.settle)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := s.Get(ctx, name)
		cancel()
		if want != nil && err == nil {
			diff := cmp.Diff(want, got)
			if diff == "" {
				return
			}
			last = "descriptor differs (-want +got):\n" + diff
		} else if want == nil && err != nil && slices.ContainsFunc(gone, func(e error) bool { return errors.Is(err, e) }) {
			return
		} else {
			last = fmt.Sprintf("Get = %v, %v", got, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get(%q) did not settle within %v: %s", name, h.cfg.settle, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) publishGet(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	d := Descriptor(h.cfg.name(owner, 0), 0xabc, 1)
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got, err := owner.Get(ctx, d.Name)
	if err != nil {
		t.Fatalf("owner Get: %v", err)
	}
	if diff := cmp.Diff(d, got); diff != "" {
		t.Fatalf("owner Get (-want +got):\n%s", diff)
	}
	h.eventually(t, reader, d.Name, d)
}

func (h *harness) getUnknown(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	name := h.cfg.name(owner, 7) // never published
	for _, s := range []segment.Store{owner, reader} {
		if d, err := s.Get(ctx, name); !errors.Is(err, segment.ErrNotFound) {
			t.Fatalf("Get(unpublished %q) = %v, %v; want ErrNotFound", name, d, err)
		}
	}
}

func (h *harness) update(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	name := h.cfg.name(owner, 0)
	for v := uint64(1); v <= 3; v++ {
		d := Descriptor(name, 0xabc, v)
		if err := owner.Publish(ctx, d); err != nil {
			t.Fatalf("Publish v%d: %v", v, err)
		}
		h.eventually(t, reader, name, d)
	}
	// A new epoch (the owner restarted its memory state) replaces it too.
	d := Descriptor(name, 0xdef, 1)
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish new epoch: %v", err)
	}
	h.eventually(t, reader, name, d)
}

func (h *harness) getReturnsCopy(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	d := Descriptor(h.cfg.name(owner, 0), 0xabc, 1)
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	want := d.Clone()
	d.Buffers[0].Length = 1 // the caller's copy is the caller's
	h.eventually(t, reader, want.Name, want)
	for _, s := range []segment.Store{owner, reader} {
		got, err := s.Get(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		got.Protocols[1].RDMA.RKeys[0][0] = 0
		got.Protocols[0].TCP.Extra["lanes"][0] = 'x'
		got.Name = "changed"
		again, err := s.Get(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, again); diff != "" {
			t.Fatalf("changing a returned descriptor changed the store (-want +got):\n%s", diff)
		}
	}
}

func (h *harness) unpublish(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	d := Descriptor(h.cfg.name(owner, 0), 0xabc, 1)
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	h.eventually(t, reader, d.Name, d)
	if err := owner.Unpublish(ctx, d.Name); err != nil {
		t.Fatalf("Unpublish: %v", err)
	}
	if got, err := owner.Get(ctx, d.Name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("owner Get after Unpublish = %v, %v; want ErrNotFound", got, err)
	}
	h.eventually(t, reader, d.Name, nil, segment.ErrNotFound)
	if err := owner.Unpublish(ctx, d.Name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("second Unpublish = %v, want ErrNotFound", err)
	}
	if err := reader.Unpublish(ctx, d.Name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("Unpublish by a store that never published = %v, want ErrNotFound", err)
	}
	// Publishing again after Unpublish works.
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish after Unpublish: %v", err)
	}
	h.eventually(t, reader, d.Name, d)
}

func (h *harness) invalid(t *testing.T) {
	ctx := h.ctx(t)
	s := h.store(t)
	name := h.cfg.name(s, 0)
	for what, d := range map[string]*segment.Descriptor{
		"nil":     nil,
		"no name": Descriptor("", 1, 1),
		"overlap": func() *segment.Descriptor {
			d := Descriptor(name, 1, 1)
			d.Buffers[1].Addr = d.Buffers[0].Addr + 8
			return d
		}(),
	} {
		if err := s.Publish(ctx, d); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("Publish(%s) = %v, want ErrInvalid", what, err)
		}
	}
	if d, err := s.Get(ctx, name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("an invalid descriptor was stored: Get = %v, %v", d, err)
	}
}

func (h *harness) closeRemoves(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	d := Descriptor(h.cfg.name(owner, 0), 0xabc, 1)
	if err := owner.Publish(ctx, d); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	h.eventually(t, reader, d.Name, d)
	if err := owner.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	h.eventually(t, reader, d.Name, nil, segment.ErrNotFound, segment.ErrUnavailable)
}

func (h *harness) closed(t *testing.T) {
	ctx := h.ctx(t)
	s := h.newStore(t)
	name := h.cfg.name(s, 0)
	if err := s.Publish(ctx, Descriptor(name, 1, 1)); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, segment.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", op, err)
		}
	}
	check("Publish", s.Publish(ctx, Descriptor(name, 1, 2)))
	check("Unpublish", s.Unpublish(ctx, name))
	_, err := s.Get(ctx, name)
	check("Get", err)
	_, err = s.List(ctx)
	check("List", err)
	if h.cfg.watch {
		_, err = s.Watch(ctx, name)
		check("Watch", err)
	}
}

func (h *harness) cancelled(t *testing.T) {
	owner, reader := h.store(t), h.store(t)
	name := h.cfg.name(owner, 0)
	if err := owner.Publish(h.ctx(t), Descriptor(name, 1, 1)); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if d, err := reader.Get(ctx, name); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with a cancelled context = %v, %v; want context.Canceled", d, err)
	}
	if err := owner.Publish(ctx, Descriptor(name, 1, 2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish with a cancelled context = %v; want context.Canceled", err)
	}
}

func (h *harness) list(t *testing.T) {
	ctx := h.ctx(t)
	a, b := h.store(t), h.store(t)
	var mine, theirs []*segment.Descriptor
	for i := range 2 {
		d := Descriptor(h.cfg.name(a, i), 0xa, uint64(i+1))
		if err := a.Publish(ctx, d); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		mine = append(mine, d)
	}
	d := Descriptor(h.cfg.name(b, 0), 0xb, 1)
	if err := b.Publish(ctx, d); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	theirs = append(theirs, d)
	want := mine
	if h.cfg.listsAll {
		want = append(slices.Clone(mine), theirs...)
		for _, d := range theirs {
			h.eventually(t, a, d.Name, d)
		}
	}
	got, err := a.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	byName := map[string]*segment.Descriptor{}
	for _, d := range got {
		if d == nil {
			t.Fatal("List returned a nil descriptor")
		}
		if _, dup := byName[d.Name]; dup {
			t.Fatalf("List returned %q twice", d.Name)
		}
		byName[d.Name] = d
	}
	for _, w := range want {
		if diff := cmp.Diff(w, byName[w.Name]); diff != "" {
			t.Errorf("List entry %q (-want +got):\n%s", w.Name, diff)
		}
	}
	// Unpublished segments leave the list.
	if err := a.Unpublish(ctx, mine[0].Name); err != nil {
		t.Fatal(err)
	}
	got, err = a.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, d := range got {
		if d.Name == mine[0].Name {
			t.Fatalf("List still has unpublished %q", d.Name)
		}
	}
}

func (h *harness) concurrent(t *testing.T) {
	ctx := h.ctx(t)
	owner, reader := h.store(t), h.store(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	const n = 4
	for i := range n {
		name := h.cfg.name(owner, i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for v := uint64(1); v <= 5; v++ {
				if err := owner.Publish(ctx, Descriptor(name, 0xc, v)); err != nil {
					errs <- fmt.Errorf("publish %s v%d: %w", name, v, err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 5 {
				d, err := reader.Get(ctx, name)
				switch {
				case errors.Is(err, segment.ErrNotFound):
				case err != nil:
					errs <- fmt.Errorf("get %s: %w", name, err)
					return
				case d.Name != name || d.Epoch != 0xc:
					errs <- fmt.Errorf("get %s returned %s epoch %#x", name, d.Name, d.Epoch)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range n {
		h.eventually(t, reader, h.cfg.name(owner, i), Descriptor(h.cfg.name(owner, i), 0xc, 5))
	}
}

// next receives one report from a watch channel, failing the test after the
// settle time or when the channel closes.
func (h *harness) next(t *testing.T, ch <-chan *segment.Descriptor) *segment.Descriptor {
	t.Helper()
	select {
	case d, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed early")
		}
		return d
	case <-time.After(h.cfg.settle):
		t.Fatalf("no watch report within %v", h.cfg.settle)
	}
	return nil
}

// await receives reports until one matches want (by epoch and version, or
// nil), tolerating coalesced intermediate versions but not going backwards.
func (h *harness) await(t *testing.T, ch <-chan *segment.Descriptor, want *segment.Descriptor) {
	t.Helper()
	for {
		got := h.next(t, ch)
		if want == nil {
			if got == nil {
				return
			}
			continue
		}
		if got != nil && got.Epoch == want.Epoch && got.Version == want.Version {
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("watch report (-want +got):\n%s", diff)
			}
			return
		}
		if got != nil && got.Epoch == want.Epoch && got.Version > want.Version {
			t.Fatalf("watch skipped past version %d to %d", want.Version, got.Version)
		}
	}
}

func (h *harness) watch(t *testing.T) {
	ctx := h.ctx(t)
	owner, watcher := h.store(t), h.store(t)
	name := h.cfg.name(owner, 0)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := watcher.Watch(wctx, name)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if d := h.next(t, ch); d != nil {
		t.Fatalf("first report for an absent segment = %+v, want nil", d)
	}
	d1 := Descriptor(name, 0xabc, 1)
	if err := owner.Publish(ctx, d1); err != nil {
		t.Fatal(err)
	}
	h.await(t, ch, d1)
	d2 := Descriptor(name, 0xabc, 2)
	if err := owner.Publish(ctx, d2); err != nil {
		t.Fatal(err)
	}
	h.await(t, ch, d2)
	if err := owner.Unpublish(ctx, name); err != nil {
		t.Fatal(err)
	}
	h.await(t, ch, nil)
	d3 := Descriptor(name, 0xdef, 1) // a restarted owner
	if err := owner.Publish(ctx, d3); err != nil {
		t.Fatal(err)
	}
	h.await(t, ch, d3)

	// A second watch starts with the current state.
	ch2, err := watcher.Watch(wctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := h.next(t, ch2); got == nil || got.Epoch != d3.Epoch || got.Version != d3.Version {
		t.Fatalf("first report of a new watch = %+v, want epoch %#x version %d", got, d3.Epoch, d3.Version)
	}

	cancel()
	for _, c := range []<-chan *segment.Descriptor{ch, ch2} {
		h.drainClosed(t, c)
	}
}

// drainClosed waits for a watch channel to be closed.
func (h *harness) drainClosed(t *testing.T, ch <-chan *segment.Descriptor) {
	t.Helper()
	timeout := time.After(h.cfg.settle)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("watch channel not closed within %v", h.cfg.settle)
		}
	}
}

func (h *harness) watchEndsOnClose(t *testing.T) {
	ctx := h.ctx(t)
	owner := h.store(t)
	watcher := h.newStore(t)
	name := h.cfg.name(owner, 0)
	if err := owner.Publish(ctx, Descriptor(name, 1, 1)); err != nil {
		t.Fatal(err)
	}
	ch, err := watcher.Watch(ctx, name)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := watcher.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	h.drainClosed(t, ch)
}

func (h *harness) conflict(t *testing.T) {
	ctx := h.ctx(t)
	a, b := h.store(t), h.store(t)
	name := h.cfg.name(a, 0)
	da := Descriptor(name, 0xa, 1)
	if err := a.Publish(ctx, da); err != nil {
		t.Fatalf("Publish by a: %v", err)
	}
	if err := b.Publish(ctx, Descriptor(name, 0xb, 1)); !errors.Is(err, segment.ErrConflict) {
		t.Fatalf("Publish of a name held by another store = %v, want ErrConflict", err)
	}
	if err := b.Unpublish(ctx, name); !errors.Is(err, segment.ErrNotFound) {
		t.Fatalf("Unpublish of another store's segment = %v, want ErrNotFound", err)
	}
	h.eventually(t, b, name, da)
	// The owner keeps updating it.
	da2 := Descriptor(name, 0xa, 2)
	if err := a.Publish(ctx, da2); err != nil {
		t.Fatalf("update by the owner after a conflict: %v", err)
	}
	h.eventually(t, b, name, da2)
	// Once the owner is gone, another store may take the name.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	h.eventually(t, b, name, nil, segment.ErrNotFound)
	db := Descriptor(name, 0xb, 1)
	if err := b.Publish(ctx, db); err != nil {
		t.Fatalf("Publish after the owner closed: %v", err)
	}
	h.eventually(t, b, name, db)
}
