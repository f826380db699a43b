package mlx5sim

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/internal/unix"
	"github.com/rdmago/te/uverbs"
)

// Fabric is a set of simulated ConnectX devices with one RoCE port each,
// all reachable from each other, and the HCA that runs their queues.
type Fabric struct {
	mu      sync.Mutex // guards everything below; the HCA holds it per pass
	devs    map[string]*device
	qps     map[uint32]*qp // by QPN, fabric-wide
	cqs     map[uint32]*cq // by CQN
	mrs     map[uint32]*mr // by key (lkey == rkey)
	ctxs    map[*kctx]struct{}
	nextQPN uint32
	nextCQN uint32
	nextKey uint32
	policy  func(WQE) Verdict
	closed  bool
	scratch []byte // gather's buffer

	poke chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

// device is one simulated ConnectX.
type device struct {
	ud   uverbs.Device
	name string
	idx  int
	gid  uverbs.GID
	n    Counters
	down bool // the port's link is down
}

// Counters are what a device's HCA did.
type Counters struct {
	WQEs   uint64 // send WQEs executed (or failed)
	CQEs   uint64 // CQEs written on the device's CQs
	Events uint64 // completion events raised on its channels
}

// WQE describes a send work request the HCA is about to execute, for a
// policy.
type WQE struct {
	Device string // the device of the posting QP
	QPN    uint32
	Opcode uint8 // the mlx5 send opcode (0x08 RDMA WRITE, 0x0a SEND, 0x10 READ, ...)
	Index  uint16
}

// Verdict is a policy's answer for one WQE.
type Verdict uint8

const (
	// Execute runs the WQE now.
	Execute Verdict = iota
	// Hold keeps it (and the QP's later WQEs) in flight until Release.
	Hold
)

// NewFabric starts an empty fabric's HCA; Close stops it.
func NewFabric() *Fabric {
	f := &Fabric{devs: map[string]*device{}, qps: map[uint32]*qp{}, cqs: map[uint32]*cq{}, mrs: map[uint32]*mr{},
		ctxs: map[*kctx]struct{}{}, nextQPN: 0x1c0, nextCQN: 0x400, nextKey: 0x2000,
		poke: make(chan struct{}, 1), stop: make(chan struct{})}
	f.wg.Add(1)
	go f.run()
	return f
}

// GIDIndex is the index of each simulated port's one GID (RoCE v2).
const GIDIndex = 3

// AddDevice adds a device named name (its port's RoCE v2 GID maps
// 127.77.0.N, N its number: a loopback address, so a control port
// bound to it is reachable on any host) and returns it as uverbs lists devices: driver
// mlx5, ABI version 1, one port, no NUMA node.
func (f *Fabric) AddDevice(name string) uverbs.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := &device{name: name, idx: len(f.devs) + 1}
	d.gid = uverbs.GIDFromAddr(netip.AddrFrom4([4]byte{127, 77, 0, byte(d.idx)}))
	d.ud = uverbs.Device{Name: name, Uverbs: "uverbs-sim", Path: "/nonexistent/mlx5sim/" + name,
		DriverID: uverbs.DriverMLX5, ABIVersion: 1, DriverIDFrom: "mlx5sim", Ports: 1, NUMANode: -1,
		NodeGUID: fmt.Sprintf("e41d:2d03:00%02x:0001", d.idx)}
	f.devs[name] = d
	return d.ud
}

// Devices lists the fabric's devices by name (uverbs.Options.Devices).
func (f *Fabric) Devices() ([]uverbs.Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]uverbs.Device, 0, len(f.devs))
	for _, d := range f.devs {
		out = append(out, d.ud)
	}
	slices.SortFunc(out, func(a, b uverbs.Device) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Options returns uverbs options that find and open this fabric's
// devices (and no others) with the given providers (mlx5's, possibly
// wrapped).
func (f *Fabric) Options(providers ...uverbs.Provider) *uverbs.Options {
	return &uverbs.Options{Providers: providers, OpenFile: f.Open, Devices: f.Devices}
}

// Open opens a command file on device d (uverbs.Options.OpenFile).
func (f *Fabric) Open(d uverbs.Device) (uverbs.CommandFile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, fmt.Errorf("mlx5sim: open %s: %w", d.Name, uverbs.ErrClosed)
	}
	dev := f.devs[d.Name]
	if dev == nil {
		return nil, fmt.Errorf("mlx5sim: no device %q on this fabric (AddDevice first): %w", d.Name, uverbs.ErrNoDevice)
	}
	uar, err := dma.AllocShared(uarPages * pageSizeStatic)
	if err != nil {
		return nil, fmt.Errorf("mlx5sim: UAR pages of %s: %w", d.Name, err)
	}
	k := &kctx{f: f, dev: dev, uar: uar, asyncW: -1, pds: map[uint32]bool{}, mrs: map[uint32]*mr{},
		cqs: map[uint32]*cq{}, qps: map[uint32]*qp{}, chans: map[int32]int{}}
	f.ctxs[k] = struct{}{}
	return k, nil
}

