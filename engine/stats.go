package engine

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

//go:generate go tool stringer -linecomment -type Layer,Cause -output layer_string.go

// Layer is how far a task has gone on its way to the peer: the last layer
// every one of its slices has reached. A task that stays long in one
// layer waits there: LayerQueued on this process (a transport's queue, a
// connection being made), LayerPosted on the network or the peer.
type Layer uint8

// Layers, in the order a task passes them.
const (
	// LayerNone: no such task, or not submitted yet.
	LayerNone Layer = iota // none
	// LayerQueued: handed to its transport, and at least one slice is
	// not yet posted or written (waiting in a rail's or lane's queue, for
	// an endpoint's handshake, for send credits, for a connection).
	LayerQueued // queued
	// LayerPosted: every unfinished slice is posted to the NIC or written
	// to its connection; the task waits for completions or replies.
	LayerPosted // posted
	// LayerCompleted: every slice succeeded.
	LayerCompleted // completed
	// LayerFailed: finished with a slice failed, or cancelled.
	LayerFailed // failed
)

// MarshalText is the layer's name, for JSON.
func (l Layer) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a layer's name.
func (l *Layer) UnmarshalText(b []byte) error {
	for x := LayerNone; x <= LayerFailed; x++ {
		if x.String() == string(b) {
			*l = x
			return nil
		}
	}
	return fmt.Errorf("engine: unknown layer %q", b)
}

// behind reports whether a task at l is less advanced than one at m, a
// failed task counting as further than a pending one and less far than a
// completed one (a batch is as far as its least advanced task).
func (l Layer) behind(m Layer) bool {
	rank := func(l Layer) int {
		if l == LayerFailed {
			return int(LayerPosted) + 1
		}
		if l == LayerCompleted {
			return int(LayerPosted) + 2
		}
		return int(l)
	}
	return rank(l) < rank(m)
}

// Cause is why a slice was retried or failed, as the engine classifies its
// error (errors.Is against the driver's errors, in this order).
type Cause uint8

// Causes.
const (
	// CauseNone: no failure.
	CauseNone Cause = iota // none
	// CauseClosed: the engine or the transport was closed (ErrClosed).
	CauseClosed // closed
	// CausePeerReset: the peer restarted or went away (ErrPeerReset).
	CausePeerReset // peer_reset
	// CauseTimeout: no answer in time (driver.ErrTimeout).
	CauseTimeout // timeout
	// CauseOutOfRange: the target refused the range (ErrOutOfRange).
	CauseOutOfRange // out_of_range
	// CauseMemoryBusy: the target's memory was being unregistered.
	CauseMemoryBusy // memory_busy
	// CauseConnection: a connection or endpoint broke (ErrTransient).
	CauseConnection // connection
	// CauseOther: anything else (a protocol violation, a remote access
	// error, a refused handshake).
	CauseOther // other
	numCauses
)

// Causes lists every Cause but CauseNone, for exporters.
func Causes() []Cause {
	out := make([]Cause, 0, numCauses-1)
	for c := CauseClosed; c < numCauses; c++ {
		out = append(out, c)
	}
	return out
}

// causeOf classifies a slice error. It does not allocate.
func causeOf(err error) Cause {
	switch {
	case err == nil:
		return CauseNone
	case errors.Is(err, ErrClosed):
		return CauseClosed
	case errors.Is(err, ErrPeerReset):
		return CausePeerReset
	case errors.Is(err, driver.ErrTimeout):
		return CauseTimeout
	case errors.Is(err, ErrOutOfRange):
		return CauseOutOfRange
	case errors.Is(err, ErrMemoryBusy):
		return CauseMemoryBusy
	case errors.Is(err, ErrTransient):
		return CauseConnection
	}
	return CauseOther
}

// latencySample: the latency of one slice in this many of a batch is
// observed (the first, then every latencySample-th). Reading the clock is
// the dearest part of counting, several times the rest together on some
// virtual machines; a sample keeps the distribution, slices_total keeps
// the count.
const latencySample = 8

// histBounds is the number of finite latency buckets: bucket k holds
// durations below 2^k µs, k = 0..histBounds-1 (1 µs to about 16.8 s);
// one more bucket holds the rest.
const histBounds = 25

// hist is a latency histogram of atomic counters: observing costs two
// atomic adds and no allocation.
type hist struct {
	counts [histBounds + 1]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

func (h *hist) observe(ns int64) {
	if ns < 0 {
		ns = 0
	}
	k := bits.Len64(uint64(ns) / 1000)
	if k > histBounds {
		k = histBounds
	}
	h.counts[k].Add(1)
	h.sum.Add(ns)
}

// observeN records n observations of ns at once.
func (h *hist) observeN(ns int64, n uint64) {
	if ns < 0 {
		ns = 0
	}
	k := bits.Len64(uint64(ns) / 1000)
	if k > histBounds {
		k = histBounds
	}
	h.counts[k].Add(n)
	h.sum.Add(ns * int64(n))
}

// Histogram is a latency distribution, in the form Prometheus exports.
type Histogram struct {
	// Bounds are the buckets' upper bounds in seconds, ascending.
	// Counts[i] counts observations in bucket i (not cumulative): at most
	// Bounds[i] and above Bounds[i-1]; Counts[len(Bounds)] those above
	// the last bound.
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	// Count is the number of observations, Sum their total in seconds.
	Count uint64  `json:"count"`
	Sum   float64 `json:"sum"`
}

func (h *hist) read() Histogram {
	out := Histogram{Bounds: make([]float64, histBounds), Counts: make([]uint64, histBounds+1)}
	for k := range out.Bounds {
		out.Bounds[k] = float64(uint64(1)<<k) * 1e-6
	}
	for k := range h.counts {
		out.Counts[k] = h.counts[k].Load()
		out.Count += out.Counts[k]
	}
	out.Sum = float64(h.sum.Load()) / 1e9
	return out
}

// peerStats counts the slices of one protocol to one peer (by name: it
// outlives the peer's incarnations and the segment's opening).
type peerStats struct {
	peer, proto string
	bytes       [3]atomic.Uint64 // by Op
	slices      [3]atomic.Uint64
	failures    atomic.Uint64
	tasks       atomic.Uint64
	ps          *protoStats
}

// protoStats counts what happened to one protocol's slices.
type protoStats struct {
	name     string
	latency  hist // slices, from Submit to their completion
	retries  [numCauses]atomic.Uint64
	failures [numCauses]atomic.Uint64
}

// statTable holds the engine's counters. Entries are made when a
// transport first connects to a peer, never on the data path, and kept.
type statTable struct {
	mu     sync.Mutex
	peers  map[[2]string]*peerStats
	protos map[string]*protoStats
	batch  hist // batches, from the Submit that found them idle to their last completion
}

func (st *statTable) peer(peer, proto string) *peerStats {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.peers == nil {
		st.peers = map[[2]string]*peerStats{}
		st.protos = map[string]*protoStats{}
	}
	k := [2]string{peer, proto}
	if p := st.peers[k]; p != nil {
		return p
	}
	ps := st.protos[proto]
	if ps == nil {
		ps = &protoStats{name: proto}
		st.protos[proto] = ps
	}
	p := &peerStats{peer: peer, proto: proto, ps: ps}
	st.peers[k] = p
	return p
}
