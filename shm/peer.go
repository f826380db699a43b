package shm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/blockcopy"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// peer is the initiator's side of one target incarnation: the connection,
// the control page and the target's regions mapped here.
type peer struct {
	t    *Transport
	name string
	c    *net.UnixConn
	ctl  *dma.Region
	page *ctlPage

	maps  atomic.Pointer[[]*mapping] // sorted by addr; replaced, never edited
	users atomic.Int64               // copies in progress (they touch page and maps)
	dead  atomic.Bool

	reqMu   sync.Mutex    // one MAPREQ at a time
	replies chan struct{} // the reader answers a MAPREQ (MAP or NOMAP)
	nomap   atomic.Bool
	// Notifications (notify.go): ring is in the control memory; noteMu
	// guards the rest and the ring's slots and head.
	ring    *noteRing
	noteMu  sync.Mutex
	head    uint64      // notes published
	tail    uint64      // the ring's tail as last read (roomLocked)
	nfree   []*snote    // notes' states, reused
	waiting []waitNote  // notes waiting for a slot, oldest first
	expiry  *time.Timer // fails the waiting notes past their deadline
	bell    []byte      // BELL, encoded once
	bells   chan struct{}
	// notifyDesc is the last descriptor of the target found to carry
	// notifications (submitNotify): its notes need not look again.
	notifyDesc atomic.Pointer[segment.Descriptor]

	gone     chan struct{} // closed when the peer goes down
	done     chan struct{} // closed when the reader has exited
	stopOnce sync.Once
}

// mapping is one target region mapped into this process.
type mapping struct {
	addr, n   uint64
	slot, gen uint32
	reg       *dma.Region
	mem       []byte
	dead      atomic.Bool
	// users counts this process's copies inside mem. The page's busy
	// counter says the same to the target, but the target can write it:
	// unmap waits on this one.
	users atomic.Int32
}

func dialPeer(ctx context.Context, t *Transport, d *segment.Descriptor, endpoint string) (_ *peer, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.cfg.IOTimeout)
		defer cancel()
	}
	var dl net.Dialer
	nc, err := dl.DialContext(ctx, "unixpacket", endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrPeerReset, err)
	}
	c := nc.(*net.UnixConn)
	p := &peer{t: t, name: d.Name, c: c, replies: make(chan struct{}, 1), gone: make(chan struct{}), done: make(chan struct{})}
	empty := []*mapping{}
	p.maps.Store(&empty)
	ok := false
	defer func() {
		if !ok {
			p.teardown()
		}
	}()
	// The socket name is public: check who holds it before handing it
	// any data (another user may have bound the name of a dead target).
	cred, err := uds.PeerCred(c)
	if err != nil {
		return nil, err
	}
	if cred.UID != t.uid {
		return nil, fmt.Errorf("%w: %s is served by user %d, not %d", ErrRefused, endpoint, cred.UID, t.uid)
	}
	dl2, _ := ctx.Deadline()
	c.SetDeadline(dl2)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	pc := conn(c)
	err = handshake.Dial(pc, t.cfg.Secret, auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()}, auth.Party{Name: d.Name, Epoch: d.Epoch})
	switch {
	case errors.Is(err, control.ErrStale), errors.Is(err, control.ErrClosed):
		return nil, control.Mark(err, driver.ErrPeerReset)
	case err != nil:
		return nil, err
	}
	h, pl, fds, err := pc.Recv(1)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrPeerReset, err)
	}
	if err := refused(h.Type, pl, msgWelcome); err != nil {
		uds.Close(fds)
		return nil, err
	}
	w, err := parseWelcome(pl)
	if err == nil && (len(fds) != 1 || w.slots != maxSlots || int(w.ctlSize) != ctlSize) {
		err = fmt.Errorf("%w: WELCOME with %d descriptors, %d slots, control page of %d bytes", ErrProtocol, len(fds), w.slots, w.ctlSize)
	}
	if err != nil {
		uds.Close(fds)
		return nil, err
	}
	p.ctl, err = dma.MapFD(fds[0], 0, ctlSize)
	uds.Close(fds)
	if err != nil {
		return nil, err
	}
	p.page = viewCtl(p.ctl.Bytes())
	if p.page.magic != ctlMagic {
		return nil, fmt.Errorf("%w: control page magic %#x", ErrProtocol, p.page.magic)
	}
	p.ring = viewRing(p.ctl.Bytes(), ringOff)
	p.head = p.ring.head.Load()
	p.tail = p.ring.tail.Load()
	p.bell, p.bells = proto.Append(nil, msgNoteBell, 0, nil), make(chan struct{}, 1)
	for range w.maps {
		h, pl, fds, err := pc.Recv(1)
		if err != nil {
			return nil, err
		}
		if h.Type != msgMap {
			uds.Close(fds)
			return nil, fmt.Errorf("%w: %s among the initial MAPs", ErrProtocol, proto.TypeName(h.Type))
		}
		if err := p.addMap(pl, fds); err != nil {
			return nil, err
		}
	}
	c.SetDeadline(time.Time{})
	ok = true
	go p.read()
	go p.ringer()
	return p, nil
}

