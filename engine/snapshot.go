package engine

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/rdmago/te/engine/driver"
)

// DefaultStuckAfter is Config.StuckAfter's default.
const DefaultStuckAfter = 30 * time.Second

// MaxSnapshotTasks bounds the in-flight tasks a Snapshot lists (the
// oldest); Snapshot.TasksInFlight counts them all.
const MaxSnapshotTasks = 1000

// Snapshot is the engine's state at one moment, for operators (te serve
// --admin serves it as JSON at /debug/te) and exporters (the metrics
// package reads its counters). Taking one does not wait on transfers,
// peers or transports' queues.
type Snapshot struct {
	Name  string    `json:"name"`
	Epoch uint64    `json:"epoch"`
	Time  time.Time `json:"time"`
	// Transports are the installed transports in preference order.
	Transports []TransportSnapshot `json:"transports"`
	// Segments are the opened remote segments.
	Segments []SegmentSnapshot `json:"segments"`
	// Tasks are the tasks in flight, oldest first, at most
	// MaxSnapshotTasks of TasksInFlight.
	Tasks         []TaskSnapshot `json:"tasks"`
	TasksInFlight int            `json:"tasks_in_flight"`
	// Traffic counts completed slices per peer and protocol, from the
	// engine's start (a peer's counters survive its restarts and the
	// segment's closing).
	Traffic []Traffic `json:"traffic"`
	// Protocols holds per-protocol retries, failures and slice latency.
	Protocols []ProtocolStats `json:"protocols"`
	// BatchLatency is the time from the Submit that found a batch idle
	// to the completion of its last task.
	BatchLatency Histogram `json:"batch_latency"`
}

// TransportSnapshot is one installed transport.
type TransportSnapshot struct {
	Name string `json:"name"`
	// TasksInFlight counts the tasks it carries now.
	TasksInFlight int64 `json:"tasks_in_flight"`
	// The transport's own view (rails, endpoints or lanes, per-path
	// counters), when it is a driver.Inspector.
	driver.TransportState
}

// SegmentSnapshot is one opened remote segment.
type SegmentSnapshot struct {
	ID      SegmentID `json:"id"`
	Name    string    `json:"name"`
	Epoch   uint64    `json:"epoch"`
	Version uint64    `json:"version"`
	// Gone is set when the store no longer has the segment.
	Gone bool `json:"gone,omitempty"`
	// DescriptorAge is how long ago the cached descriptor came from the
	// store (opening, a watch update, SyncSegment).
	DescriptorAge time.Duration `json:"descriptor_age_ns"`
	// Route is the transports requests use, in the order tried (as
	// SegmentTransports); Connected those with a connected Peer.
	Route     []string `json:"route"`
	Connected []string `json:"connected"`
	// TasksInFlight counts the tasks to the segment in flight.
	TasksInFlight int64 `json:"tasks_in_flight"`
}

// TaskSnapshot is one task in flight.
type TaskSnapshot struct {
	Batch     BatchID `json:"batch"`
	Index     int     `json:"index"`
	Segment   string  `json:"segment"`
	Transport string  `json:"transport"`
	Op        string  `json:"op"`
	Length    uint64  `json:"length"`
	// Layer is where the task waits; Slices its slices, Queued those not
	// yet posted or written, Posted those awaiting completion.
	Layer       Layer         `json:"layer"`
	Slices      int64         `json:"slices"`
	Queued      int64         `json:"queued"`
	Posted      int64         `json:"posted"`
	Transferred uint64        `json:"transferred"`
	Age         time.Duration `json:"age_ns"`
	// Retries counts the task's slice retries, RetryCause the last one's.
	Retries    int    `json:"retries,omitempty"`
	RetryCause string `json:"retry_cause,omitempty"`
}

// Traffic counts what one protocol carried to one peer.
type Traffic struct {
	Peer     string `json:"peer"`
	Protocol string `json:"protocol"`
	// ReadBytes, WriteBytes, ReadSlices, WriteSlices count completed
	// slices; FailedSlices those that failed (after retries); Tasks
	// finished tasks.
	ReadBytes    uint64 `json:"read_bytes"`
	WriteBytes   uint64 `json:"write_bytes"`
	ReadSlices   uint64 `json:"read_slices"`
	WriteSlices  uint64 `json:"write_slices"`
	FailedSlices uint64 `json:"failed_slices"`
	Tasks        uint64 `json:"tasks"`
}

