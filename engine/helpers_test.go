package engine_test

import (
	"context"
	"crypto/rand"
	"hash/crc64"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

type node struct {
	e   *engine.Engine
	mem *engine.Memory
	tr  *tcp.Transport
}

func (n *node) buf() []byte  { return n.mem.Bytes() }
func (n *node) base() uint64 { return addr(n.mem.Bytes()) }

// newNode starts an engine named name with a tcp transport and memSize
// bytes of registered memory (none if 0).
func newNode(t testing.TB, st *enginetest.MemStore, name string, memSize int, tc tcp.Config) *node {
	t.Helper()
	cfg := engine.Config{Name: name, MetadataTimeout: 2 * time.Second}
	if st != nil {
		cfg.Store = st
	}
	tr := tcp.New(tc)
	n := enginetest.NewNode(t, cfg, memSize, tr)
	return &node{e: n.Engine, mem: n.Mem, tr: tr}
}

func addr(b []byte) uint64 { return engine.AddrOf(b) }

func fill(t testing.TB, b []byte) {
	t.Helper()
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
}

var crcTab = crc64.MakeTable(crc64.ECMA)

func sum(b []byte) uint64 { return crc64.Checksum(b, crcTab) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pair is an initiator and a target sharing a store, with the target
// opened by the initiator.
type pair struct {
	st       *enginetest.MemStore
	ini, tgt *node
	seg      engine.SegmentID
}

func newPair(t testing.TB, iniMem, tgtMem int, tc tcp.Config) *pair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &pair{st: st}
	p.tgt = newNode(t, st, "target", tgtMem, tc)
	p.ini = newNode(t, st, "initiator", iniMem, tc)
	seg, err := p.ini.e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.seg = seg
	return p
}