// SetPolicy sets the function asked about every send WQE before the HCA
// executes it (nil: execute all). It runs with the fabric locked and must
// not call the Fabric.
func (f *Fabric) SetPolicy(fn func(WQE) Verdict) {
	f.mu.Lock()
	f.policy = fn
	f.mu.Unlock()
}

// Release lets every held WQE execute (without asking the policy again)
// and returns how many it released.
func (f *Fabric) Release() int {
	f.mu.Lock()
	n := 0
	for _, q := range f.qps {
		if q.held {
			q.held, q.released = false, true
			n++
		}
	}
	f.mu.Unlock()
	f.kick()
	return n
}

// Held is the number of WQEs held by the policy.
func (f *Fabric) Held() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, q := range f.qps {
		if q.held {
			n++
		}
	}
	return n
}

// SetPort takes device name's port down (up false) or back up: every
// context on the device gets the async event (PORT_ERR, PORT_ACTIVE),
// QUERY_PORT reports the state, and while it is down every work request
// from or to the device completes with a retry-exceeded error, as on a
// link that carries nothing.
func (f *Fabric) SetPort(name string, up bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.devs[name]
	if d == nil {
		return fmt.Errorf("mlx5sim: no device %q on this fabric: %w", name, uverbs.ErrNoDevice)
	}
	if d.down == !up {
		return nil
	}
	d.down = !up
	ev := uverbs.EventPortErr
	if up {
		ev = uverbs.EventPortActive
	}
	var rec [16]byte
	le.PutUint64(rec[:], 1) // the port
	le.PutUint32(rec[8:], uint32(ev))
	for k := range f.ctxs {
		if k.dev == d && k.asyncW >= 0 {
			unix.Write(k.asyncW, rec[:])
		}
	}
	f.kick()
	return nil
}

// Counters returns what device name's HCA did so far.
func (f *Fabric) Counters(name string) Counters {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.devs[name]; d != nil {
		return d.n
	}
	return Counters{}
}

// Close stops the HCA. Contexts still open keep answering commands but
// their queues no longer run. Idempotent.
func (f *Fabric) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	close(f.stop)
	f.wg.Wait()
	return nil
}

func (f *Fabric) kick() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

// run is the HCA: a pass over every QP and CQ, then, when nothing moved,
// a sleep growing from 20 µs to 1 ms (a command or Release cuts it short).
func (f *Fabric) run() {
	defer f.wg.Done()
	idle := 20 * time.Microsecond
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		f.mu.Lock()
		moved := f.pass()
		f.mu.Unlock()
		if moved {
			idle = 20 * time.Microsecond
			select {
			case <-f.stop:
				return
			default:
			}
			continue
		}
		t.Reset(idle)
		select {
		case <-f.stop:
			return
		case <-f.poke:
			idle = 20 * time.Microsecond
		case <-t.C:
			idle = min(2*idle, time.Millisecond)
		}
	}
}

// pass runs every QP's queues and raises due completion events; it reports
// whether anything moved.
func (f *Fabric) pass() bool {
	moved := false
	for k := range f.ctxs {
		k.readArmDoorbell()
	}
	for _, q := range f.qps {
		if f.runQP(q) {
			moved = true
		}
	}
	for _, c := range f.cqs {
		c.checkArm()
		if c.fire() {
			moved = true
		}
	}
	return moved
}

// ---- objects -------------------------------------------------------------

type mr struct {
	k      *kctx
	handle uint32
	key    uint32
	pd     uint32
	addr   uint64
	length uint64
	access uint32
}

// bytes returns the registered memory [addr, addr+n) if the MR covers it
// and grants need (0 for local reads).
func (m *mr) bytes(addr uint64, n uint32, need uint32) ([]byte, bool) {
	if m == nil || m.access&need != need || addr < m.addr || addr+uint64(n) > m.addr+m.length || addr+uint64(n) < addr {
		return nil, false
	}
	return dma.At(addr, int(n)), true
}

