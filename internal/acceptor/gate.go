package acceptor

import (
	"sync"
	"sync/atomic"
	"time"
)

// Gate is the one admission policy of te's servers: at most max
// connections in all and perSource from one source (an IP address, a
// process). At a bound, the connection that has waited longest for its
// peer makes room for the new one: the longest-waiting of the same
// source at the per-source bound, else the longest-waiting of the source
// that holds the most connections. A connection at work for its peer is
// never evicted; when every candidate is at work, the new connection is
// refused. Held or stalled connections therefore lock nobody out, and a
// flood from one source evicts its own connections before anyone
// else's. Every wait on a peer is bounded by its server (a handshake
// timeout, an idle timeout), so a waiting connection also ends on its
// own.
//
// K identifies a source, C a connection. Safe for concurrent use.
type Gate[K comparable, C any] struct {
	max, perSource int

	mu     sync.Mutex
	closed bool
	slots  map[*Slot[K, C]]struct{}
	per    map[K]int
}

// Slot is one admitted connection.
type Slot[K comparable, C any] struct {
	src  K
	conn C
	// waiting is when the connection began to wait for its peer (unix
	// nanoseconds; 0 while it works for it). Its server goroutine sets
	// it; Admit reads it to choose whom to evict.
	waiting atomic.Int64
	evict   func()
}

// NewGate returns a gate admitting max connections in all and perSource
// (at most max) per source.
func NewGate[K comparable, C any](max, perSource int) *Gate[K, C] {
	return &Gate[K, C]{max: max, perSource: min(perSource, max), slots: map[*Slot[K, C]]struct{}{}, per: map[K]int{}}
}

// Wait marks the connection as waiting for its peer (evictable): in its
// handshake, idle between requests, stalled mid-message.
func (s *Slot[K, C]) Wait() { s.waiting.Store(time.Now().UnixNano()) }

// Work marks the connection as at work for its peer (not evictable).
func (s *Slot[K, C]) Work() { s.waiting.Store(0) }

// Source is the source the slot was admitted for.
func (s *Slot[K, C]) Source() K { return s.src }

// Conn is the connection the slot was admitted for.
func (s *Slot[K, C]) Conn() C { return s.conn }

// Admit takes a slot for a new connection c from src, waiting from now,
// and reports whether it got one. evict closes the connection; the gate
// calls it (without holding its lock) when the connection must make room
// for another, or when the gate closes. A connection that got no slot is
// the caller's to close. The evicted slot, if any, is released already.
func (g *Gate[K, C]) Admit(src K, c C, evict func()) (*Slot[K, C], bool) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, false
	}
	var victim *Slot[K, C]
	srcFull := g.per[src] >= g.perSource
	if srcFull || len(g.slots) >= g.max {
		var vw int64
		vn := 0
		for s := range g.slots {
			w := s.waiting.Load()
			if w == 0 || (srcFull && s.src != src) {
				continue
			}
			n := g.per[s.src]
			if victim == nil || n > vn || (n == vn && w < vw) {
				victim, vw, vn = s, w, n
			}
		}
		if victim == nil {
			g.mu.Unlock()
			return nil, false
		}
		g.releaseLocked(victim)
	}
	s := &Slot[K, C]{src: src, conn: c, evict: evict}
	s.Wait()
	g.slots[s] = struct{}{}
	g.per[src]++
	g.mu.Unlock()
	if victim != nil {
		victim.evict()
	}
	return s, true
}

// Leave releases s once its connection has ended (idempotent; a slot
// evicted by Admit is released already).
func (g *Gate[K, C]) Leave(s *Slot[K, C]) {
	g.mu.Lock()
	g.releaseLocked(s)
	g.mu.Unlock()
}

func (g *Gate[K, C]) releaseLocked(s *Slot[K, C]) {
	if _, ok := g.slots[s]; !ok {
		return
	}
	delete(g.slots, s)
	if g.per[s.src]--; g.per[s.src] <= 0 {
		delete(g.per, s.src)
	}
}

// Close refuses every later Admit and evicts every admitted connection
// (their slots stay until they Leave). Idempotent.
func (g *Gate[K, C]) Close() {
	g.mu.Lock()
	g.closed = true
	evict := make([]func(), 0, len(g.slots))
	for s := range g.slots {
		evict = append(evict, s.evict)
	}
	g.mu.Unlock()
	for _, f := range evict {
		f()
	}
}

// Len is the number of admitted connections.
func (g *Gate[K, C]) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.slots)
}

// Count is the number of admitted connections from src.
func (g *Gate[K, C]) Count(src K) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.per[src]
}

// Conns lists the admitted connections.
func (g *Gate[K, C]) Conns() []C {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]C, 0, len(g.slots))
	for s := range g.slots {
		out = append(out, s.conn)
	}
	return out
}
