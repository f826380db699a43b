package rdma

import (
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/uverbs"
)

// fabric is a scripted RDMA fabric for unit tests: fake devices (railVerbs)
// whose QPs carry RDMA WRITE and READ between registered buffers of this
// process, completions on a CQ with mlx5's single-owner guard (a QP's
// destroy takes it to clean the CQ, and a Poll or Arm that finds it taken
// fails with uverbs.ErrConcurrent) and completion events only when armed.
// Scripts decide per work request whether it completes, fails, waits to be
// released, or is lost.
type fabric struct {
	mu      sync.Mutex
	nextQPN uint32
	nextKey uint32
	qps     map[uverbs.QPN]*fakeQP
	mrs     map[uint32]*fakeMR
	held    []heldWR

	// Scripts (set under mu; setPost sets onPost).
	onPost    func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus)
	onCreate  func(d *fakeDev) error
	onDestroy func(q *fakeQP) // runs with the CQ guard held

	// Observations.
	conflicts atomic.Int64 // Poll and Arm calls refused by the guard
	posted    atomic.Int64
	maxQP     atomic.Int64 // most WRs outstanding on one QP
	maxDev    atomic.Int64 // most WRs outstanding on one device
	rnr       atomic.Int64 // SENDs that found no receive posted
	recvs     atomic.Int64 // receives completed
}

type verdict uint8

const (
	deliver  verdict = iota // execute and complete now
	hold                    // keep in flight until release
	fail                    // complete with the given status
	lose                    // never complete, unless flushed (ToErr)
	landFail                // execute, then complete with the given status (a lost ACK)
)

type heldWR struct {
	q    *fakeQP
	wr   uverbs.SendWR
	sg   uverbs.SGE
	lost bool // release passes it by
}

func newFabric() *fabric {
	return &fabric{nextQPN: 0x100, nextKey: 0x1000, qps: map[uverbs.QPN]*fakeQP{}, mrs: map[uint32]*fakeMR{}}
}

// setPost sets the onPost script (nil: deliver everything).
func (f *fabric) setPost(fn func(q *fakeQP, wr *uverbs.SendWR) (verdict, uverbs.WCStatus)) {
	f.mu.Lock()
	f.onPost = fn
	f.mu.Unlock()
}

// dev returns a new device of the fabric, port up.
func (f *fabric) dev(name string, numa int) *fakeDev {
	f.mu.Lock()
	f.nextKey++
	n := f.nextKey
	f.mu.Unlock()
	d := &fakeDev{f: f, name: name, numa: numa, events: make(chan uverbs.AsyncEvent, 16),
		ev: make(chan struct{}, 1), closed: make(chan struct{}), entries: 4096}
	d.port = uverbs.RCPort{Num: 1, GID: uverbs.GIDEntry{Port: 1, GID: uverbs.GIDFromAddr(netip.AddrFrom16([16]byte{0xfe, 0x80, 14: byte(n >> 8), 15: byte(n)}))},
		Attr:        uverbs.PortAttr{State: uverbs.PortActive, ActiveMTU: uverbs.MTU1024, MaxMTU: uverbs.MTU4096},
		MaxRdAtomic: 16, MaxDestRdAtomic: 16, Defaults: uverbs.RCDefaults{Timeout: 14, RetryCnt: 6}}
	d.up.Store(true)
	return d
}

// opener returns a Transport.open that hands out devs (each once).
func opener(devs ...*fakeDev) func(*Config) ([]railVerbs, error) {
	return func(cfg *Config) ([]railVerbs, error) {
		out := make([]railVerbs, len(devs))
		for i, d := range devs {
			if cfg.CQDepth < d.entries {
				d.entries = cfg.CQDepth
			}
			out[i] = d
		}
		return out, nil
	}
}