type cq struct {
	k      *kctx
	handle uint32
	cqn    uint32
	uh     uint64 // the user handle completion events carry
	buf    []byte
	cnt    uint32
	rec    []byte
	pi     uint32 // CQEs written, free running
	chW    int    // write end of the completion channel, -1: none
	nqps   int
	n      *Counters // of the device

	lastArm   uint32 // the arm request last acted on (record or doorbell)
	armedOnce bool
	armed     bool
	armCI     uint32
	solicited bool
	solHit    bool    // a solicited or error CQE landed since a solicited-only arm
	ev        [8]byte // the event record (no allocation per event)
}

// record reads a big-endian doorbell-record word.
func record(b []byte, off int) uint32 { return bits.ReverseBytes32(dma.LoadAcquire32(b, off)) }

// room reports whether n more CQEs fit before the consumer index.
func (c *cq) room(n uint32) bool {
	ci := record(c.rec, cqRecSetCI) & 0xffffff
	return (c.pi-ci)&0xffffff+n <= c.cnt
}

// emit writes one CQE at the producer index with this pass's owner bit;
// the last word (wqe_counter, signature, op_own) goes last, in one ordered
// store, as the device makes an entry valid. The caller checked room.
func (c *cq) emit(e *[cqeSize]byte, solicited bool) {
	off := int(c.pi&(c.cnt-1)) * cqeSize
	op := e[cqeOpOwn] &^ 1
	if c.pi&c.cnt != 0 {
		op |= 1
	}
	e[cqeOpOwn] = op
	copy(c.buf[off:off+60], e[:60])
	dma.StoreRelease32(c.buf, off+60, uint32(e[60])|uint32(e[61])<<8|uint32(e[62])<<16|uint32(e[63])<<24)
	c.pi++
	c.n.CQEs++
	if c.armed && c.solicited && (solicited || op>>4 == cqeReqErr || op>>4 == cqeRespErr) {
		c.solHit = true
	}
}

// checkArm notices an arm request through the CQ's arm record.
func (c *cq) checkArm() {
	if v := record(c.rec, cqRecArm); v != c.lastArm {
		c.arm(v)
	}
}

func (c *cq) arm(v uint32) {
	c.lastArm, c.armedOnce = v, true
	c.armed, c.armCI, c.solicited, c.solHit = true, v&0xffffff, v&armSolicited != 0, false
}

// fire raises the completion event of an armed CQ that holds a CQE at or
// past the consumer index it was armed at (for solicited-only, once a
// solicited or error CQE landed), and disarms it.
func (c *cq) fire() bool {
	if !c.armed || c.chW < 0 || (c.pi-c.armCI)&0xffffff == 0 || (c.solicited && !c.solHit) {
		return false
	}
	c.armed = false
	le.PutUint64(c.ev[:], c.uh)
	unix.Write(c.chW, c.ev[:]) // a pipe of 64 KiB; a reader that went away is no error
	c.n.Events++
	return true
}

type qp struct {
	k        *kctx
	handle   uint32
	qpn      uint32
	uidx     uint32
	pd       uint32
	sq, rq   []byte
	sqCnt    uint32
	rqCnt    uint32
	rqShift  uint32
	rec      []byte
	scq, rcq *cq
	state    uint8
	remote   uint32
	sqPI     uint32 // WQEBBs consumed
	rqCI     uint32 // receives consumed
	held     bool
	released bool
	// retry is how long the QP retransmits to a peer that does not answer
	// (uverbs.RetryBound of its ACK timeout and retry count) before its
	// work completes with retry-exceeded; failAt is when the head WQE,
	// unanswered since, runs out.
	retry  time.Duration
	failAt time.Time
	// rnrRetry is the QP's RNR retry count (7: for ever); rnrAt is when
	// the head SEND, refused for want of a receive since, runs out.
	rnrRetry uint8
	rnrAt    time.Time
}

// rnrDelay is the simulated wait between two RNR retries.
const rnrDelay = time.Millisecond