// ProtocolStats counts one protocol's retries and failures by Cause, and
// its slices' latency from Submit to completion.
type ProtocolStats struct {
	Name string `json:"name"`
	// Retries and Failures are indexed by Cause.
	Retries      []uint64  `json:"retries"`
	Failures     []uint64  `json:"failures"`
	SliceLatency Histogram `json:"slice_latency"`
}

// Snapshot returns the engine's state: transports (and their rails,
// endpoints or lanes with queue depths), opened segments, tasks in flight
// with their layer and age, and the counters. It is safe at any time,
// after Close too.
func (e *Engine) Snapshot() Snapshot {
	now := e.now()
	snap := Snapshot{Name: e.cfg.Name, Epoch: e.epoch, Time: time.Now()}

	ts := e.transports.Load()
	for _, i := range ts.order {
		t := TransportSnapshot{Name: ts.names[i], TasksInFlight: ts.inflight[i].Load()}
		if in, ok := ts.slots[i].(driver.Inspector); ok {
			t.TransportState = in.Inspect()
		}
		snap.Transports = append(snap.Transports, t)
	}

	e.segs.mu.RLock()
	segs := make([]*remoteSegment, 0, len(e.segs.byID))
	for _, s := range e.segs.byID {
		segs = append(segs, s)
	}
	e.segs.mu.RUnlock()
	slices.SortFunc(segs, func(a, b *remoteSegment) int { return cmp.Compare(a.id, b.id) })
	for _, s := range segs {
		st := s.state.Load()
		ss := SegmentSnapshot{ID: s.id, Name: s.name, Epoch: st.desc.Epoch, Version: st.desc.Version, Gone: st.gone,
			DescriptorAge: time.Since(st.fetched), TasksInFlight: s.inflight.Load(), Connected: []string{}}
		ss.Route, _ = e.SegmentTransports(s.id)
		if ss.Route == nil {
			ss.Route = []string{}
		}
		for _, i := range ts.order {
			if st.peers[i].Load() != nil {
				ss.Connected = append(ss.Connected, ts.names[i])
			}
		}
		snap.Segments = append(snap.Segments, ss)
	}

	if snap.Segments == nil {
		snap.Segments = []SegmentSnapshot{}
	}
	if snap.Transports == nil {
		snap.Transports = []TransportSnapshot{}
	}
	snap.Tasks, snap.TasksInFlight = e.inflightTasks(now, MaxSnapshotTasks, 0)
	if snap.Tasks == nil {
		snap.Tasks = []TaskSnapshot{}
	}

	e.stats.mu.Lock()
	for _, p := range e.stats.peers {
		snap.Traffic = append(snap.Traffic, Traffic{Peer: p.peer, Protocol: p.proto,
			ReadBytes: p.bytes[Read].Load(), WriteBytes: p.bytes[Write].Load(),
			ReadSlices: p.slices[Read].Load(), WriteSlices: p.slices[Write].Load(),
			FailedSlices: p.failures.Load(), Tasks: p.tasks.Load()})
	}
	for _, p := range e.stats.protos {
		ps := ProtocolStats{Name: p.name, Retries: make([]uint64, numCauses), Failures: make([]uint64, numCauses),
			SliceLatency: p.latency.read()}
		for c := range numCauses {
			ps.Retries[c] = p.retries[c].Load()
			ps.Failures[c] = p.failures[c].Load()
		}
		snap.Protocols = append(snap.Protocols, ps)
	}
	e.stats.mu.Unlock()
	slices.SortFunc(snap.Traffic, func(a, b Traffic) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Protocol, b.Protocol))
	})
	slices.SortFunc(snap.Protocols, func(a, b ProtocolStats) int { return cmp.Compare(a.Name, b.Name) })
	if snap.Traffic == nil {
		snap.Traffic = []Traffic{}
	}
	if snap.Protocols == nil {
		snap.Protocols = []ProtocolStats{}
	}
	snap.BatchLatency = e.stats.batch.read()
	return snap
}

// inflightTasks lists up to max tasks in flight at least minAge old,
// oldest first, and counts all of them.
//
// Tasks are read under the batch table's read lock: FreeBatch resets a
// batch's tasks only under its write lock, and a task below the batch's
// submitted count has every field Submit wrote published by that count's
// store, so nothing here races with the data path.
func (e *Engine) inflightTasks(now int64, max int, minAge time.Duration) ([]TaskSnapshot, int) {
	var out []TaskSnapshot
	n := 0
	bt := &e.batches
	bt.mu.RLock()
	for _, b := range bt.slots {
		if b == nil || b.pending.Load() == 0 {
			continue
		}
		sub := int(b.submitted.Load())
		for i := range b.tasks[:sub] {
			t := &b.tasks[i]
			if t.get() != StatePending {
				continue
			}
			age := time.Duration(now - t.start)
			if age < minAge {
				continue
			}
			n++
			out = append(out, t.snapshot(b.id, i, age))
		}
	}
	bt.mu.RUnlock()
	slices.SortFunc(out, func(a, b TaskSnapshot) int { return cmp.Compare(b.Age, a.Age) })
	if len(out) > max {
		out = out[:max]
	}
	return out, n
}