// setPort takes d's port down or up: an async event, and while down every
// work request to or from d fails as retry-exceeded (held ones at once).
func (f *fabric) setPort(d *fakeDev, up bool) {
	d.up.Store(up)
	ev := uverbs.AsyncEvent{Type: uverbs.EventPortActive, Port: 1}
	if !up {
		ev.Type = uverbs.EventPortErr
		f.mu.Lock()
		keep := f.held[:0]
		var fails []heldWR
		for _, h := range f.held {
			if p := f.qps[h.q.remote]; h.q.d == d || (p != nil && p.d == d) {
				fails = append(fails, h)
			} else {
				keep = append(keep, h)
			}
		}
		f.held = keep
		f.mu.Unlock()
		for _, h := range fails {
			h.q.complete(&h.wr, uverbs.WCRetryExcErr)
			h.q.nheld.Add(-1)
		}
	}
	select {
	case d.events <- ev:
	default:
	}
}

// release executes up to n held work requests in order (n < 0: all) and
// returns how many it released.
func (f *fabric) release(n int) int {
	f.mu.Lock()
	var rel []heldWR
	keep := f.held[:0]
	for _, h := range f.held {
		if !h.lost && (n < 0 || len(rel) < n) {
			rel = append(rel, h)
		} else {
			keep = append(keep, h)
		}
	}
	f.held = keep
	f.mu.Unlock()
	for _, h := range rel {
		h.q.complete(&h.wr, h.q.execute(&h.wr))
		h.q.nheld.Add(-1)
	}
	return len(rel)
}

// nheld counts the held work requests, lost ones included.
func (f *fabric) nheld() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

// fakeDev is one device port with its CQ.
type fakeDev struct {
	f       *fabric
	name    string
	numa    int
	port    uverbs.RCPort
	up      atomic.Bool
	events  chan uverbs.AsyncEvent
	entries int

	busy    atomic.Bool // the CQ's single-owner guard
	cqMu    sync.Mutex
	cq      []uverbs.WC
	armed   bool
	ev      chan struct{}
	arms    atomic.Int64
	refused atomic.Int64 // Arm calls refused by the guard
	out     atomic.Int64 // WRs outstanding on the device

	closeMu sync.Mutex
	closed  chan struct{}
	done    bool
	nqps    atomic.Int64
	nmrs    atomic.Int64
}

var _ railVerbs = (*fakeDev)(nil)

func (d *fakeDev) Name() string                     { return d.name }
func (d *fakeDev) NUMANode() int                    { return d.numa }
func (d *fakeDev) Port() uverbs.RCPort              { return d.port }
func (d *fakeDev) Events() <-chan uverbs.AsyncEvent { return d.events }
func (d *fakeDev) CQEntries() int                   { return d.entries }

func (d *fakeDev) PortState() (uverbs.PortState, error) {
	if d.up.Load() {
		return uverbs.PortActive, nil
	}
	return uverbs.PortDown, nil
}

func (d *fakeDev) RegMR(b []byte) (memReg, error) {
	f := d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextKey++
	m := &fakeMR{d: d, b: b, addr: engine.AddrOf(b), key: f.nextKey}
	f.mrs[m.key] = m
	d.nmrs.Add(1)
	return m, nil
}

func (d *fakeDev) CreateQP(depth, rdepth int) (railQP, error) {
	f := d.f
	f.mu.Lock()
	onCreate := f.onCreate
	f.mu.Unlock()
	if onCreate != nil {
		if err := onCreate(d); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextQPN++
	q := &fakeQP{d: d, qpn: uverbs.QPN(f.nextQPN), depth: depth, rdepth: max(1, rdepth)}
	q.state.Store(uint32(uverbs.QPStateInit))
	f.qps[q.qpn] = q
	d.nqps.Add(1)
	return q, nil
}

func (d *fakeDev) acquire() bool {
	if d.busy.CompareAndSwap(false, true) {
		return true
	}
	d.f.conflicts.Add(1)
	return false
}

func (d *fakeDev) Poll(wc []uverbs.WC) (int, error) {
	if !d.acquire() {
		return 0, uverbs.ErrConcurrent
	}
	defer d.busy.Store(false)
	d.cqMu.Lock()
	n := copy(wc, d.cq)
	d.cq = append(d.cq[:0], d.cq[n:]...)
	d.cqMu.Unlock()
	return n, nil
}

func (d *fakeDev) Arm() error {
	if !d.acquire() {
		d.refused.Add(1)
		return fmt.Errorf("fake req_notify_cq on %s: %w", d.name, uverbs.ErrConcurrent)
	}
	defer d.busy.Store(false)
	d.arms.Add(1)
	d.cqMu.Lock()
	d.armed = true
	d.cqMu.Unlock()
	return nil
}

func (d *fakeDev) WaitEvent() error {
	select {
	case <-d.ev:
		return nil
	case <-d.closed:
		return uverbs.ErrClosed
	}
}

// push adds a completion; an armed CQ raises one event.
func (d *fakeDev) push(wc uverbs.WC) {
	d.cqMu.Lock()
	d.cq = append(d.cq, wc)
	armed := d.armed
	d.armed = false
	d.cqMu.Unlock()
	if armed {
		select {
		case d.ev <- struct{}{}:
		default:
		}
	}
}

// Close fails while QPs or MRs are open, like uverbs' ErrBusy.
func (d *fakeDev) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.done {
		return nil
	}
	if n, m := d.nqps.Load(), d.nmrs.Load(); n != 0 || m != 0 {
		return fmt.Errorf("fake %s: close with %d QPs and %d MRs open: %w", d.name, n, m, uverbs.ErrBusy)
	}
	d.done = true
	close(d.closed)
	close(d.events)
	return nil
}

