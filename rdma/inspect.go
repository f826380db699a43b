package rdma

import (
	"cmp"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/rdmago/te/engine/driver"
)

// railKey names the path from one local rail to a peer across the peer's
// incarnations and endpoints: the remote segment's name and the rail.
type railKey struct {
	peer string
	rail int
}

// railCounters count one peer's traffic on one local rail; the rail's
// owner adds to them, Inspect reads them.
type railCounters struct {
	bytes    [3]atomic.Uint64 // completed slices' bytes, by driver.Op
	slices   [3]atomic.Uint64
	failures atomic.Uint64 // slices failed
	connects atomic.Uint64 // endpoints connected
}

// counters returns the counters of the named peer on local rail i, made
// on first use (when an endpoint is made, not per request).
func (t *Transport) counters(peer string, i int) *railCounters {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.traffic == nil {
		t.traffic = map[railKey]*railCounters{}
	}
	k := railKey{peer, i}
	c := t.traffic[k]
	if c == nil {
		c = &railCounters{}
		t.traffic[k] = c
	}
	return c
}

var epStates = [...]string{epConnecting: "connecting", epReady: "ready", epBroken: "broken", epFailed: "failed", epClosed: "closed"}

func epStateName(st int32) string {
	if st >= 0 && int(st) < len(epStates) {
		return epStates[st]
	}
	return "state" + strconv.Itoa(int(st))
}

// inspect lists the rails with their queue depths, every endpoint with
// its state, and the per-peer, per-rail counters. It reads atomics and
// takes the transport's lock; it never waits on a rail's owner.
func (t *Transport) inspect() driver.TransportState {
	var st driver.TransportState
	for _, r := range t.rails {
		st.Rails = append(st.Rails, driver.RailState{Name: r.name, Up: r.up.Load(), OutstandingBytes: r.outstanding.Load(),
			Attrs: map[string]string{
				"port": strconv.Itoa(int(r.port.Num)), "gid": r.port.GID.GID.String(), "gid_index": strconv.Itoa(r.port.GID.Index),
				"netdev": r.port.GID.Netdev, "mtu": strconv.Itoa(r.port.Attr.ActiveMTU.Bytes()),
				"rate_bytes_per_s": strconv.FormatUint(r.rate.Load(), 10),
			}})
	}
	t.mu.Lock()
	peers := make([]*peer, 0, len(t.peers))
	for p := range t.peers {
		peers = append(peers, p)
	}
	for k, c := range t.traffic {
		name := strconv.Itoa(k.rail)
		if k.rail < len(t.rails) {
			name = t.rails[k.rail].name
		}
		st.Traffic = append(st.Traffic, driver.PathTraffic{Peer: k.peer, Rail: name,
			ReadBytes: c.bytes[driver.Read].Load(), WriteBytes: c.bytes[driver.Write].Load(),
			ReadSlices: c.slices[driver.Read].Load(), WriteSlices: c.slices[driver.Write].Load(),
			Failures: c.failures.Load(), Connects: c.connects.Load()})
	}
	t.mu.Unlock()
	for _, p := range peers {
		for i := range p.eps {
			ep := p.eps[i].Load()
			if ep == nil {
				continue
			}
			posted := ep.posted.Load()
			queued := max(ep.busy.Load()-posted, 0)
			ps := driver.PathState{Peer: p.name, Epoch: p.epoch, Rail: ep.r.name, Remote: "rail" + strconv.Itoa(ep.rrail),
				State: epStateName(ep.state.Load()), Queued: queued, Posted: posted}
			if f := ep.fail.Load(); f != nil {
				ps.Err = (*f).Error()
			}
			st.Paths = append(st.Paths, ps)
			if ep.r.idx < len(st.Rails) {
				st.Rails[ep.r.idx].Queued += queued
				st.Rails[ep.r.idx].Posted += posted
			}
		}
	}
	slices.SortFunc(st.Paths, func(a, b driver.PathState) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Rail, b.Rail), cmp.Compare(a.Remote, b.Remote))
	})
	slices.SortFunc(st.Traffic, func(a, b driver.PathTraffic) int {
		return cmp.Or(cmp.Compare(a.Peer, b.Peer), cmp.Compare(a.Rail, b.Rail))
	})
	return st
}