// refused turns a REFUSED or unexpected message into an error.
func refused(typ wire.Type, pl []byte, want wire.Type) error {
	if typ == want {
		return nil
	}
	if typ == msgRefused {
		reason, err := parseRefused(pl)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return fmt.Errorf("%w: %s", ErrRefused, reason)
	}
	return fmt.Errorf("%w: %s instead of %s", ErrProtocol, proto.TypeName(typ), proto.TypeName(want))
}

// addMap maps a region from a MAP message and its descriptor (consumed).
func (p *peer) addMap(pl []byte, fds []int) error {
	defer uds.Close(fds)
	m, err := parseMap(pl)
	if err == nil && len(fds) != 1 {
		err = fmt.Errorf("%w: MAP with %d descriptors", ErrProtocol, len(fds))
	}
	if err != nil {
		return err
	}
	old := *p.maps.Load()
	for _, x := range old {
		if x.slot == m.slot && x.gen == m.gen {
			return nil // already mapped (answer to a MAPREQ that raced)
		}
	}
	// Map whole pages: a region may start anywhere inside its memory.
	page := uint64(dma.PageSize)
	aoff := m.off &^ (page - 1)
	delta := m.off - aoff
	reg, err := dma.MapFD(fds[0], int64(aoff), int(delta+m.n))
	if err != nil {
		return fmt.Errorf("shm: map region [%#x, %#x) of %s: %w", m.addr, m.addr+m.n, p.name, err)
	}
	nm := &mapping{addr: m.addr, n: m.n, slot: m.slot, gen: m.gen, reg: reg, mem: reg.Bytes()[delta : delta+m.n : delta+m.n]}
	var stale []*mapping
	next := make([]*mapping, 0, len(old)+1)
	for _, x := range old {
		// A slot taken over by a new region, or an overlapping range,
		// means the old mapping is dead.
		if x.slot == nm.slot || (x.addr < nm.addr+nm.n && nm.addr < x.addr+x.n) {
			stale = append(stale, x)
			continue
		}
		next = append(next, x)
	}
	next = append(next, nm)
	slices.SortFunc(next, func(a, b *mapping) int { return cmp.Compare(a.addr, b.addr) })
	p.maps.Store(&next)
	for _, x := range stale {
		p.unmap(x)
	}
	return nil
}

