package tcp

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
)

type node struct {
	e   *engine.Engine
	mem *engine.Memory
	tr  *Transport
}

func (n *node) buf() []byte  { return n.mem.Bytes() }
func (n *node) base() uint64 { return engine.AddrOf(n.mem.Bytes()) }

func newNode(t testing.TB, st *enginetest.MemStore, name string, memSize int, tc Config) *node {
	t.Helper()
	cfg := engine.Config{Name: name, MetadataTimeout: 2 * time.Second}
	if st != nil {
		cfg.Store = st
	}
	tr := New(tc)
	n := enginetest.NewNode(t, cfg, memSize, tr)
	return &node{e: n.Engine, mem: n.Mem, tr: tr}
}

type pair struct {
	st       *enginetest.MemStore
	ini, tgt *node
	seg      engine.SegmentID
}

func newPair(t testing.TB, iniMem, tgtMem int, tc Config) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &pair{st: st}
	p.tgt = newNode(t, st, "target", tgtMem, tc)
	p.ini = newNode(t, st, "initiator", iniMem, tc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	seg, err := p.ini.e.OpenSegment(ctx, "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.seg = seg
	return p
}

func fill(t testing.TB, b []byte) {
	t.Helper()
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

const testKey = "the tcp tests' cluster secret"

func testSecret(t testing.TB) *auth.Secret {
	t.Helper()
	s, err := auth.New([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
