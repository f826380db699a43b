package rdma

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmago/te/auth"
	"github.com/rdmago/te/engine/driver"
	"github.com/rdmago/te/internal/acceptor"
	"github.com/rdmago/te/internal/control"
	"github.com/rdmago/te/internal/wire"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/uverbs"
)

// targetState is the target side: sessions (control connections) and the
// QPs they hold.
type targetState struct {
	t        *Transport
	mu       sync.Mutex
	sessions map[*session]struct{}
	perInit  map[string]int // QPs held per initiator name
	total    int
	closed   bool
	fails    *control.Log
	// gate admits control connections (internal/acceptor.Gate): a
	// session waits (is evictable) in its handshake and while it holds
	// no QP; one holding QPs is the initiator's lease and is kept.
	gate *acceptor.Gate[netip.Addr, *session]
}

// session is one initiator's control connection and the endpoints it set
// up; closing it destroys them.
type session struct {
	conn      net.Conn
	slot      *acceptor.Slot[netip.Addr, *session]
	initiator string
	epoch     uint64
	seq       uint64 // driver.Sender.Seq
	eps       map[uint32]targetEP
	nqps      int

	wmu sync.Mutex // writes on conn
	// creds are the notification credits to return (receives reposted),
	// written by the session's credit writer; kick wakes it, done ends it.
	credMu sync.Mutex
	creds  []credit
	kick   chan struct{}
	done   chan struct{}
	ended  atomic.Bool
	// notes are received notifications waiting for the session's
	// deliverer (credMu); noteKick wakes it.
	notes    []noteRef
	noteKick chan struct{}
	// delivering: the deliverer has notes in hand; partial counts the
	// markers in of notes sent as several (credMu).
	delivering bool
	partial    map[uint64]uint32
}

func (ts *targetState) init(t *Transport) {
	ts.t = t
	ts.sessions = map[*session]struct{}{}
	ts.perInit = map[string]int{}
	ts.fails = control.NewLog(t.log, segment.ProtoRDMA, 0)
	ts.gate = acceptor.NewGate[netip.Addr, *session](t.cfg.MaxSessions, t.cfg.MaxSessionsPerSource)
}

func (t *Transport) accept() {
	defer t.wg.Done()
	acceptor.Run(t.log, "rdma", t.ln.Addr(), t.ctx.Done(), t.ln.Accept, func(c net.Conn) {
		s := &session{conn: c, eps: map[uint32]targetEP{}, kick: make(chan struct{}, 1), noteKick: make(chan struct{}, 1), done: make(chan struct{})}
		var src netip.Addr
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = ta.AddrPort().Addr().Unmap()
		}
		slot, ok := t.tgt.gate.Admit(src, s, func() { c.Close() })
		if !ok {
			t.log.Debug("rdma: control connection refused: every session holds QPs", "peer", c.RemoteAddr().String(), "limit", t.cfg.MaxSessions)
			c.Close()
			return
		}
		s.slot = slot
		if !t.tgt.add(s) {
			t.tgt.gate.Leave(slot)
			c.Close()
			return
		}
		t.wg.Add(1) // the accept loop holds the group: no race with Close's Wait
		go t.serve(s)
	})
}

func (ts *targetState) add(s *session) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return false
	}
	ts.sessions[s] = struct{}{}
	return true
}