// runQP executes the QP's announced WQEs in order (RTS), or flushes them
// and its receives (ERR).
func (f *Fabric) runQP(q *qp) bool {
	switch q.state {
	case stateErr:
		return f.flush(q)
	case stateRTS:
	default:
		return false
	}
	moved := false
	pi := record(q.rec, qpRecSend) & 0xffff
	for uint16(q.sqPI) != uint16(pi) && q.state == stateRTS {
		if !q.scq.room(1) {
			break
		}
		ctrl := int(q.sqPI&(q.sqCnt-1)) * wqebb
		w0, w1 := be.Uint32(q.sq[ctrl:]), be.Uint32(q.sq[ctrl+4:])
		op, ds, fm := uint8(w0), w1&0x3f, q.sq[ctrl+11]
		// A peer that is gone, or a link that is down at either end,
		// answers nothing: the QP retransmits until its retries run out
		// (unless the link comes back first), then fails the WQE and
		// moves to the error state.
		if r := f.qps[q.remote]; r == nil || (r.state != stateRTR && r.state != stateRTS) || r.remote != q.qpn || q.k.dev.down || r.k.dev.down {
			now := time.Now()
			if q.failAt.IsZero() {
				q.failAt = now.Add(q.retry)
			}
			if now.Before(q.failAt) {
				break
			}
			q.failAt, q.held, q.released = time.Time{}, false, false
			var e [cqeSize]byte
			fillCQE(&e, cqeReqErr, q, uint16(q.sqPI))
			e[cqeSyndrome] = syndRetryExceeded
			q.scq.emit(&e, false)
			q.state = stateErr
			q.sqPI += (ds*dsSize + wqebb - 1) / wqebb
			q.k.dev.n.WQEs++
			moved = true
			break
		}
		q.failAt = time.Time{}
		if q.held {
			break
		}
		if !q.released && f.policy != nil && f.policy(WQE{Device: q.k.dev.name, QPN: q.qpn, Opcode: op, Index: uint16(q.sqPI)}) == Hold {
			q.held = true
			break
		}
		synd, length, wait := f.execute(q, ctrl, op, int(ds), be.Uint32(q.sq[ctrl+12:]), fm)
		if wait {
			// RNR: the peer has no receive posted. Try again later, for
			// ever with rnr_retry 7, else until the retries run out.
			now := time.Now()
			if q.rnrRetry == 7 {
				break
			}
			if q.rnrAt.IsZero() {
				q.rnrAt = now.Add(time.Duration(q.rnrRetry+1) * rnrDelay)
			}
			if now.Before(q.rnrAt) {
				break
			}
			synd, wait = syndRNRRetryExceeded, false
		}
		q.rnrAt = time.Time{}
		q.released = false
		q.k.dev.n.WQEs++
		moved = true
		var e [cqeSize]byte
		switch {
		case synd != 0:
			fillCQE(&e, cqeReqErr, q, uint16(q.sqPI))
			e[cqeSyndrome] = synd
			q.scq.emit(&e, false)
			q.state = stateErr // the rest flushes
		case fm&fmCQUpdate != 0:
			fillCQE(&e, cqeReq, q, uint16(q.sqPI))
			e[cqeSopDropQPN] = op
			if op == opRDMARead {
				be.PutUint32(e[cqeByteCnt:], length)
			}
			q.scq.emit(&e, false)
		}
		q.sqPI += (ds*dsSize + wqebb - 1) / wqebb
	}
	return moved
}

// fillCQE starts a CQE of opcode op for q (QPN, user index, WQE counter).
func fillCQE(e *[cqeSize]byte, op uint8, q *qp, counter uint16) {
	be.PutUint32(e[cqeUIdx:], q.uidx&0xffffff)
	be.PutUint32(e[cqeSopDropQPN:], q.qpn&0xffffff)
	be.PutUint16(e[cqeWQECounter:], counter)
	e[cqeOpOwn] = op << 4
}

// flush completes every announced send WQE and posted receive of a QP in
// the error state with a flush error.
func (f *Fabric) flush(q *qp) bool {
	moved := false
	q.held, q.released = false, false
	pi := record(q.rec, qpRecSend) & 0xffff
	for uint16(q.sqPI) != uint16(pi) && q.scq.room(1) {
		ctrl := int(q.sqPI&(q.sqCnt-1)) * wqebb
		ds := be.Uint32(q.sq[ctrl+4:]) & 0x3f
		var e [cqeSize]byte
		fillCQE(&e, cqeReqErr, q, uint16(q.sqPI))
		e[cqeSyndrome] = syndFlush
		q.scq.emit(&e, false)
		q.sqPI += (ds*dsSize + wqebb - 1) / wqebb
		moved = true
	}
	rpi := record(q.rec, qpRecRecv) & 0xffff
	for uint16(q.rqCI) != uint16(rpi) && q.rcq.room(1) {
		var e [cqeSize]byte
		fillCQE(&e, cqeRespErr, q, uint16(q.rqCI))
		e[cqeSyndrome] = syndFlush
		q.rcq.emit(&e, false)
		q.rqCI++
		moved = true
	}
	return moved
}