// unmap releases a mapping no longer in p.maps once no copy of this
// process uses it (whatever the target wrote into the busy counter).
func (p *peer) unmap(m *mapping) {
	m.dead.Store(true)
	for spins := 0; m.users.Load() > 0; spins++ {
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	m.reg.Unmap()
}

// removeSlot drops the mapping of (slot, gen) after an UNMAP.
func (p *peer) removeSlot(slot, gen uint32) {
	old := *p.maps.Load()
	i := slices.IndexFunc(old, func(x *mapping) bool { return x.slot == slot && x.gen == gen })
	if i < 0 {
		return
	}
	m := old[i]
	next := slices.Delete(slices.Clone(old), i, i+1)
	p.maps.Store(&next)
	p.unmap(m)
}

// read serves the target's messages until the connection ends; then the
// peer goes down.
func (p *peer) read() {
	defer close(p.done)
	defer p.teardown()
	// A Receiver, not conn's Recv: a ROOM is received without
	// allocating.
	rcv, err := uds.NewReceiver(p.c, 1)
	if err != nil {
		p.t.log.Info("shm: target connection ends", "segment", p.name, "err", err)
		return
	}
	buf := make([]byte, maxPacket)
	for {
		h, pl, fds, err := recvPacket(rcv, buf)
		typ := h.Type
		if err != nil {
			if !p.dead.Load() {
				p.t.log.Info("shm: target connection ends", "segment", p.name, "err", err)
			}
			return
		}
		switch typ {
		case msgMap:
			if err := p.addMap(pl, fds); err != nil {
				p.t.log.Warn("shm: cannot map target memory", "segment", p.name, "err", err)
				return
			}
			p.answer()
		case msgNoMap:
			uds.Close(fds)
			p.nomap.Store(true)
			p.answer()
		case msgUnmap:
			uds.Close(fds)
			slot, gen, err := parseUnmap(pl)
			if err != nil {
				p.t.log.Warn("shm: bad UNMAP", "segment", p.name, "err", err)
				return
			}
			p.removeSlot(slot, gen)
		case msgNoteRoom:
			uds.Close(fds)
			p.roomFreed()
		case msgNoteLost:
			uds.Close(fds)
			id, st, err := parseNoteLost(pl)
			if err != nil {
				p.t.log.Warn("shm: bad NOTELOST", "segment", p.name, "err", err)
				return
			}
			p.noteLost(id, st)
		default:
			uds.Close(fds)
			if typ == msgRefused {
				reason, _ := parseRefused(pl)
				p.t.log.Warn("shm: target disconnects", "segment", p.name, "reason", reason)
			} else {
				p.t.log.Warn("shm: target sent an unexpected message", "segment", p.name, "type", proto.TypeName(typ))
			}
			return
		}
	}
}

func (p *peer) answer() {
	select {
	case p.replies <- struct{}{}:
	default:
	}
}

// find returns the mapping holding [addr, addr+n), or nil. It does not
// allocate.
func (p *peer) find(addr, n uint64) *mapping {
	ms := *p.maps.Load()
	lo, hi := 0, len(ms)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ms[m].addr <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return nil
	}
	m := ms[lo-1]
	if n <= m.n && addr-m.addr <= m.n-n {
		return m
	}
	return nil
}

// fetch asks the target for the region holding [addr, addr+n) (one
// registered after the handshake) and waits for it, at most IOTimeout.
func (p *peer) fetch(addr, n uint64) (*mapping, error) {
	p.reqMu.Lock()
	defer p.reqMu.Unlock()
	if m := p.find(addr, n); m != nil {
		return m, nil
	}
	select {
	case <-p.replies:
	default:
	}
	p.nomap.Store(false)
	p.c.SetWriteDeadline(time.Now().Add(p.t.cfg.IOTimeout))
	if err := uds.Send(p.c, appendRange(nil, msgMapReq, addr, n), nil); err != nil {
		return nil, errGone
	}
	p.wakeReader()
	tm := time.NewTimer(p.t.cfg.IOTimeout)
	defer tm.Stop()
	for {
		select {
		case <-p.replies:
			if m := p.find(addr, n); m != nil {
				return m, nil
			}
			if p.nomap.Load() {
				return nil, errNotShared
			}
		case <-p.gone:
			return nil, errGone
		case <-tm.C:
			return nil, errMapWait
		}
	}
}

// hold finds the mapping holding [addr, addr+n), asking the target for
// it when it is not mapped yet, and marks a copy in progress in it, here
// (m.users) and on the control page (busy); unhold ends that. The caller
// holds p.users. A run of copies into one mapping holds it once. It makes
// no system call and does not allocate once the region is mapped.
func (p *peer) hold(addr, n uint64) (*mapping, error) {
	if p.dead.Load() {
		return nil, errGone
	}
	m := p.find(addr, n)
	if m == nil {
		var err error
		if m, err = p.fetch(addr, n); err != nil {
			return nil, err
		}
	}
	busy := &p.page.busy[m.slot]
	m.users.Add(1)
	busy.Add(1)
	// Raise busy, then look: the target zeroes gen, then looks at busy
	// (and unmap sets dead, then looks at users).
	if m.dead.Load() || p.page.gen[m.slot].Load() != m.gen {
		busy.Add(-1)
		m.users.Add(-1)
		if p.dead.Load() || p.page.closing.Load() != 0 {
			return nil, errGone
		}
		return nil, errRevoked
	}
	return m, nil
}

