package tcp

import (
	"cmp"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// laneKey names a lane across peer incarnations: the remote segment's
// name and the lane's index.
type laneKey struct {
	peer string
	lane int
}

// laneCounters count one lane's traffic; the lane's reader and writer
// add to them, Inspect reads them. On the target side they count what an
// initiator's requests did (Failures: refused ranges).
type laneCounters struct {
	bytes    [3]atomic.Uint64 // completed slices' bytes, by driver.Op
	slices   [3]atomic.Uint64
	failures atomic.Uint64 // slices failed on the lane
	connects atomic.Uint64 // connections made
}

// counters returns the counters of lane i to the named peer, made on
// first use (when the peer is connected, not per request).
func (t *Transport) counters(peer string, i int) *laneCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.traffic == nil {
		t.traffic = map[laneKey]*laneCounters{}
	}
	k := laneKey{peer, i}
	c := t.traffic[k]
	if c == nil {
		c = &laneCounters{}
		t.traffic[k] = c
	}
	return c
}

// track starts counting an accepted connection's requests for the named
// initiator.
func (t *Transport) track(sc *sconn, peer string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sc.peer = peer
	if t.live == nil {
		t.live = map[*sconn]struct{}{}
		t.servedBy = map[string]*laneCounters{}
	}
	t.live[sc] = struct{}{}
	sc.ctr.connects.Store(1)
}

// untrackLocked adds an ending connection's counts to its initiator's
// totals; t.mu is held.
func (t *Transport) untrackLocked(sc *sconn) {
	if _, ok := t.live[sc]; !ok {
		return
	}
	delete(t.live, sc)
	tot := t.servedBy[sc.peer]
	if tot == nil {
		tot = &laneCounters{}
		t.servedBy[sc.peer] = tot
	}
	tot.add(&sc.ctr)
}

func (c *laneCounters) add(o *laneCounters) {
	for op := range c.bytes {
		c.bytes[op].Add(o.bytes[op].Load())
		c.slices[op].Add(o.slices[op].Load())
	}
	c.failures.Add(o.failures.Load())
	c.connects.Add(o.connects.Load())
}

func (c *laneCounters) traffic(peer, rail string) driver.PathTraffic {
	return driver.PathTraffic{Peer: peer, Rail: rail,
		ReadBytes: c.bytes[driver.Read].Load(), WriteBytes: c.bytes[driver.Write].Load(),
		ReadSlices: c.slices[driver.Read].Load(), WriteSlices: c.slices[driver.Write].Load(),
		Failures: c.failures.Load(), Connects: c.connects.Load()}
}

func laneName(i int) string { return "lane" + strconv.Itoa(i) }

// inspect lists every initiator lane with its queue depths and state, and
// the counters of every lane used since the transport started. It takes
// each lane's lock for a field copy only.
func (t *Transport) inspect() driver.TransportState {
	var st driver.TransportState
	t.mu.Lock()
	peers := make([]*peer, 0, len(t.peers))
	for p := range t.peers {
		peers = append(peers, p)
	}
	for k, c := range t.traffic {
		st.Traffic = append(st.Traffic, c.traffic(k.peer, laneName(k.lane)))
	}
	served := map[string]*laneCounters{}
	for peer, c := range t.servedBy {
		served[peer] = &laneCounters{}
		served[peer].add(c)
	}
	for sc := range t.live {
		if served[sc.peer] == nil {
			served[sc.peer] = &laneCounters{}
		}
		served[sc.peer].add(&sc.ctr)
	}
	t.mu.Unlock()
	for peer, c := range served {
		st.Served = append(st.Served, c.traffic(peer, ""))
	}
	slices.SortFunc(st.Served, func(a, b driver.PathTraffic) int { return cmp.Compare(a.Peer, b.Peer) })
	for _, p := range peers {
		for i, l := range p.lanes {
			ps := driver.PathState{Peer: p.name, Epoch: p.epoch, Rail: laneName(i), Remote: p.addr}
			l.mu.Lock()
			ps.Queued = int64(len(l.pending) + max(l.held, 0))
			ps.Posted = int64(l.ring.n)
			if l.reading {
				ps.Posted++
			}
			switch {
			case l.closed:
				ps.State = "closed"
			case l.dialing:
				ps.State = "dialing"
			case l.conn == nil:
				ps.State = "idle"
			case l.writing:
				ps.State = "writing"
			default:
				ps.State = "connected"
			}
			if l.failedErr != nil {
				ps.Err = l.failedErr.Error()
			}
			l.mu.Unlock()
			st.Paths = append(st.Paths, ps)
		}
	}
	slices.SortFunc(st.Paths, func(a, b driver.PathState) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Rail, b.Rail))
	})
	slices.SortFunc(st.Traffic, func(a, b driver.PathTraffic) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Rail, b.Rail))
	})
	return st
}