type fakeMR struct {
	d    *fakeDev
	b    []byte
	addr uint64
	key  uint32
	once sync.Once
}

func (m *fakeMR) LKey() uint32 { return m.key }
func (m *fakeMR) RKey() uint32 { return m.key }
func (m *fakeMR) Close() error {
	m.once.Do(func() {
		m.d.f.mu.Lock()
		delete(m.d.f.mrs, m.key)
		m.d.f.mu.Unlock()
		m.d.nmrs.Add(-1)
	})
	return nil
}

// bytes returns [addr, addr+n) of the MR with key on d, or nil.
func (f *fabric) bytes(d *fakeDev, key uint32, addr, n uint64) []byte {
	f.mu.Lock()
	m := f.mrs[key]
	f.mu.Unlock()
	if m == nil || m.d != d || addr < m.addr || addr+n > m.addr+uint64(len(m.b)) {
		return nil
	}
	return m.b[addr-m.addr : addr-m.addr+n]
}

type fakeQP struct {
	d      *fakeDev
	qpn    uverbs.QPN
	depth  int
	rdepth int
	remote uverbs.QPN
	// conn is what Connect was given (fabric mu).
	conn struct {
		psn    uverbs.PSN
		remote uverbs.Endpoint
		tune   uverbs.ConnectConfig
	}
	state  atomic.Uint32
	out    atomic.Int64
	closed atomic.Bool
	rq     []fakeRecv // posted receives (fabric mu)
	// nheld counts q's work requests held or being released: a SEND
	// posted meanwhile waits behind them (fabric mu to add).
	nheld atomic.Int64
}

type fakeRecv struct {
	id uint64
	sg uverbs.SGE
}

var _ railQP = (*fakeQP)(nil)

func (q *fakeQP) QPN() uverbs.QPN { return q.qpn }
func (q *fakeQP) SendDepth() int  { return q.depth }
func (q *fakeQP) RecvDepth() int  { return q.rdepth }

// PostRecv queues receives; a SEND to q takes the oldest. In the error
// state they flush.
func (q *fakeQP) PostRecv(wrs []uverbs.RecvWR) (int, error) {
	if q.closed.Load() {
		return 0, uverbs.ErrClosed
	}
	f := q.d.f
	n, err := 0, error(nil)
	f.mu.Lock()
	for _, wr := range wrs {
		if len(q.rq) >= q.rdepth {
			err = uverbs.ErrQueueFull
			break
		}
		if len(wr.SGL) != 1 {
			err = uverbs.ErrTooManySGE
			break
		}
		q.rq = append(q.rq, fakeRecv{wr.ID, wr.SGL[0]})
		n++
	}
	f.mu.Unlock()
	if uverbs.QPState(q.state.Load()) == uverbs.QPStateErr {
		q.flushRecvs()
	}
	return n, err
}

// flushRecvs completes q's posted receives as flushed (error state).
func (q *fakeQP) flushRecvs() {
	f := q.d.f
	f.mu.Lock()
	rq := q.rq
	q.rq = nil
	f.mu.Unlock()
	for _, r := range rq {
		q.d.push(uverbs.WC{ID: r.id, Status: uverbs.WCWRFlushErr, Opcode: uverbs.WCRecv, QPN: q.qpn})
	}
}