// segment reads the 16-byte segment at p of the send queue (segments of a
// WQE may wrap past its end).
func (q *qp) segment(p int) []byte {
	p %= len(q.sq)
	return q.sq[p : p+dsSize]
}

// gather collects the payload of a WQE's data segments (or its inline
// data) from registered local memory into the fabric's scratch buffer
// (valid until the next gather); ok is false on a bad lkey or range.
func (f *Fabric) gather(q *qp, p, n int) (data []byte, ok bool) {
	if n <= 0 {
		return nil, true
	}
	data = f.scratch[:0]
	defer func() { f.scratch = data[:0] }() // grown once, reused: the HCA allocates nothing per WQE
	if hdr := be.Uint32(q.segment(p)); hdr&inlineBit != 0 {
		length := int(hdr &^ inlineBit)
		for off := 4; len(data) < length; off++ {
			pos := (p + off) % len(q.sq)
			data = append(data, q.sq[pos])
		}
		return data, true
	}
	for i := range n {
		s := q.segment(p + i*dsSize)
		length, lkey, addr := be.Uint32(s), be.Uint32(s[4:]), be.Uint64(s[8:])
		m := f.mrs[lkey]
		if m == nil || m.k != q.k || m.pd != q.pd {
			return nil, false
		}
		b, ok := m.bytes(addr, length, 0)
		if !ok {
			return nil, false
		}
		data = append(data, b...)
	}
	return data, true
}

// scatterLocal writes data into a WQE's data segments (an RDMA READ's
// destination); ok is false on a bad lkey, range or missing local write.
func (f *Fabric) scatterLocal(q *qp, p, n int, data []byte) bool {
	seg := func(i int) ([]byte, bool) {
		s := q.segment(p + i*dsSize)
		length, lkey, addr := be.Uint32(s), be.Uint32(s[4:]), be.Uint64(s[8:])
		m := f.mrs[lkey]
		if m == nil || m.k != q.k || m.pd != q.pd {
			return nil, false
		}
		return m.bytes(addr, length, accessLocalWrite)
	}
	total := 0
	for i := range n { // check every segment before writing any
		b, ok := seg(i)
		if !ok {
			return false
		}
		total += len(b)
	}
	if total < len(data) {
		return false
	}
	for i := range n {
		b, _ := seg(i)
		data = data[copy(b, data):]
	}
	return true
}

// execute carries out one send WQE of q. It returns an error syndrome (0:
// success), the bytes moved, and wait when the peer has no receive posted.
func (f *Fabric) execute(q *qp, ctrl int, op uint8, ds int, imm uint32, fm uint8) (synd uint8, length uint32, wait bool) {
	r := f.qps[q.remote] // connected and reachable: runQP checked
	p := ctrl + dsSize
	n := ds - 1
	var raddr uint64
	var rkey uint32
	switch op {
	case opRDMAWrite, opRDMAWriteImm, opRDMARead:
		s := q.segment(p)
		raddr, rkey = be.Uint64(s), be.Uint32(s[8:])
		p, n = p+dsSize, n-1
	case opAtomicCS, opAtomicFA:
		return f.atomic(q, r, p, op)
	case opSend, opSendImm:
	default:
		return syndRemoteInvalReq, 0, false // not modelled
	}
	if op == opRDMARead {
		var total uint32
		for i := range n {
			total += be.Uint32(q.segment(p + i*dsSize))
		}
		m := f.mrs[rkey]
		if m == nil || m.k != r.k || m.pd != r.pd {
			return syndRemoteAccess, 0, false
		}
		src, ok := m.bytes(raddr, total, accessRemoteRead)
		if !ok {
			return syndRemoteAccess, 0, false
		}
		if !f.scatterLocal(q, p, n, src) {
			return syndLocalProt, 0, false
		}
		return 0, total, false
	}
	data, ok := f.gather(q, p, n)
	if !ok {
		return syndLocalProt, 0, false
	}
	if op == opRDMAWrite || op == opRDMAWriteImm {
		m := f.mrs[rkey]
		if m == nil || m.k != r.k || m.pd != r.pd {
			return syndRemoteAccess, 0, false
		}
		dst, ok := m.bytes(raddr, uint32(len(data)), accessRemoteWrite)
		if !ok {
			return syndRemoteAccess, 0, false
		}
		if op == opRDMAWrite {
			copy(dst, data)
			return 0, uint32(len(data)), false
		}
		if !f.canReceive(r) {
			return 0, 0, true
		}
		copy(dst, data)
		f.receive(r, q, cqeRespWrImm, nil, uint32(len(data)), imm, fm&fmSolicited != 0)
		return 0, uint32(len(data)), false
	}
	if !f.canReceive(r) {
		return 0, 0, true
	}
	opc := uint8(cqeRespSend)
	if op == opSendImm {
		opc = cqeRespSendImm
	}
	if !f.receive(r, q, opc, data, uint32(len(data)), imm, fm&fmSolicited != 0) {
		return syndRemoteInvalReq, 0, false
	}
	return 0, uint32(len(data)), false
}

