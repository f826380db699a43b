package engine

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// Transport is a transport as a program holds it: what tcp.New, rdma.New
// and shm.New return, to hand to Install. Driver is how the engine reaches
// the transport's implementation of the contract in package engine/driver
// (after database/sql's driver.Connector); a program has no need to call
// it. A transport written against that contract alone becomes a Transport
// with Driver returning itself.
type Transport interface {
	Driver() driver.Transport
}

// Op is a transfer direction, seen from the initiator.
type Op = driver.Op

// Ops.
const (
	// Read copies from the target segment into local memory.
	Read = driver.Read
	// Write copies from local memory into the target segment.
	Write = driver.Write
)

// slice is the engine's side of a driver.Slice: the task it belongs to
// and room to resubmit it without allocating.
type slice struct {
	driver.Slice
	task   *task
	self   [1]*driver.Slice
	posted atomic.Bool // this submission called Posted
	timed  bool        // its latency is observed (latencySample)
}

// Posted counts the slice as posted in its task (driver.Completer).
func (s *slice) Posted() {
	if t := s.task; t != nil && !s.posted.Swap(true) {
		t.posted.Add(1)
	}
}

// Complete is the outcome of one submission of the slice (driver.Completer).
// An error wrapping ErrTransient resubmits it, from the caller's goroutine,
// up to Config.Retries times. It does not allocate on success.
func (s *slice) Complete(n uint64, err error) {
	t := s.task
	// Posted comes before Done on the transport's side: no race here,
	// and a plain load spares a locked exchange per slice never posted.
	if s.posted.Load() {
		s.posted.Store(false)
		t.posted.Add(-1)
	}
	e := t.b.e
	if err != nil {
		if t.slot >= 0 && s.Attempt() < e.cfg.Retries && !e.closed.Load() && !t.b.canceled.Load() && errors.Is(err, ErrTransient) {
			if tr := e.transports.Load().slots[t.slot]; tr != nil {
				c := causeOf(err)
				t.retries.Add(1)
				t.cause.Store(uint32(c))
				if t.stats != nil {
					t.stats.ps.retries[c].Add(1)
				}
				s.Bind(s, s.Attempt()+1)
				s.self[0] = &s.Slice
				tr.Submit(s.self[:])
				return
			}
		}
	}
	s.task = nil
	if ps := t.stats; ps != nil {
		if err != nil {
			ps.failures.Add(1)
			ps.ps.failures[causeOf(err)].Add(1)
		} else {
			ps.bytes[s.Op%3].Add(n)
			ps.slices[s.Op%3].Add(1)
		}
		if s.timed {
			ps.ps.latency.observe(e.now() - t.start)
		}
	}
	if err != nil {
		if e.closed.Load() && !errors.Is(err, ErrClosed) {
			// The engine's Close closes peers first; whatever error
			// they fail slices with, the cause is the Close.
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		t.setErr(err)
	}
	if n > 0 {
		t.transferred.Add(n)
	}
	// A task of one slice is finished by it (a retry does not get here).
	// nslices is read before done counts this slice: once it has, the
	// last slice may finish the task and its batch be freed and reused.
	if ns := t.nslices; ns == 1 || t.done.Add(1) == ns {
		t.finish()
	}
}

// CompleteAll is Complete(len(Local), nil) for each of ss, slices bound
// to the engine's completers (driver.DoneAll): the counters of a run of
// slices to one peer are added once, and the tasks they finish are
// released and counted down in runs (finishAll).
func (s *slice) CompleteAll(ss []*driver.Slice) { completeAll(ss, nil) }

// completeAll is CompleteAll; a note fold (non-nil) also counts its
// sending's success in the step of its tasks (driver.DoneAllNote).
func completeAll(ss []*driver.Slice, fold *note) {
	var (
		fin   [64]*task
		k     int
		ps    *peerStats
		op    Op
		start int64
		lat   int64
		bytes uint64
		n     uint64
		timed uint64 // of the n, those whose latency is observed
	)
	flush := func() {
		if n != 0 {
			ps.bytes[op%3].Add(bytes)
			ps.slices[op%3].Add(n)
			if timed != 0 {
				ps.ps.latency.observeN(lat, timed)
			}
		}
		bytes, n, timed = 0, 0, 0
	}
	var now int64
	for _, ds := range ss {
		c := ds.Take()
		sl, ok := c.(*slice)
		if !ok {
			c.Complete(uint64(len(ds.Local)), nil)
			continue
		}
		t := sl.task
		if sl.posted.Load() {
			sl.posted.Store(false)
			t.posted.Add(-1)
		}
		sl.task = nil
		size := uint64(len(sl.Local))
		if t.stats != nil {
			if t.stats != ps || sl.Op != op || t.start != start {
				flush()
				if now == 0 {
					now = t.b.e.now()
				}
				ps, op, start, lat = t.stats, sl.Op, t.start, now-t.start
			}
			bytes += size
			n++
			if sl.timed {
				timed++
			}
		}
		// A task of one slice moved its length (task.moved); one of
		// several counts each slice.
		ns := t.nslices
		if ns != 1 && size > 0 {
			t.transferred.Add(size)
		}
		if ns == 1 || t.done.Add(1) == ns { // as in Complete
			fin[k] = t
			if k++; k == len(fin) {
				finishAll(fin[:], nil)
				k = 0
			}
		}
	}
	flush()
	finishAll(fin[:k], fold)
}