// heldOn reports whether the fabric holds (or is releasing) a work
// request of q (fabric mu): RC executes a QP's work requests in order,
// so a SEND posted behind held ones waits for them.
func (f *fabric) heldOn(q *fakeQP) bool { return q.nheld.Load() > 0 }

func (q *fakeQP) peer() *fakeQP {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	return q.d.f.qps[q.remote]
}

func (q *fakeQP) Connect(psn uverbs.PSN, remote uverbs.Endpoint, tune uverbs.ConnectConfig) error {
	if q.closed.Load() {
		return uverbs.ErrClosed
	}
	if !q.state.CompareAndSwap(uint32(uverbs.QPStateInit), uint32(uverbs.QPStateRTS)) {
		return fmt.Errorf("fake connect QP %#x in state %v: %w", uint32(q.qpn), uverbs.QPState(q.state.Load()), uverbs.ErrQPState)
	}
	q.remote = remote.QPN
	q.d.f.mu.Lock()
	q.conn.psn, q.conn.remote, q.conn.tune = psn, remote, tune
	q.d.f.mu.Unlock()
	return nil
}

func (q *fakeQP) PostSend(wrs []uverbs.SendWR) (int, error) {
	if q.closed.Load() {
		return 0, uverbs.ErrClosed
	}
	if s := uverbs.QPState(q.state.Load()); s != uverbs.QPStateRTS && s != uverbs.QPStateErr {
		return 0, uverbs.ErrQPState
	}
	f := q.d.f
	for i := range wrs {
		wr := &wrs[i]
		f.posted.Add(1)
		if o := q.out.Add(1); o > int64(q.depth) {
			panic(fmt.Sprintf("fake QP %#x: %d WRs outstanding on a send queue of %d", uint32(q.qpn), o, q.depth))
		} else {
			atomicMax(&f.maxQP, o)
		}
		atomicMax(&f.maxDev, q.d.out.Add(1))
		if uverbs.QPState(q.state.Load()) == uverbs.QPStateErr {
			q.complete(wr, uverbs.WCWRFlushErr)
			continue
		}
		v, st := deliver, uverbs.WCSuccess
		f.mu.Lock()
		onPost := f.onPost
		behind := wr.Opcode == uverbs.WRSend && f.heldOn(q)
		f.mu.Unlock()
		if onPost != nil {
			v, st = onPost(q, wr)
		}
		if v == deliver && behind {
			v = hold
		}
		switch v {
		case deliver:
			q.complete(wr, q.execute(wr))
		case fail:
			q.complete(wr, st)
		case landFail:
			q.execute(wr)
			q.complete(wr, st)
		case hold:
			f.mu.Lock()
			h := heldWR{q: q, wr: *wr, sg: wr.SGL[0]}
			h.wr.SGL = []uverbs.SGE{h.sg} // the rail reuses its SGE array
			f.held = append(f.held, h)
			q.nheld.Add(1)
			f.mu.Unlock()
		}
	}
	return len(wrs), nil
}

// execute moves the bytes of wr and returns its completion status.
func (q *fakeQP) execute(wr *uverbs.SendWR) uverbs.WCStatus {
	f := q.d.f
	if uverbs.QPState(q.state.Load()) == uverbs.QPStateErr || q.closed.Load() {
		return uverbs.WCWRFlushErr
	}
	p := q.peer()
	if !q.d.up.Load() || p == nil || p.closed.Load() || !p.d.up.Load() || uverbs.QPState(p.state.Load()) != uverbs.QPStateRTS {
		return uverbs.WCRetryExcErr
	}
	sg := wr.SGL[0]
	local := f.bytes(q.d, uint32(sg.LKey), sg.Addr, uint64(sg.Length))
	if local == nil {
		return uverbs.WCLocProtErr
	}
	if wr.Opcode == uverbs.WRSend {
		return q.send(p, local)
	}
	remote := f.bytes(p.d, uint32(wr.RKey), wr.RemoteAddr, uint64(sg.Length))
	if remote == nil {
		return uverbs.WCRemAccessErr
	}
	switch wr.Opcode {
	case uverbs.WRRDMAWrite:
		copy(remote, local)
	case uverbs.WRRDMARead:
		copy(local, remote)
	default:
		return uverbs.WCRemInvReqErr
	}
	return uverbs.WCSuccess
}

