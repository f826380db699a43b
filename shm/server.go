package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uds"
)

// serverConn is the target's side of one initiator's connection.
type serverConn struct {
	t    *Transport
	c    *net.UnixConn
	cred uds.Cred
	slot *acceptor.Slot[int32, *serverConn]
	dead atomic.Bool
	// evicted: admission closed the connection to make room while the
	// peer may still copy.
	evicted atomic.Bool

	// mu serialises sends, the control page's generations and mapped,
	// and the control page's lifetime.
	mu     sync.Mutex
	ctl    *dma.Region
	page   *ctlPage
	mapped map[uint32]uint32 // slot → generation handed to the peer
	out    []byte
	// from is the initiator as its handshake named it (notifications).
	from driver.Sender

	// The note ring (notify.go), the reader's alone: a mapping of its
	// own, so that close may unmap the control page under a reader
	// still delivering.
	ringMem *dma.Region
	ring    *noteRing
	tail    uint64        // notes taken
	noteBuf []byte        // a slot copied out
	gap     time.Duration // between notes, on average (watchFor)
	noteOut []byte
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	acceptor.Run(t.log, "shm", t.ln.Addr(), nil, t.ln.AcceptUnix, t.admit)
}

// admit serves c under the admission policy (internal/acceptor.Gate),
// with the connecting process as the source: at MaxConns (or
// MaxConnsPerSource for one process) the connection that has waited
// longest for its initiator makes room, from the process holding the
// most, so one process holding connections locks nobody out.
func (t *Transport) admit(c *net.UnixConn) {
	cred, err := uds.PeerCred(c)
	if err != nil {
		c.Close()
		return
	}
	sc := &serverConn{t: t, c: c, cred: cred, mapped: map[uint32]uint32{}}
	slot, ok := t.gate.Admit(cred.PID, sc, func() {
		sc.evicted.Store(true)
		sc.c.Close()
	})
	if !ok {
		c.Close()
		t.log.Debug("shm: connection refused: every slot busy", "pid", cred.PID, "max", t.cfg.MaxConns)
		return
	}
	sc.slot = slot
	t.wg.Add(1) // the accept loop holds the group: no race with Close's Wait
	go sc.serve()
}

func (sc *serverConn) refuse(reason string) {
	sc.c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	uds.Send(sc.c, appendRefused(nil, reason), nil)
}

// peerAddr names an initiator process in logs (the socket has no address).
type peerAddr uds.Cred

func (a peerAddr) Network() string { return "unixpacket" }
func (a peerAddr) String() string  { return fmt.Sprintf("pid %d uid %d", a.PID, a.UID) }

func (sc *serverConn) serve() {
	t := sc.t
	defer t.wg.Done()
	defer sc.close()
	defer sc.unmapRing()
	if err := sc.handshake(); err != nil {
		if !t.closed.Load() {
			t.fails.Failed(peerAddr(sc.cred), err)
		}
		return
	}
	pc := conn(sc.c)
	var lastNote time.Time
	woken := false // a nap ended by a wake-up
	for {
		took, err := sc.takeNotes()
		if err != nil {
			t.log.Warn("shm: bad note ring; disconnecting", "pid", sc.cred.PID, "err", err)
			return
		}
		if took {
			now := time.Now()
			if !lastNote.IsZero() {
				// An average of the last ~8 gaps between notes, each
				// counted as at most 2 × spinGap: after an idle spell
				// a burst's notes are watched for again at once.
				sc.gap += (min(now.Sub(lastNote), 2*spinGap) - sc.gap) / 8
			}
			lastNote = now
			if d, polls := sc.watchFor(); sc.lingerNotes(d, polls) {
				continue
			}
		}
		// A wake-up that brought no note was for the socket (a MAPREQ
		// follows, or the connection goes away).
		if took || !woken {
			if left := noteNap - time.Since(lastNote); left > 0 {
				if woken = sc.nap(left); woken {
					continue
				}
			}
		}
		woken = false
		sc.ring.sleep.Store(sleepSocket)
		if sc.ring.head.Load() != sc.tail {
			// Published before sleep was set: no BELL comes for it.
			sc.ring.sleep.Store(0)
			continue
		}
		sc.slot.Wait()
		h, p, fds, err := pc.Recv(0)
		sc.slot.Work()
		sc.ring.sleep.Store(0)
		typ := h.Type
		if err != nil {
			if !t.closed.Load() {
				// The target has custody of what the initiator
				// published before it went away.
				if _, err := sc.takeNotes(); err != nil {
					t.log.Warn("shm: bad note ring", "pid", sc.cred.PID, "err", err)
				}
			}
			switch {
			case sc.dead.Load() || sc.evicted.Load() || t.closed.Load():
			case sc.inCopy():
				// A well-behaved initiator leaves its copies before it
				// closes: this one died (was killed) mid-transfer.
				t.lost.Warn("shm: initiator went away inside a copy (it died or was killed mid-transfer)", "pid", sc.cred.PID, "err", err)
			case !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF):
				t.log.Info("shm: peer connection ends", "pid", sc.cred.PID, "err", err)
			}
			return
		}
		uds.Close(fds)
		if typ == msgNoteBell {
			continue
		}
		if typ != msgMapReq {
			t.log.Warn("shm: peer sent an unexpected message; disconnecting", "pid", sc.cred.PID, "type", proto.TypeName(typ))
			return
		}
		addr, n, err := parseRange(p)
		if err != nil {
			t.log.Warn("shm: bad MAPREQ; disconnecting", "pid", sc.cred.PID, "err", err)
			return
		}
		if err := sc.offer(addr, n); err != nil {
			t.log.Warn("shm: cannot answer peer; disconnecting", "pid", sc.cred.PID, "err", err)
			return
		}
	}
}

