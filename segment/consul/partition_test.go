package consul_test

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/consul"
	"github.com/rdmago/te/segment/storetest"
)

// proxy forwards TCP to Consul and can cut the link (refusing new
// connections and dropping open ones) and restore it on the same port: a
// network partition between one store and a Consul that keeps its state.
type proxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln {
				// cut ran while this connection was being set up: it
				// closed the conns it knew, so this pair is closed here
				// (left open, its pipes would hold cut's Wait for ever).
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.conns[c], p.conns[u] = struct{}{}, struct{}{}
			p.wg.Add(2)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(u, c)
			go pipe(c, u)
		}
	}()
}

func (p *proxy) cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) restore() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
	}
	p.mu.Lock()
	p.serve(ln)
	p.mu.Unlock()
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) time.Duration {
	t.Helper()
	t0 := time.Now()
	for !ok() {
		if time.Since(t0) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(t0)
}

// A partition shorter than the TTL: the session survives; writes made
// during it are applied when the link returns, without re-registering.
func TestShortPartition(t *testing.T) {
	a := agent(t)
	px := newProxy(t, a.Addr())
	ctx := ctxT(t, time.Minute)
	p := prefix(t)
	owner := open(t, consul.Config{Address: px.addr, Prefix: p, SessionTTL: 10 * time.Second, RequestTimeout: time.Second})
	reader := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	for _, n := range []string{"kept", "dropped"} {
		if err := owner.Publish(ctx, storetest.Descriptor(n, 1, 1)); err != nil {
			t.Fatal(err)
		}
	}
	sid := owner.Session()

	px.cut()
	if err := owner.Publish(ctx, storetest.Descriptor("kept", 1, 2)); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Publish during partition = %v, want ErrUnavailable", err)
	}
	if err := owner.Unpublish(ctx, "dropped"); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Unpublish during partition = %v, want ErrUnavailable", err)
	}
	if err := owner.Publish(ctx, storetest.Descriptor("new", 1, 1)); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Publish of a new segment during partition = %v, want ErrUnavailable", err)
	}
	// The owner's segments are still there for everyone else.
	if d, err := reader.Get(ctx, "dropped"); err != nil || d.Version != 1 {
		t.Fatalf("reader during partition: %+v, %v", d, err)
	}
	px.restore()

	d := waitFor(t, "pending writes applied", 15*time.Second, func() bool {
		k, err1 := reader.Get(ctx, "kept")
		_, err2 := reader.Get(ctx, "dropped")
		n, err3 := reader.Get(ctx, "new")
		return err1 == nil && k.Version == 2 && errors.Is(err2, segment.ErrNotFound) && err3 == nil && n.Version == 1
	})
	t.Logf("pending writes applied %v after the link returned", d.Round(time.Millisecond))
	if owner.Session() != sid {
		t.Fatalf("session changed from %s to %s over a short partition", sid, owner.Session())
	}
	waitFor(t, "health restored", 10*time.Second, func() bool { return owner.Health() == nil })
}

// A partition longer than the TTL: Consul (still running) expires the
// owner's session and deletes its segments, as for a dead process; when the
// link returns the owner re-registers them.
func TestLongPartition(t *testing.T) {
	a := agent(t)
	px := newProxy(t, a.Addr())
	ctx := ctxT(t, time.Minute)
	p := prefix(t)
	owner := open(t, consul.Config{Address: px.addr, Prefix: p, SessionTTL: time.Second, RequestTimeout: time.Second})
	reader := open(t, consul.Config{Address: a.Addr(), Prefix: p})
	if err := owner.Publish(ctx, storetest.Descriptor("seg", 0, 1)); err != nil {
		t.Fatal(err)
	}
	sid := owner.Session()
	watch, err := reader.Watch(ctx, "seg")
	if err != nil {
		t.Fatal(err)
	}
	if d := <-watch; d == nil {
		t.Fatal("first report nil")
	}

	px.cut()
	cut := time.Now()
	// Consul has not failed, so the reader's watch reports the expiry.
	select {
	case d := <-watch:
		if d != nil {
			t.Fatalf("watch reported %+v, want nil", d)
		}
	case <-time.After(2*time.Second + 5*time.Second):
		t.Fatal("partitioned owner's segment did not expire")
	}
	t.Logf("partitioned owner's segment expired %v after the cut (TTL 1s)", time.Since(cut).Round(time.Millisecond))
	// The owner still serves its own segment from its cache meanwhile.
	if d, err := owner.Get(ctx, "seg"); err != nil || d.Version != 1 {
		t.Fatalf("owner's cached Get during partition = %+v, %v", d, err)
	}

	px.restore()
	select {
	case d := <-watch:
		if d == nil || d.Epoch != owner.Epoch() || d.Version != 1 {
			t.Fatalf("after the link returned: watch reported %+v", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("owner did not re-register")
	}
	if s := owner.Session(); s == "" || s == sid {
		t.Fatalf("session %q after re-registration, was %q", s, sid)
	}
}