// send delivers a SEND's bytes into p's oldest posted receive and
// completes that receive on p's CQ; with none posted it fails as RNR
// retries exceeded (RC with a finite rnr_retry).
func (q *fakeQP) send(p *fakeQP, b []byte) uverbs.WCStatus {
	f := q.d.f
	f.mu.Lock()
	if len(p.rq) == 0 {
		f.mu.Unlock()
		f.rnr.Add(1)
		return uverbs.WCRNRRetryExcErr
	}
	r := p.rq[0]
	p.rq = p.rq[:copy(p.rq, p.rq[1:])]
	f.mu.Unlock()
	dst := f.bytes(p.d, uint32(r.sg.LKey), r.sg.Addr, uint64(r.sg.Length))
	if dst == nil || len(b) > len(dst) {
		p.d.push(uverbs.WC{ID: r.id, Status: uverbs.WCLocLenErr, Opcode: uverbs.WCRecv, QPN: p.qpn})
		return uverbs.WCRemInvReqErr
	}
	copy(dst, b)
	f.recvs.Add(1)
	p.d.push(uverbs.WC{ID: r.id, Status: uverbs.WCSuccess, Opcode: uverbs.WCRecv, QPN: p.qpn, ByteLen: uint32(len(b))})
	return uverbs.WCSuccess
}

func (q *fakeQP) complete(wr *uverbs.SendWR, st uverbs.WCStatus) {
	if st.AccessDenied() {
		// As RC does: a refused work request moves its QP to the error
		// state, and what was posted behind it flushes. (Other failures
		// leave the rail to break the endpoint, as the tests expect.)
		q.state.Store(uint32(uverbs.QPStateErr))
	}
	q.out.Add(-1)
	q.d.out.Add(-1)
	op := uverbs.WCRDMAWrite
	switch wr.Opcode {
	case uverbs.WRRDMARead:
		op = uverbs.WCRDMARead
	case uverbs.WRSend:
		op = uverbs.WCSend
	}
	q.d.push(uverbs.WC{ID: wr.ID, Status: st, Opcode: op, QPN: q.qpn, ByteLen: wr.SGL[0].Length})
}

// ToErr flushes what the fabric holds for q.
func (q *fakeQP) ToErr() error {
	if q.closed.Load() {
		return uverbs.ErrClosed
	}
	q.state.Store(uint32(uverbs.QPStateErr))
	f := q.d.f
	f.mu.Lock()
	keep := f.held[:0]
	var flush []heldWR
	for _, h := range f.held {
		if h.q == q {
			flush = append(flush, h)
		} else {
			keep = append(keep, h)
		}
	}
	f.held = keep
	f.mu.Unlock()
	for _, h := range flush {
		q.complete(&h.wr, uverbs.WCWRFlushErr)
		q.nheld.Add(-1)
	}
	q.flushRecvs()
	return nil
}

// Close destroys q as mlx5 does: under the CQ's owner guard, its unpolled
// completions are cleaned out; what the fabric held for it never
// completes.
func (q *fakeQP) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	d, f := q.d, q.d.f
	for !d.busy.CompareAndSwap(false, true) {
		runtime.Gosched()
	}
	f.mu.Lock()
	onDestroy := f.onDestroy
	f.mu.Unlock()
	if onDestroy != nil {
		onDestroy(q)
	}
	d.cqMu.Lock()
	keep := d.cq[:0]
	for _, wc := range d.cq {
		if wc.QPN != q.qpn {
			keep = append(keep, wc)
		}
	}
	d.cq = keep
	d.cqMu.Unlock()
	d.busy.Store(false)
	f.mu.Lock()
	delete(f.qps, q.qpn)
	q.rq = nil
	kept := f.held[:0]
	for _, h := range f.held {
		if h.q != q {
			kept = append(kept, h)
		}
	}
	f.held = kept
	f.mu.Unlock()
	d.nqps.Add(-1)
	return nil
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		o := a.Load()
		if v <= o || a.CompareAndSwap(o, v) {
			return
		}
	}
}
