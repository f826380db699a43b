package tcp

import (
	"slices"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
)

// TestLanes: both sides list their connections with cookies and addresses
// that match each other, the initiator's lanes name the peer, index and
// generation, and TCP_INFO counts the payload moved.
func TestLanes(t *testing.T) {
	p := newPair(t, 8<<20, 8<<20, Config{Lanes: 2})
	ctx := ctxT(t, 10*time.Second)
	fill(t, p.ini.buf())
	b, _ := p.ini.e.AllocateBatch(64)
	defer p.ini.e.FreeBatch(b)
	// 8 MiB in 1 MiB slices: two lanes' worth (laneShare).
	var reqs []engine.Request
	for off := 0; off < 8<<20; off += 1 << 20 {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: p.ini.buf()[off : off+1<<20], Target: p.seg, TargetAddr: p.tgt.base() + uint64(off)})
	}
	if err := p.ini.e.Submit(b, reqs); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.e.Wait(ctx, b); err != nil {
		t.Fatal(err)
	}
	ini, tgt := p.ini.tr.Lanes(), p.tgt.tr.Lanes()
	if len(ini) != 2 || len(tgt) != 2 {
		t.Fatalf("lanes: initiator %+v, target %+v: want 2 each", ini, tgt)
	}
	var idx []int
	var acked uint64
	for _, l := range ini {
		if l.Peer != "target" || l.Accepted || l.Gen == 0 || l.Cookie == 0 {
			t.Errorf("initiator lane %+v", l)
		}
		idx = append(idx, l.Index)
		acked += l.Info.BytesAcked
		i := slices.IndexFunc(tgt, func(a Lane) bool { return a.Remote == l.Local && a.Local == l.Remote })
		if i < 0 {
			t.Errorf("initiator lane %v->%v has no accepted side in %+v", l.Local, l.Remote, tgt)
			continue
		}
		a := tgt[i]
		if !a.Accepted || a.Index != -1 || a.Peer != "" || a.Cookie == 0 || a.Cookie == l.Cookie {
			t.Errorf("accepted side %+v of lane %+v", a, l)
		}
	}
	slices.Sort(idx)
	if !slices.Equal(idx, []int{0, 1}) {
		t.Errorf("lane indexes %v, want [0 1]", idx)
	}
	if acked < 8<<20 {
		t.Errorf("TCP_INFO bytes acked over both lanes %d < %d written", acked, 8<<20)
	}

	// Drop the target's connections: redialled lanes get new cookies and
	// generations.
	for _, c := range p.tgt.tr.gate.Conns() {
		c.Close()
	}
	for range 2 { // the first round may fail over to a fresh lane
		if err := p.ini.e.Submit(b, reqs[:1]); err != nil {
			t.Fatal(err)
		}
		if err := p.ini.e.Wait(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range p.ini.tr.Lanes() {
		for _, old := range ini {
			if l.Cookie == old.Cookie || (l.Index == old.Index && l.Gen <= old.Gen) {
				t.Errorf("lane %+v after a reconnect; before %+v", l, old)
			}
		}
	}
}