func (t *task) snapshot(id BatchID, i int, age time.Duration) TaskSnapshot {
	ts := TaskSnapshot{Batch: id, Index: i, Segment: "(local)", Transport: t.tname, Op: t.op.String(),
		Length: uint64(len(t.local)), Slices: t.nslices, Transferred: t.moved(t.get()), Age: age,
		Retries: int(t.retries.Load())}
	if t.seg != nil {
		ts.Segment = t.seg.name
	}
	ts.Layer = t.layer()
	ts.Posted = t.posted.Load()
	ts.Queued = max(t.left()-ts.Posted, 0)
	if ts.Retries > 0 {
		ts.RetryCause = Cause(t.cause.Load()).String()
	}
	return ts
}

// watchStuck logs each task in flight longer than Config.StuckAfter, once,
// with its layer and its transport's paths to the peer.
func (e *Engine) watchStuck() {
	defer e.wg.Done()
	tick := min(max(e.cfg.StuckAfter/4, 10*time.Millisecond), 5*time.Second)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-tk.C:
		}
		e.logStuck()
	}
}

// logStuck logs the tasks that have just passed Config.StuckAfter.
func (e *Engine) logStuck() {
	now := e.now()
	limit := int64(e.cfg.StuckAfter)
	type stuck struct {
		t    TaskSnapshot
		slot int
	}
	var found []stuck
	var more [LayerFailed + 1]int // beyond the first 16, by layer
	bt := &e.batches
	bt.mu.RLock()
	for _, b := range bt.slots {
		if b == nil || b.pending.Load() == 0 {
			continue
		}
		sub := int(b.submitted.Load())
		for i := range b.tasks[:sub] {
			t := &b.tasks[i]
			if t.get() != StatePending || now-t.start < limit || t.logged.Load() {
				continue
			}
			t.logged.Store(true)
			if len(found) == 16 {
				more[t.layer()]++
				continue
			}
			found = append(found, stuck{t.snapshot(b.id, i, time.Duration(now-t.start)), t.slot})
		}
	}
	bt.mu.RUnlock()
	if len(found) == 0 {
		return
	}
	ts := e.transports.Load()
	states := map[int]driver.TransportState{}
	for _, f := range found {
		args := []any{"segment", f.t.Segment, "transport", f.t.Transport, "layer", f.t.Layer.String(),
			"age", f.t.Age.Round(time.Millisecond), "op", f.t.Op, "bytes", f.t.Length,
			"slices", f.t.Slices, "queued", f.t.Queued, "posted", f.t.Posted,
			"batch", fmt.Sprintf("%#x", uint64(f.t.Batch)), "task", f.t.Index}
		if f.t.Retries > 0 {
			args = append(args, "retries", f.t.Retries, "retry_cause", f.t.RetryCause)
		}
		if f.slot >= 0 && f.slot < maxTransports {
			st, ok := states[f.slot]
			if !ok {
				if in, isIn := ts.slots[f.slot].(driver.Inspector); isIn {
					st = in.Inspect()
				}
				states[f.slot] = st
			}
			if paths := pathsTo(st.Paths, f.t.Segment); paths != "" {
				args = append(args, "paths", paths)
			}
		}
		e.log.Warn("engine: task in flight longer than Config.StuckAfter", args...)
	}
	if n := more[LayerQueued] + more[LayerPosted]; n > 0 {
		e.log.Warn("engine: more tasks in flight longer than Config.StuckAfter", "count", n,
			"queued", more[LayerQueued], "posted", more[LayerPosted])
	}
}

// pathsTo describes the paths to peer in one line: rail or lane, state,
// queued and posted slices, and the last failure.
func pathsTo(ps []driver.PathState, peer string) string {
	var out []byte
	for _, p := range ps {
		if p.Peer != peer {
			continue
		}
		if len(out) > 0 {
			out = append(out, "; "...)
		}
		out = fmt.Appendf(out, "%s %s queued=%d posted=%d", p.Rail, p.State, p.Queued, p.Posted)
		if p.Err != "" {
			out = fmt.Appendf(out, " err=%q", p.Err)
		}
	}
	return string(out)
}
