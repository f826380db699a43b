package ebpf

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/tcp"
)

type lanePair struct {
	ini, tgt *enginetest.Node
	iniTr    *tcp.Transport
	tgtTr    *tcp.Transport
	seg      engine.SegmentID
}

// newLanePair is an initiator and a target engine over the TCP transport
// with two lanes, in this process.
func newLanePair(t *testing.T, mem int) *lanePair {
	t.Helper()
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	p := &lanePair{iniTr: tcp.New(tcp.Config{Lanes: 2}), tgtTr: tcp.New(tcp.Config{Lanes: 2})}
	p.tgt = enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, mem, p.tgtTr)
	p.ini = enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st}, mem, p.iniTr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if p.seg, err = p.ini.Engine.OpenSegment(ctx, "target", nil); err != nil {
		t.Fatal(err)
	}
	return p
}

// writes are mem bytes of 1 MiB WRITEs: enough for both lanes.
func (p *lanePair) writes() []engine.Request {
	var reqs []engine.Request
	b := p.ini.Mem.Bytes()
	for off := 0; off+1<<20 <= len(b); off += 1 << 20 {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: b[off : off+1<<20], Target: p.seg,
			TargetAddr: engine.AddrOf(p.tgt.Mem.Bytes()) + uint64(off)})
	}
	return reqs
}

// TestLaneKilled: the tracer follows the transport's lanes by cookie
// (tcp.Transport.Lanes), sees their bytes move, and when the target dies
// mid-transfer reports each lane's state change as an event and in the
// next snapshot.
func TestLaneKilled(t *testing.T) {
	p := newLanePair(t, 16<<20)
	reqs := p.writes()
	ctx := context.Background()
	if err := p.ini.Engine.Transfer(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	lanes := p.iniTr.Lanes()
	if len(lanes) != 2 {
		t.Fatalf("lanes %+v, want 2", lanes)
	}
	var cookies []uint64
	for _, l := range lanes {
		cookies = append(cookies, l.Cookie)
	}
	tr := open(t, Filter{Cookies: cookies})
	before, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 2 {
		t.Fatalf("traced %+v, want the two lanes only", before)
	}
	for _, l := range lanes {
		i := slices.IndexFunc(before, func(c Conn) bool { return c.Cookie == l.Cookie })
		if i < 0 || before[i].Local != l.Local || before[i].Remote != l.Remote || before[i].BytesAcked < l.Info.BytesAcked {
			t.Fatalf("lane %+v traced as %+v", l, before)
		}
	}

	// Keep transferring until the target is gone.
	stop := make(chan error, 1)
	go func() {
		for {
			if err := p.ini.Engine.Transfer(ctx, reqs); err != nil {
				stop <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	mid, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var moved uint64
	for i := range mid {
		moved += mid[i].BytesAcked - before[i].BytesAcked
	}
	if moved == 0 {
		t.Fatalf("no bytes moved on the lanes: %+v then %+v", before, mid)
	}
	if err := p.tgt.Engine.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-stop; !errors.Is(err, engine.ErrTransient) && !errors.Is(err, engine.ErrClosed) && !errors.Is(err, tcp.ErrConnection) {
		t.Logf("transfer ended with %v", err)
	}

	changed := map[uint64]Event{}
	timeout := time.After(15 * time.Second)
	for len(changed) < 2 {
		select {
		case e := <-tr.Events():
			if e.Kind == StateChange && e.Old == Established && slices.Contains(cookies, e.Cookie) {
				changed[e.Cookie] = e
			}
		case <-timeout:
			t.Fatalf("state changes of the killed lanes: %v", changed)
		}
	}
	for _, e := range changed {
		if e.New != CloseWait && e.New != Close && e.New != FinWait1 {
			t.Errorf("lane event %v: want ESTABLISHED -> CLOSE_WAIT, CLOSE or FIN_WAIT1", e)
		}
	}
	after, err := tr.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range after {
		if !slices.Contains(cookies, c.Cookie) || c.State == Established || c.StateChanges == 0 {
			t.Errorf("after the kill: %+v", c)
		}
	}
	t.Logf("moved %d bytes in 100 ms; events %v", moved, changed)
}