// atomic runs a compare-and-swap or fetch-and-add on the 8 aligned bytes
// at the remote address, in host byte order (as the verbs conformance
// suite reads them), and writes the old value into the local segment.
func (f *Fabric) atomic(q, r *qp, p int, op uint8) (synd uint8, length uint32, wait bool) {
	s, a, d := q.segment(p), q.segment(p+dsSize), q.segment(p+2*dsSize)
	raddr, rkey := be.Uint64(s), be.Uint32(s[8:])
	swapAdd, compare := be.Uint64(a), be.Uint64(a[8:])
	m := f.mrs[rkey]
	if m == nil || m.k != r.k || m.pd != r.pd || raddr%8 != 0 {
		return syndRemoteAccess, 0, false
	}
	remote, ok := m.bytes(raddr, 8, accessRemoteAtomic)
	if !ok {
		return syndRemoteAccess, 0, false
	}
	lm := f.mrs[be.Uint32(d[4:])]
	if lm == nil || lm.k != q.k || lm.pd != q.pd || be.Uint32(d) != 8 {
		return syndLocalProt, 0, false
	}
	local, ok := lm.bytes(be.Uint64(d[8:]), 8, accessLocalWrite)
	if !ok {
		return syndLocalProt, 0, false
	}
	old := le.Uint64(remote)
	switch {
	case op == opAtomicFA:
		le.PutUint64(remote, old+swapAdd)
	case old == compare:
		le.PutUint64(remote, swapAdd)
	}
	le.PutUint64(local, old)
	return 0, 8, false
}

// canReceive reports whether r has a receive posted and room on its CQ.
func (f *Fabric) canReceive(r *qp) bool {
	return uint16(r.rqCI) != uint16(record(r.rec, qpRecRecv)&0xffff) && r.rcq.room(1)
}

// receive consumes r's oldest receive for a message from q: data (nil for
// WRITE with immediate) scattered into its buffers, then a CQE on r's
// receive CQ. It reports false, completing the receive with a length
// error, when the buffers are too small or not r's memory.
func (f *Fabric) receive(r, q *qp, op uint8, data []byte, length, imm uint32, solicited bool) bool {
	slot := int(r.rqCI&(r.rqCnt-1)) << r.rqShift
	r.rqCI++
	var e [cqeSize]byte
	fillCQE(&e, op, r, 0)
	rest := data
	ok := true
	for p := slot; p < slot+1<<r.rqShift && len(rest) > 0; p += dsSize {
		length, lkey, addr := be.Uint32(r.rq[p:]), be.Uint32(r.rq[p+4:]), be.Uint64(r.rq[p+8:])
		if lkey == invalidLKey {
			break
		}
		m := f.mrs[lkey]
		if m == nil || m.k != r.k || m.pd != r.pd {
			ok = false
			break
		}
		b, good := m.bytes(addr, min(length, uint32(len(rest))), accessLocalWrite)
		if !good {
			ok = false
			break
		}
		rest = rest[copy(b, rest):]
	}
	if !ok || len(rest) > 0 {
		fillCQE(&e, cqeRespErr, r, 0)
		e[cqeSyndrome] = syndLocalLength
		r.rcq.emit(&e, false)
		r.state = stateErr
		return false
	}
	be.PutUint32(e[cqeByteCnt:], length)
	be.PutUint32(e[cqeImm:], imm)
	be.PutUint32(e[cqeFlagsRQPN:], 2<<28|q.qpn&0xffffff) // RoCE v2 GRH
	r.rcq.emit(&e, solicited)
	return true
}

var errBusy = errors.New("mlx5sim: object in use")