// handshake runs te's handshake (the peer's user, the secret, the
// segment's name and epoch) and hands the peer the control page and every
// live region.
func (sc *serverConn) handshake() error {
	t := sc.t
	sc.c.SetDeadline(time.Now().Add(t.cfg.IOTimeout))
	me := auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()}
	from, err := handshake.Accept(conn(sc.c), t.cfg.Secret, me, func(*auth.Hello) error {
		if sc.cred.UID != t.uid {
			return control.Refuse("shm handshake: user %d may not connect (the target runs as user %d)", sc.cred.UID, t.uid)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sc.from = driver.Sender{Name: from.Name, Epoch: from.Epoch, Seq: driver.NextSeq()}
	ctl, err := dma.AllocShared(ctlSize)
	if err != nil {
		sc.refuse("out of memory")
		return err
	}
	ringMem, err := dma.MapFD(ctl.FD(), int64(ringOff), ringLen)
	if err != nil {
		ctl.Unmap()
		sc.refuse("out of memory")
		return err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.ringMem, sc.ring = ringMem, viewRing(ringMem.Bytes(), 0) // under mu for wakeNap
	if sc.dead.Load() {
		ctl.Unmap()
		return net.ErrClosed
	}
	sc.ctl, sc.page = ctl, viewCtl(ctl.Bytes())
	sc.page.magic = ctlMagic
	live := t.liveAll()
	if err := uds.Send(sc.c, welcome{maps: uint32(len(live)), slots: maxSlots, ctlSize: uint32(ctlSize)}.append(nil), []int{ctl.FD()}); err != nil {
		return err
	}
	for _, sr := range live {
		// A region revoked since liveAll: see sendMap.
		if err := sc.sendMap(sr); err != nil {
			return err
		}
	}
	sc.c.SetDeadline(time.Time{})
	return nil
}

// sendMap hands one region to the peer; sc.mu is held. A region being
// unregistered (its revoke waits for mu) goes out with its generation left
// at 0, so the peer cannot copy into it, and is recorded as mapped, so the
// revoke that follows tells the peer to unmap it.
func (sc *serverConn) sendMap(sr *sharedRegion) error {
	if sc.t.isLive(sr) {
		sc.page.gen[sr.slot].Store(sr.gen)
	}
	sc.mapped[sr.slot] = sr.gen
	sc.out = mapMsg{slot: sr.slot, gen: sr.gen, addr: sr.r.Addr(), n: sr.r.Len(), off: sr.off}.append(sc.out[:0])
	sc.c.SetWriteDeadline(time.Now().Add(sc.t.cfg.IOTimeout))
	return uds.Send(sc.c, sc.out, []int{sr.fd})
}

// offer answers a MAPREQ: the region holding the range, or NOMAP.
func (sc *serverConn) offer(addr, n uint64) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.page == nil {
		return net.ErrClosed
	}
	if sr := sc.t.live(addr, n); sr != nil {
		return sc.sendMap(sr)
	}
	sc.out = appendRange(sc.out[:0], msgNoMap, addr, n)
	sc.c.SetWriteDeadline(time.Now().Add(sc.t.cfg.IOTimeout))
	return uds.Send(sc.c, sc.out, nil)
}

// revokeStart stops the peer's copies into sr from starting (zeroes the
// slot's generation) and reports whether the peer has sr mapped: then
// the caller waits until none of its copies is inside it (inCopyAt) and
// tells it to unmap (revokeFinish). Another region may take the slot
// meanwhile: the peer drops only the mapping of sr's generation.
func (sc *serverConn) revokeStart(sr *sharedRegion) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.page == nil {
		return false
	}
	sc.page.gen[sr.slot].Store(0)
	if sc.mapped[sr.slot] != sr.gen {
		return false
	}
	delete(sc.mapped, sr.slot)
	return true
}

// inCopyAt reports whether the peer says it is inside a copy into slot.
func (sc *serverConn) inCopyAt(slot uint32) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.page != nil && !sc.dead.Load() && sc.page.busy[slot].Load() > 0
}