// serve answers one control connection until it ends, then destroys the
// QPs it set up.
func (t *Transport) serve(s *session) {
	defer t.wg.Done()
	defer t.tgt.end(s)
	if tc, ok := s.conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAlivePeriod(5 * time.Second)
	}
	rd := bufio.NewReader(s.conn)
	if err := t.admit(s, rd); err != nil {
		if !t.closed.Load() {
			t.tgt.fails.Failed(s.conn.RemoteAddr(), err)
		}
		return
	}
	ts := &t.tgt
	ts.mu.Lock()
	ts.dropOlderLocked(s)
	ts.mu.Unlock()
	t.wg.Add(2)
	go t.writeCredits(s)
	go t.deliverNotes(s)
	var hdr [wire.HeaderLen]byte
	first := true
	for {
		// The first request must come promptly; later the connection is
		// the initiator's lease on its QPs and may idle.
		if first {
			s.conn.SetReadDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
		} else {
			s.conn.SetReadDeadline(time.Time{})
		}
		t.tgt.mu.Lock()
		if s.nqps == 0 {
			s.slot.Wait()
		} else {
			s.slot.Work()
		}
		t.tgt.mu.Unlock()
		h, payload, err := hsProto.Read(rd, hdr[:], nil)
		s.slot.Work()
		if err != nil {
			if !errors.Is(err, io.EOF) && !t.closed.Load() {
				t.log.Warn("rdma: control connection", "peer", s.conn.RemoteAddr().String(), "err", err)
				if errors.Is(err, wire.ErrFrame) {
					t.reply(s, hsReject, (&rejectMsg{Code: rejectProtocol, Msg: err.Error()}).encode())
				}
			}
			return
		}
		first = false
		switch h.Type {
		case hsConnect:
			m, err := decodeConnect(payload)
			if err != nil {
				t.reply(s, hsReject, (&rejectMsg{Code: rejectProtocol, Msg: err.Error()}).encode())
				return
			}
			if code, out, err := t.tgt.open(s, &m); err != nil {
				t.log.Warn("rdma: endpoint refused", "initiator", m.Initiator, "peer", s.conn.RemoteAddr().String(), "err", err)
				if !t.reply(s, hsReject, (&rejectMsg{Code: code, Msg: err.Error()}).encode()) || code == rejectProtocol {
					return
				}
			} else if !t.reply(s, hsAccept, out) {
				return
			}
		case hsRelease:
			id, err := decodeRelease(payload)
			if err != nil {
				return
			}
			t.tgt.release(s, id)
		default:
			t.reply(s, hsReject, (&rejectMsg{Code: rejectProtocol, Msg: fmt.Sprintf("unexpected %s frame", hsProto.TypeName(h.Type))}).encode())
			return
		}
	}
}

// admit runs te's handshake that opens every control connection: the
// hello names the initiator (segment and epoch) the session then serves.
func (t *Transport) admit(s *session, rd *bufio.Reader) error {
	s.conn.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	defer s.conn.SetDeadline(time.Time{})
	ini, err := handshake.Accept(control.Stream(rd, s.conn, &hsProto), t.cfg.Auth, auth.Party{Name: t.host.LocalName(), Epoch: t.host.Epoch()},
		func(h *auth.Hello) error {
			if h.Initiator.Name == "" {
				return errors.New("hello without an initiator name")
			}
			return nil
		})
	if err != nil {
		return err
	}
	t.tgt.mu.Lock()
	s.initiator, s.epoch, s.seq = ini.Name, ini.Epoch, driver.NextSeq()
	t.tgt.mu.Unlock()
	return nil
}

func (t *Transport) reply(s *session, typ wire.Type, payload []byte) bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.conn.SetWriteDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	return hsProto.Write(s.conn, typ, 0, payload) == nil
}

// open creates and connects the target's QPs of one endpoint.
func (ts *targetState) open(s *session, m *connectMsg) (rejectCode, []byte, error) {
	t := ts.t
	if m.TargetEpoch != t.host.Epoch() {
		return rejectStaleEpoch, nil, fmt.Errorf("stale epoch %#x: this is %s epoch %#x", m.TargetEpoch, t.host.LocalName(), t.host.Epoch())
	}
	if s.initiator != m.Initiator || s.epoch != m.InitEpoch {
		return rejectProtocol, nil, fmt.Errorf("connect for %s/%#x on the connection of %s/%#x", m.Initiator, m.InitEpoch, s.initiator, s.epoch)
	}
	if int(m.RemoteRail) >= len(t.rails) {
		return rejectBadRail, nil, fmt.Errorf("no rail %d (have %d)", m.RemoteRail, len(t.rails))
	}
	if _, dup := s.eps[m.ID]; dup {
		return rejectProtocol, nil, fmt.Errorf("endpoint id %d already open", m.ID)
	}
	r := t.rails[m.RemoteRail]
	if !r.up.Load() {
		return rejectBadRail, nil, fmt.Errorf("rail %d (%s) is down", m.RemoteRail, r.name)
	}
	n := len(m.QPs)
	if !ts.reserve(s.initiator, n) {
		return rejectLimit, nil, fmt.Errorf("QP limit: %d per initiator, %d in all", t.cfg.MaxInitiatorQPs, t.cfg.MaxTargetQPs)
	}
	var qps []*tgtQP
	var a acceptMsg
	var err error
	r.call(func() { qps, a, err = t.respond(r, s, m) })
	if err != nil {
		ts.unreserve(s.initiator, n)
		return rejectInternal, nil, err
	}
	a.ID = m.ID
	ts.mu.Lock()
	s.eps[m.ID] = targetEP{r, qps}
	s.nqps += n
	ts.mu.Unlock()
	return 0, a.encode(), nil
}

// targetEP is the target's side of one endpoint: QPs on rail r.
type targetEP struct {
	r   *rail
	qps []*tgtQP
}