// unhold ends what hold started.
func (p *peer) unhold(m *mapping) {
	p.page.busy[m.slot].Add(-1)
	m.users.Add(-1)
}

// covers reports whether [addr, addr+n) lies inside m.
func (m *mapping) covers(addr, n uint64) bool {
	return addr >= m.addr && n <= m.n && addr-m.addr <= m.n-n
}

// result is one slice's outcome.
type result struct {
	n   uint64
	err error
}

// copyRun copies ss and puts each slice's outcome into res. It holds a
// peer (p.users) and a mapping (hold) across the consecutive slices that
// use them, so a batch into one region raises and checks its pins once,
// not per slice; the target's unregistration waits for the run (at most
// a chunk of slices) as it waits for one copy. With posted, each slice
// is marked posted (driver.Slice.Posted) as its copy starts: a copier's
// slices wait in a queue before that. It reports whether every slice
// succeeded (then the callers need not look at res again).
func copyRun(ss []*driver.Slice, res []result, posted bool) (ok bool) {
	ok = true
	var p *peer
	var m *mapping
	for i, s := range ss {
		sp, mine := s.Peer.(*peer)
		if !mine {
			res[i] = result{0, errForeign}
			ok = false
			continue
		}
		if s.Canceled() {
			res[i] = result{0, errSliceCanceled}
			ok = false
			continue
		}
		if sp != p {
			if m != nil {
				p.unhold(m)
				m = nil
			}
			if p != nil {
				p.users.Add(-1)
			}
			p = sp
			p.users.Add(1)
		}
		n := uint64(len(s.Local))
		if m == nil || !m.covers(s.RemoteAddr, n) {
			if m != nil {
				p.unhold(m)
			}
			var err error
			if m, err = p.hold(s.RemoteAddr, n); err != nil {
				res[i] = result{0, err}
				ok = false
				continue
			}
		}
		if posted {
			s.Posted()
		}
		off := s.RemoteAddr - m.addr
		if s.Op == driver.Write {
			blockcopy.Copy(m.mem[off:off+n], s.Local)
		} else {
			blockcopy.Copy(s.Local, m.mem[off:off+n])
		}
		res[i] = result{n, nil}
	}
	if m != nil {
		p.unhold(m)
	}
	if p != nil {
		p.users.Add(-1)
	}
	return ok
}

// stop marks the peer down: no copy starts after it, and a copy waiting
// for a MAP gives up.
func (p *peer) stop() {
	p.stopOnce.Do(func() {
		p.dead.Store(true)
		close(p.gone)
	})
}

// teardown takes the peer down: no copy starts, running ones finish, every
// mapping and the control page are unmapped, then the socket closes (so
// the target, seeing it close, knows nothing of this peer writes any
// more). Only the reader calls it (or dialPeer, before there is one): it
// owns the mappings.
func (p *peer) teardown() {
	p.stop()
	p.failNotes()
	for spins := 0; p.users.Load() > 0; spins++ {
		if spins < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	if ms := p.maps.Load(); ms != nil {
		empty := []*mapping{}
		p.maps.Store(&empty)
		for _, m := range *ms {
			m.dead.Store(true)
			m.reg.Unmap()
		}
	}
	if p.ctl != nil {
		p.ctl.Unmap()
	}
	p.c.Close()
	p.t.forget(p)
}

// Close takes the peer down (slices not yet copied fail with
// driver.ErrPeerReset) and waits until everything is unmapped. Shutting
// the socket's receiving side wakes the reader, which tears down; the
// target sees the connection close only after that.
func (p *peer) Close() error {
	p.stop()
	p.c.CloseRead()
	<-p.done
	return nil
}