// revokeFinish tells the peer to unmap sr, by deadline.
func (sc *serverConn) revokeFinish(sr *sharedRegion, deadline time.Time) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.page == nil || sc.dead.Load() {
		return
	}
	sc.out = appendUnmap(sc.out[:0], sr.slot, sr.gen)
	sc.c.SetWriteDeadline(deadline)
	if err := uds.Send(sc.c, sc.out, nil); err != nil {
		sc.dead.Store(true)
		sc.c.Close()
	}
}

// disconnect drops a peer that will not leave a copy.
func (sc *serverConn) disconnect() {
	sc.dead.Store(true)
	sc.c.Close()
	sc.wakeNap()
}

// waitOut waits until inCopy reports false for every connection of
// conns, at most until deadline, and returns those for which it still
// reports true then. The connections are polled together: one deadline
// for all, whatever each peer does.
func waitOut(conns []*serverConn, inCopy func(*serverConn) bool, deadline time.Time) []*serverConn {
	pending := slices.Clone(conns)
	for spins := 0; ; spins++ {
		pending = slices.DeleteFunc(pending, func(sc *serverConn) bool { return !inCopy(sc) })
		if len(pending) == 0 || time.Now().After(deadline) {
			return pending
		}
		switch {
		case spins < 100:
			runtime.Gosched()
		case spins < 1000:
			time.Sleep(50 * time.Microsecond)
		default:
			time.Sleep(time.Millisecond) // many stuck peers: do not burn a core
		}
	}
}

// pids lists the first few peers' process IDs, for a log line.
func pids(conns []*serverConn) []int32 {
	out := make([]int32, 0, min(len(conns), 8))
	for _, sc := range conns[:min(len(conns), 8)] {
		out = append(out, sc.cred.PID)
	}
	return out
}

// close drops the connection and the control page. The initiator's
// mappings go with its end of the socket (it unmaps on EOF, or exits).
// When the transport closes, fenceAll has stopped the peer's copies first.
//
// A connection admission evicted is fenced first, as Close fences every
// connection: its peer may still copy until it reads the EOF.
func (sc *serverConn) close() {
	if sc.evicted.Load() && !sc.t.closed.Load() {
		sc.t.fenceAll([]*serverConn{sc})
	}
	sc.dead.Store(true) // a revoke in progress stops waiting
	if sc.t.closed.Load() {
		sc.c.SetWriteDeadline(time.Now()) // a send in progress under mu gives up
	}
	sc.c.Close()
	sc.wakeNap()
	sc.mu.Lock()
	if sc.ctl != nil {
		sc.ctl.Unmap()
		sc.ctl, sc.page = nil, nil
	}
	sc.mu.Unlock()
	sc.t.gate.Leave(sc.slot)
}

// fenceAll stops the copies of every peer in conns into every region it
// mapped, as revoke does for one, when the transport closes: the peers
// learn of the close only when they read the socket's EOF, and no copy may
// land after Close returns (the memory is no longer registered). All
// peers are fenced at once and waited for together, at most IOTimeout in
// all whatever they do; the peers still inside a copy then (stuck, or
// hostile: the busy counters live in memory they write) are logged and
// dropped with the rest. It returns how many it gave up on.
func (t *Transport) fenceAll(conns []*serverConn) int {
	for _, sc := range conns {
		sc.dead.Store(true)               // a revoke in progress stops waiting
		sc.c.SetWriteDeadline(time.Now()) // a send in progress under mu gives up
		sc.mu.Lock()
		if sc.page != nil {
			if t.closed.Load() {
				// The target goes away: copies that find their
				// generation gone fail as driver.ErrPeerReset, not
				// as revoked memory.
				sc.page.closing.Store(1)
			}
			for slot := range sc.mapped {
				sc.page.gen[slot].Store(0)
			}
		}
		sc.mu.Unlock()
	}
	pending := waitOut(conns, (*serverConn).inCopy, time.Now().Add(t.cfg.IOTimeout))
	if len(pending) == 0 {
		return 0
	}
	t.log.Warn("shm: closing: gave up waiting for peers stuck inside a copy; disconnecting them",
		"peers", len(pending), "pids", pids(pending), "waited", t.cfg.IOTimeout)
	return len(pending)
}

// inCopy reports whether the peer says it is inside a copy into one of the
// regions it mapped.
func (sc *serverConn) inCopy() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.page == nil {
		return false
	}
	for slot := range sc.mapped {
		if sc.page.busy[slot].Load() > 0 {
			return true
		}
	}
	return false
}
