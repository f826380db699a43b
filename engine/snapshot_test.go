package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/internal/testenv"
	"github.com/rdmago/te/tcp"
)

// holder is a fake transport that keeps every slice until the test
// moves it on (Posted, Done).
type holder struct {
	*fake
	in chan *driver.Slice
}

func (h holder) Driver() driver.Transport { return h }

func (h holder) Submit(ss []*driver.Slice) {
	for _, s := range ss {
		h.in <- s
	}
}

// A task reports the layer it has reached as its slice moves: queued when
// handed to the transport, posted after Posted, queued again when a
// transient failure retries it (with the retry's cause), completed at the
// end; Snapshot lists it with its age while in flight and counts its
// bytes, retry, latency and batch afterwards. The stuck-task log names
// the layer too.
func TestTaskLayers(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<20, &fake{name: "hold"})
	var log testenv.Buffer
	h := holder{fake: &fake{name: "hold"}, in: make(chan *driver.Slice, 16)}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st, StuckAfter: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}, 1<<20, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := e.SegmentDescriptor(seg)
	b, err := e.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: d.Buffers[0].Addr}}); err != nil {
		t.Fatal(err)
	}
	s := <-h.in
	layer := func(want engine.Layer) {
		t.Helper()
		ts, err := e.Status(b, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ts.Layer != want {
			t.Fatalf("task layer %v, want %v", ts.Layer, want)
		}
		bs, _ := e.BatchStatus(b)
		if bs.Layer != want {
			t.Fatalf("batch layer %v, want %v", bs.Layer, want)
		}
	}
	layer(engine.LayerQueued)
	s.Posted()
	layer(engine.LayerPosted)

	// Stuck: the log names the segment, transport and layer.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "task in flight longer") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	line := log.String()
	for _, want := range []string{"level=WARN", "segment=target", "transport=hold", "layer=posted", "posted=1", "queued=0"} {
		if !strings.Contains(line, want) {
			t.Fatalf("stuck-task log lacks %q:\n%s", want, line)
		}
	}
	if n := strings.Count(line, "task in flight longer"); n != 1 {
		t.Fatalf("stuck task logged %d times, want once:\n%s", n, line)
	}

	snap := e.Snapshot()
	if snap.TasksInFlight != 1 || len(snap.Tasks) != 1 {
		t.Fatalf("snapshot: %d tasks in flight, %d listed; want 1", snap.TasksInFlight, len(snap.Tasks))
	}
	tk := snap.Tasks[0]
	if tk.Segment != "target" || tk.Transport != "hold" || tk.Layer != engine.LayerPosted || tk.Posted != 1 || tk.Queued != 0 ||
		tk.Op != "WRITE" || tk.Length != 4096 || tk.Age < 50*time.Millisecond {
		t.Fatalf("snapshot task %+v", tk)
	}
	if len(snap.Segments) != 1 || snap.Segments[0].Name != "target" || snap.Segments[0].TasksInFlight != 1 ||
		fmt.Sprint(snap.Segments[0].Connected) != "[hold]" || fmt.Sprint(snap.Segments[0].Route) != "[hold]" {
		t.Fatalf("snapshot segments %+v", snap.Segments)
	}
	if len(snap.Transports) != 1 || snap.Transports[0].Name != "hold" || snap.Transports[0].TasksInFlight != 1 {
		t.Fatalf("snapshot transports %+v", snap.Transports)
	}
	js, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"layer":"posted"`) {
		t.Fatalf("snapshot JSON lacks the layer: %s", js)
	}
	var back engine.Snapshot
	if err := json.Unmarshal(js, &back); err != nil || back.Tasks[0].Layer != engine.LayerPosted {
		t.Fatalf("snapshot JSON does not read back: %v", err)
	}

	// A transient failure: retried, queued again, with its cause.
	s.Done(0, fmt.Errorf("link flap: %w", engine.ErrTransient))
	s = <-h.in
	layer(engine.LayerQueued)
	snap = e.Snapshot()
	if tk := snap.Tasks[0]; tk.Retries != 1 || tk.RetryCause != "connection" || tk.Layer != engine.LayerQueued {
		t.Fatalf("after a retry: %+v", tk)
	}
	s.Posted()
	s.Done(4096, nil)
	if err := e.Wait(ctxT(t, 5*time.Second), b); err != nil {
		t.Fatal(err)
	}
	layer(engine.LayerCompleted)

	snap = e.Snapshot()
	if snap.TasksInFlight != 0 || len(snap.Tasks) != 0 {
		t.Fatalf("after completion %d tasks in flight", snap.TasksInFlight)
	}
	if len(snap.Traffic) != 1 {
		t.Fatalf("traffic %+v", snap.Traffic)
	}
	if tr := snap.Traffic[0]; tr.Peer != "target" || tr.Protocol != "hold" || tr.WriteBytes != 4096 || tr.WriteSlices != 1 ||
		tr.ReadBytes != 0 || tr.FailedSlices != 0 || tr.Tasks != 1 {
		t.Fatalf("traffic %+v", tr)
	}
	if len(snap.Protocols) != 1 || snap.Protocols[0].Retries[engine.CauseConnection] != 1 || snap.Protocols[0].SliceLatency.Count != 1 {
		t.Fatalf("protocol stats %+v", snap.Protocols)
	}
	if snap.BatchLatency.Count != 1 || snap.BatchLatency.Sum < 0.05 {
		t.Fatalf("batch latency %+v, want one batch of at least 50ms", snap.BatchLatency)
	}
	if err := e.FreeBatch(b); err != nil {
		t.Fatal(err)
	}
}

// A slice that fails for good is counted by cause, and its task is
// FAILED at LayerFailed.
func TestFailureCause(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<20, &fake{name: "hold"})
	h := holder{fake: &fake{name: "hold"}, in: make(chan *driver.Slice, 16)}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st}, 1<<20, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := e.SegmentDescriptor(seg)
	b, _ := e.AllocateBatch(1)
	if err := e.Submit(b, []engine.Request{{Op: engine.Read, Local: ini.Mem.Bytes()[:4096], Target: seg, TargetAddr: d.Buffers[0].Addr}}); err != nil {
		t.Fatal(err)
	}
	(<-h.in).Done(0, fmt.Errorf("target said no: %w", engine.ErrOutOfRange))
	if err := e.Wait(ctxT(t, 5*time.Second), b); err == nil {
		t.Fatal("Wait: no error for a failed task")
	}
	ts, _ := e.Status(b, 0)
	if ts.State != engine.StateFailed || ts.Layer != engine.LayerFailed {
		t.Fatalf("status %+v", ts)
	}
	snap := e.Snapshot()
	if snap.Protocols[0].Failures[engine.CauseOutOfRange] != 1 || snap.Traffic[0].FailedSlices != 1 {
		t.Fatalf("failure not counted by cause: %+v %+v", snap.Protocols, snap.Traffic)
	}
	e.FreeBatch(b)
}

// Snapshots and the stuck-task scan run beside submitters that allocate,
// submit, wait and free batches over loopback TCP: nothing they read races
// with the data path (run with -race), and every snapshot is consistent
// (no task twice, none of a freed batch, ages not negative).
func TestSnapshotConcurrent(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	const workers, tasks, size = 4, 16, 4096
	enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, workers*tasks*size, tcp.New(tcp.Config{}))
	ini := enginetest.NewNode(t, engine.Config{Name: "initiator", Store: st, StuckAfter: time.Millisecond}, workers*tasks*size, tcp.New(tcp.Config{}))
	e := ini.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := e.SegmentDescriptor(seg)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		reqs := make([]engine.Request, tasks)
		for i := range reqs {
			off := (w*tasks + i) * size
			reqs[i] = engine.Request{Op: engine.Op(1 + i%2), Local: ini.Mem.Bytes()[off : off+size], Target: seg, TargetAddr: d.Buffers[0].Addr + uint64(off)}
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := e.Transfer(context.Background(), reqs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	snaps := 0
	for time.Now().Before(deadline) {
		s := e.Snapshot()
		seen := map[[2]uint64]bool{}
		for _, tk := range s.Tasks {
			k := [2]uint64{uint64(tk.Batch), uint64(tk.Index)}
			if seen[k] || tk.Age < 0 || tk.Segment != "target" || tk.Length != size {
				t.Fatalf("snapshot task %+v (seen before: %v)", tk, seen[k])
			}
			seen[k] = true
		}
		if _, err := json.Marshal(s); err != nil {
			t.Fatal(err)
		}
		snaps++
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	s := e.Snapshot()
	var moved uint64
	for _, tr := range s.Traffic {
		moved += tr.ReadBytes + tr.WriteBytes
	}
	if s.TasksInFlight != 0 || moved == 0 {
		t.Fatalf("after the submitters: %d tasks in flight, %d bytes counted", s.TasksInFlight, moved)
	}
	t.Logf("%d snapshots beside %d submitters; %d bytes moved", snaps, workers, moved)
}

// Failures are counted by the cause errors.Is finds, timeouts before the
// transient class they may also be in.
func TestCauses(t *testing.T) {
	st := enginetest.NewMemStore()
	t.Cleanup(func() { st.Close() })
	enginetest.NewNode(t, engine.Config{Name: "target", Store: st}, 1<<20, &fake{name: "hold"})
	h := holder{fake: &fake{name: "hold"}, in: make(chan *driver.Slice, 16)}
	ini := enginetest.NewNode(t, engine.Config{Name: "ini", Store: st, Retries: -1}, 1<<20, h)
	e := ini.Engine
	seg, err := e.OpenSegment(ctxT(t, 5*time.Second), "target", nil)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := e.SegmentDescriptor(seg)
	for _, c := range []struct {
		err  error
		want engine.Cause
	}{
		{fmt.Errorf("x: %w", engine.ErrPeerReset), engine.CausePeerReset},
		{tcp.ErrTimeout, engine.CauseTimeout},
		{fmt.Errorf("slice timeout: %w: %w", driver.ErrTimeout, driver.ErrTransient), engine.CauseTimeout},
		{fmt.Errorf("x: %w", engine.ErrOutOfRange), engine.CauseOutOfRange},
		{fmt.Errorf("x: %w", engine.ErrMemoryBusy), engine.CauseMemoryBusy},
		{tcp.ErrConnection, engine.CauseConnection},
		{fmt.Errorf("x: %w", engine.ErrClosed), engine.CauseClosed},
		{errors.New("remote access error"), engine.CauseOther},
	} {
		before := e.Snapshot()
		b, _ := e.AllocateBatch(1)
		if err := e.Submit(b, []engine.Request{{Op: engine.Write, Local: ini.Mem.Bytes()[:64], Target: seg, TargetAddr: d.Buffers[0].Addr}}); err != nil {
			t.Fatal(err)
		}
		(<-h.in).Done(0, c.err)
		e.Wait(ctxT(t, 5*time.Second), b)
		e.FreeBatch(b)
		after := e.Snapshot()
		for cause := range after.Protocols[0].Failures {
			var was uint64
			if len(before.Protocols) > 0 {
				was = before.Protocols[0].Failures[cause]
			}
			grew := after.Protocols[0].Failures[cause] - was
			if want := map[bool]uint64{true: 1}[engine.Cause(cause) == c.want]; grew != want {
				t.Errorf("%v: failures{%v} grew by %d, want %d", c.err, engine.Cause(cause), grew, want)
			}
		}
	}
}