// tgtQP is one responder QP and the receives posted on it.
type tgtQP struct {
	qp   railQP
	sess *session
	epID uint32
	idx  uint8
	// Rail owner only: receives posted, whether it is being drained
	// before its destroy, and whether it was destroyed.
	posted  int
	closing bool
	closed  bool
}

// close destroys the QPs on their rail's owner (rail.call).
func (e targetEP) close() {
	e.r.call(func() {
		for _, q := range e.qps {
			e.r.closeTargetQP(q)
		}
	})
}

// respond creates responder QPs on r connected to the initiator's, each
// with receives posted for notifications (a.Notes: the fewest any QP
// got). It runs on r's owner (rail.call).
func (t *Transport) respond(r *rail, s *session, m *connectMsg) (qps []*tgtQP, a acceptMsg, err error) {
	defer func() {
		if err != nil {
			for _, q := range qps {
				r.closeTargetQP(q)
			}
			qps = nil
		}
	}()
	a.Port = portInfo{GID: r.port.GID.GID, LID: lidOf(r.port), MTU: r.port.Attr.ActiveMTU}
	a.Notes = uint16(t.cfg.NotifyDepth)
	for i, q := range m.QPs {
		// A responder sends nothing: the smallest send queue does.
		qp, err := r.v.CreateQP(1, t.cfg.NotifyDepth)
		if err != nil {
			return qps, a, err
		}
		tq := &tgtQP{qp: qp, sess: s, epID: m.ID, idx: uint8(i)}
		qps = append(qps, tq)
		// Receives go on before the QP is connected: the initiator may
		// SEND as soon as it has the accept.
		a.Notes = min(a.Notes, uint16(r.postRecvs(tq, min(t.cfg.NotifyDepth, qp.RecvDepth()))))
		psn := randPSN()
		remote := uverbs.Endpoint{QPN: q.QPN, PSN: q.PSN, GID: m.Port.GID, MTU: m.Port.MTU, LID: m.Port.LID}
		if err := qp.Connect(psn, remote, t.tune()); err != nil {
			return qps, a, fmt.Errorf("connect QP on %s to %s: %w", r.name, m.Port.GID, err)
		}
		a.QPs = append(a.QPs, qpInfo{QPN: qp.QPN(), PSN: psn})
	}
	return qps, a, nil
}

func (ts *targetState) reserve(initiator string, n int) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.perInit[initiator]+n > ts.t.cfg.MaxInitiatorQPs || ts.total+n > ts.t.cfg.MaxTargetQPs {
		return false
	}
	ts.perInit[initiator] += n
	ts.total += n
	return true
}

func (ts *targetState) unreserve(initiator string, n int) {
	ts.mu.Lock()
	ts.unreserveLocked(initiator, n)
	ts.mu.Unlock()
}

func (ts *targetState) unreserveLocked(initiator string, n int) {
	if ts.perInit[initiator] -= n; ts.perInit[initiator] <= 0 {
		delete(ts.perInit, initiator)
	}
	ts.total -= n
}

// dropOlderLocked closes the sessions of s's initiator from another
// epoch: a restarted initiator's old QPs are dead weight.
func (ts *targetState) dropOlderLocked(s *session) {
	for o := range ts.sessions {
		if o != s && o.initiator == s.initiator && o.epoch != s.epoch {
			ts.t.log.Info("rdma: initiator restarted, dropping its old QPs", "initiator", s.initiator, "old_epoch", o.epoch, "qps", o.nqps)
			o.conn.Close() // its serve goroutine destroys the QPs
		}
	}
}

func (ts *targetState) release(s *session, id uint32) {
	ts.mu.Lock()
	e, ok := s.eps[id]
	delete(s.eps, id)
	s.nqps -= len(e.qps)
	ts.unreserveLocked(s.initiator, len(e.qps))
	ts.mu.Unlock()
	if ok {
		e.close()
	}
}

// end destroys a finished session's QPs.
func (ts *targetState) end(s *session) {
	if !s.ended.Swap(true) {
		close(s.done)
	}
	s.conn.Close()
	ts.gate.Leave(s.slot)
	ts.mu.Lock()
	delete(ts.sessions, s)
	eps := s.eps
	s.eps = map[uint32]targetEP{}
	if s.initiator != "" {
		ts.unreserveLocked(s.initiator, s.nqps)
	}
	s.nqps = 0
	ts.mu.Unlock()
	for _, e := range eps {
		e.close()
	}
}

// closeAll ends every session (Close).
func (ts *targetState) closeAll() {
	ts.mu.Lock()
	ts.closed = true
	for s := range ts.sessions {
		s.conn.Close()
	}
	ts.mu.Unlock()
	if ts.gate != nil {
		ts.gate.Close()
	}
}
