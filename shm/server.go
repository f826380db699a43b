package shm

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/uds"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
)

// serverConn is the target's side of one initiator's connection.
type serverConn struct {
	t    *Transport
	c    *net.UnixConn
	cred uds.Cred
	dead atomic.Bool

	// mu serialises sends, the control page's generations and mapped,
	// and the control page's lifetime.
	mu     sync.Mutex
	ctl    *dma.Region
	page   *ctlPage
	mapped map[uint32]uint32 // slot → generation handed to the peer
	out    []byte
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	acceptor.Run(t.log, "shm", t.ln.Addr(), nil, t.ln.AcceptUnix, func(c *net.UnixConn) {
		sc := &serverConn{t: t, c: c, mapped: map[uint32]uint32{}}
		t.mu.Lock()
		if t.closed.Load() || len(t.conns) >= t.cfg.MaxConns {
			t.mu.Unlock()
			sc.refuse("too many peers")
			c.Close()
			return
		}
		t.conns[sc] = struct{}{}
		t.wg.Add(1)
		t.mu.Unlock()
		go sc.serve()
	})
}

func (sc *serverConn) refuse(reason string) {
	sc.c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	uds.Send(sc.c, appendRefused(nil, reason), nil)
}

// recv reads one packet with at most want descriptors.
func recv(c *net.UnixConn, buf []byte, want int) (wire.Type, []byte, []int, error) {
	n, fds, err := uds.Recv(c, buf, want)
	if err != nil {
		return 0, nil, nil, err
	}
	if n == 0 {
		uds.Close(fds)
		return 0, nil, nil, fmt.Errorf("shm: connection closed: %w", net.ErrClosed)
	}
	typ, p, err := parse(buf[:n])
	if err != nil {
		uds.Close(fds)
		return 0, nil, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return typ, p, fds, nil
}

func (sc *serverConn) serve() {
	t := sc.t
	defer t.wg.Done()
	defer sc.close()
	if err := sc.handshake(); err != nil {
		if t.closed.Load() {
			return
		}
		t.fails.Failed(sc.c.RemoteAddr(), fmt.Errorf("pid %d uid %d: %w", sc.cred.PID, sc.cred.UID, err))
		return
	}
	buf := make([]byte, maxPacket)
	for {
		typ, p, fds, err := recv(sc.c, buf, 0)
		if err != nil {
			switch {
			case sc.dead.Load() || t.closed.Load():
			case sc.inCopy():
				// A well-behaved initiator leaves its copies before it
				// closes: this one died (was killed) mid-transfer.
				t.lost.Warn("shm: initiator went away inside a copy (it died or was killed mid-transfer)", "pid", sc.cred.PID, "err", err)
			case !errors.Is(err, net.ErrClosed):
				t.log.Info("shm: peer connection ends", "pid", sc.cred.PID, "err", err)
			}
			return
		}
		uds.Close(fds)
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

// handshake checks the peer's user and secret and hands it the control
// page and every live region.
func (sc *serverConn) handshake() error {
	t := sc.t
	cred, err := uds.PeerCred(sc.c)
	if err != nil {
		return err
	}
	sc.cred = cred
	if cred.UID != t.uid {
		sc.refuse(fmt.Sprintf("user %d may not connect (target runs as user %d)", cred.UID, t.uid))
		return fmt.Errorf("%w: user %d is not %d", ErrRefused, cred.UID, t.uid)
	}
	sc.c.SetDeadline(time.Now().Add(t.cfg.IOTimeout))
	buf := make([]byte, maxPacket)
	typ, p, _, err := recv(sc.c, buf, 0)
	if err != nil {
		return err
	}
	if typ != msgHello {
		return fmt.Errorf("%w: %s before HELLO", ErrProtocol, proto.TypeName(typ))
	}
	h, rest, err := auth.ParseHello(p)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("%w: %d bytes after the hello", ErrProtocol, len(rest))
	}
	if err != nil {
		return err
	}
	me := auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()}
	re, err := t.cfg.Secret.Respond(segment.ProtoSHM, me, h)
	if err != nil {
		sc.refuse(err.Error())
		return err
	}
	if h.Target.Epoch != 0 && h.Target.Epoch != me.Epoch {
		sc.refuse("stale epoch")
		return fmt.Errorf("%w: initiator addresses epoch %#x, this is %#x", ErrRefused, h.Target.Epoch, me.Epoch)
	}
	if err := uds.Send(sc.c, proto.Append(nil, msgChallenge, 0, auth.AppendChallenge(nil, re.Challenge())), nil); err != nil {
		return err
	}
	typ, p, _, err = recv(sc.c, buf, 0)
	if err != nil {
		return err
	}
	if typ != msgAnswer {
		return fmt.Errorf("%w: %s instead of ANSWER", ErrProtocol, proto.TypeName(typ))
	}
	a, rest, err := auth.ParseAnswer(p)
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("%w: %d bytes after the answer", ErrProtocol, len(rest))
	}
	if err != nil {
		return err
	}
	if err := re.Check(a); err != nil {
		sc.refuse("authentication failed")
		return err
	}
	ctl, err := dma.AllocShared(ctlSize)
	if err != nil {
		sc.refuse("out of memory")
		return err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
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

// revoke stops the peer's copies into sr: zero the slot's generation, wait
// until no copy is inside it, tell the peer to unmap.
func (sc *serverConn) revoke(sr *sharedRegion) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.page == nil {
		return
	}
	sc.page.gen[sr.slot].Store(0)
	if sc.mapped[sr.slot] != sr.gen {
		return
	}
	delete(sc.mapped, sr.slot)
	deadline := time.Now().Add(sc.t.cfg.IOTimeout)
	for spins := 0; sc.page.busy[sr.slot].Load() > 0 && !sc.dead.Load(); spins++ {
		if spins < 100 {
			runtime.Gosched()
			continue
		}
		if time.Now().After(deadline) {
			sc.t.log.Warn("shm: peer stuck inside a copy into memory being unregistered; disconnecting it",
				"pid", sc.cred.PID, "addr", sr.r.Addr(), "waited", sc.t.cfg.IOTimeout)
			sc.dead.Store(true)
			sc.c.Close()
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
	if sc.dead.Load() {
		return
	}
	sc.out = appendUnmap(sc.out[:0], sr.slot, sr.gen)
	sc.c.SetWriteDeadline(time.Now().Add(sc.t.cfg.IOTimeout))
	if err := uds.Send(sc.c, sc.out, nil); err != nil {
		sc.dead.Store(true)
		sc.c.Close()
	}
}

// close drops the connection and the control page. The initiator's
// mappings go with its end of the socket (it unmaps on EOF, or exits).
// When the transport closes, fenceAll has stopped the peer's copies first.
func (sc *serverConn) close() {
	sc.dead.Store(true) // a revoke in progress stops waiting
	if sc.t.closed.Load() {
		sc.c.SetWriteDeadline(time.Now()) // a send in progress under mu gives up
	}
	sc.c.Close()
	sc.mu.Lock()
	if sc.ctl != nil {
		sc.ctl.Unmap()
		sc.ctl, sc.page = nil, nil
	}
	sc.mu.Unlock()
	sc.t.mu.Lock()
	delete(sc.t.conns, sc)
	sc.t.mu.Unlock()
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
			for slot := range sc.mapped {
				sc.page.gen[slot].Store(0)
			}
		}
		sc.mu.Unlock()
	}
	deadline := time.Now().Add(t.cfg.IOTimeout)
	pending := slices.Clone(conns)
	for spins := 0; ; spins++ {
		pending = slices.DeleteFunc(pending, func(sc *serverConn) bool { return !sc.inCopy() })
		if len(pending) == 0 {
			return 0
		}
		if time.Now().After(deadline) {
			break
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
	pids := make([]int32, 0, min(len(pending), 8))
	for _, sc := range pending[:min(len(pending), 8)] {
		pids = append(pids, sc.cred.PID)
	}
	t.log.Warn("shm: closing: gave up waiting for peers stuck inside a copy; disconnecting them",
		"peers", len(pending), "pids", pids, "waited", t.cfg.IOTimeout)
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
