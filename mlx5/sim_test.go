//go:build amd64 || arm64

package mlx5

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

// simRig is a QP and a CQ built exactly as the provider builds them, over
// mmap'd memory, with an anonymous page standing in for the UAR.
type simRig struct {
	qpObj  *QP // the provider objects whose rings qp and cq point into
	cqObj  *CQ
	qp     *qpRings
	cq     *cqRing
	qpRec  []byte
	cqRec  []byte
	uar    []byte
	hca    *simHCA
	bufs   []byte // registered-memory stand-in for SGEs and inline payloads
	lookup singleQP
}

func newSimRig(t testing.TB, caps uverbs.QPCaps, cqWant uint32, bfRegSize uint32) *simRig {
	t.Helper()
	sl, err := sqSize(caps.MaxSendWR, caps.MaxSendSGE, caps.MaxInlineData, 512, 1<<15)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := rqSize(caps.MaxRecvWR, caps.MaxRecvSGE, 512, 1<<15)
	if err != nil {
		t.Fatal(err)
	}
	r := &simRig{qpRec: mapped(t, 64), cqRec: mapped(t, 64), uar: mapped(t, 4096), bufs: mapped(t, 1<<16)}
	r.qpObj = &QP{}
	r.qp = &r.qpObj.r
	r.qp.init(mapped(t, (int(rl.cnt)<<rl.shift)+int(sl.cnt)*sendWQEBB), sl, rl, r.qpRec, false)
	r.qp.uidx = 77
	r.qp.sq.qpn = 0x2a2a2a
	db := &bfreg{reg: [2]*uint64{word64(r.uar, bfOffset), word64(r.uar, bfOffset)}}
	if bfRegSize > 0 {
		db.bfHalf = bfRegSize / 2
		db.reg[1] = word64(r.uar, bfOffset+int(db.bfHalf))
	}
	r.qp.db = db
	n, err := cqEntries(cqWant, 0)
	if err != nil {
		t.Fatal(err)
	}
	cqBuf := mapped(t, int(n)*cqeSize)
	initInvalid(cqBuf)
	r.cqObj = &CQ{ring: cqRing{buf: cqBuf, cnt: n, cqn: 0x99, setCI: word32(r.cqRec, 0), armRec: word32(r.cqRec, 4), armReg: word64(r.uar, cqDoorbellOffset)}}
	r.cq = &r.cqObj.ring
	r.hca = newSimHCA(t, r.qp, r.qpRec, r.cq, r.cqRec, r.qp.uidx)
	r.lookup = singleQP{r.qp}
	return r
}

// runHCA runs the simulated HCA on its own goroutine until the returned
// function (also called at cleanup; idempotent) stops it and waits for it.
func (r *simRig) runHCA(t testing.TB) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			before := r.hca.Counters().WQEs
			r.hca.step()
			if r.hca.Counters().WQEs == before {
				runtime.Gosched()
			}
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// TestSimulatedHCALaps drives thousands of mixed work requests through a
// small send queue (many wrap-arounds, multi-WQEBB WQEs, unsignaled gaps)
// and a 16-entry CQ (hundreds of owner-bit flips) against an HCA running
// concurrently on another goroutine, and checks every completion.
func TestSimulatedHCALaps(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 8, MaxSendSGE: 3, MaxInlineData: 60, MaxRecvWR: 8, MaxRecvSGE: 2}, 15, 0)
	if r.cq.cnt != 16 || r.qp.sq.cnt != 16 || r.qp.sq.maxPost != 8 {
		t.Fatalf("geometry: CQ %d, SQ %d WQEBBs, %d WRs", r.cq.cnt, r.qp.sq.cnt, r.qp.sq.maxPost)
	}
	defer r.runHCA(t)()

	rng := rand.New(rand.NewPCG(7, 7))
	sge := func(n uint32) uverbs.SGE {
		off := rng.IntN(len(r.bufs) - int(n))
		return uverbs.SGE{Addr: dma.Addr(r.bufs[off:]), Length: n, LKey: 5}
	}
	const total = 4000
	var (
		posted, nextRecv uint64
		wantSend         []uverbs.SendWR // signaled, in order
		wantRecv         []uverbs.SendWR // payload-carrying, in order
		wantLen          []uint32        // their payload lengths (SGLs are reused)
		gotSend, gotRecv int
		recvPosted       int
		unsignaledRun    int // unsignaled WRs posted since the last signaled one
		wcs              [8]uverbs.WC
		wr               [4]uverbs.SendWR
		sgl              [4][3]uverbs.SGE
	)
	postRecvs := func() {
		for recvPosted-gotRecv < int(r.qp.rq.cnt) {
			rw := [1]uverbs.RecvWR{{ID: 1<<32 | nextRecv, SGL: []uverbs.SGE{sge(4096), sge(4096)}}}
			if n, err := r.qp.postRecv(rw[:]); n != 1 || err != nil {
				t.Fatalf("post recv: %d %v", n, err)
			}
			nextRecv++
			recvPosted++
		}
	}
	// A stall detector, not a timing assertion: the run fails only when no
	// completion arrives for 30 s (under load the whole run may take
	// minutes; on one P the HCA goroutine runs only when this one yields).
	lastProgress := time.Now()
	for posted < total || gotSend < len(wantSend) {
		if time.Since(lastProgress) > 30*time.Second {
			t.Fatalf("stuck: %d/%d send completions, HCA saw %d WQEs and wrote %d CQEs", gotSend, total, r.hca.Counters().WQEs, r.hca.Counters().CQEs)
		}
		postRecvs()
		if posted < total {
			k := 1 + rng.IntN(4)
			run := unsignaledRun
			for i := range k {
				w := uverbs.SendWR{ID: posted + uint64(i), RemoteAddr: 0x1000, RKey: 3, Imm: rng.Uint32()}
				w.Opcode = uverbs.WROpcode(rng.IntN(7))
				w.SGL = sgl[i][:0]
				switch w.Opcode {
				case uverbs.WRAtomicCmpAndSwp, uverbs.WRAtomicFetchAndAdd:
					w.SGL = append(w.SGL, sge(8))
				default:
					for range rng.IntN(4) {
						w.SGL = append(w.SGL, sge(uint32(rng.IntN(600))))
					}
					if w.Opcode != uverbs.WRRDMARead && rng.IntN(3) == 0 {
						w.Flags |= uverbs.SendInline
						w.SGL = append(w.SGL[:0], sge(uint32(rng.IntN(61))))
					}
				}
				// Signal the last of a batch, some at random, and at least
				// one in every four: a batch cut short by a full queue
				// leaves an unsignaled tail, and a queue of 8 made only of
				// such tails would never report the completion that frees
				// it (real posters follow the same rule).
				if i == k-1 || rng.IntN(3) == 0 || run == 3 {
					w.Flags |= uverbs.SendSignaled
					run = 0
				} else {
					run++
				}
				wr[i] = w
			}
			n, err := r.qp.postSend(wr[:k])
			if err != nil && !errors.Is(err, uverbs.ErrQueueFull) {
				t.Fatalf("post send: %v", err)
			}
			for i := range n {
				if wr[i].Flags&uverbs.SendSignaled != 0 {
					unsignaledRun = 0
				} else {
					unsignaledRun++
				}
				if wr[i].Flags&uverbs.SendSignaled != 0 {
					wantSend = append(wantSend, wr[i])
				}
				switch wr[i].Opcode {
				case uverbs.WRSend, uverbs.WRSendWithImm, uverbs.WRRDMAWriteWithImm:
					var length uint32 // WRITE_IMM: the bytes written
					for _, s := range wr[i].SGL {
						length += s.Length
					}
					wantRecv = append(wantRecv, wr[i])
					wantLen = append(wantLen, length)
				}
			}
			posted += uint64(n)
		}
		n, err := r.cq.poll(wcs[:], r.lookup)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			lastProgress = time.Now()
		} else {
			runtime.Gosched()
		}
		for _, wc := range wcs[:n] {
			if wc.Status != uverbs.WCSuccess {
				t.Fatalf("completion %+v", wc)
			}
			if wc.Opcode >= uverbs.WCRecv {
				w := wantRecv[gotRecv]
				if wc.ID != 1<<32|uint64(gotRecv) {
					t.Fatalf("receive completion %d has ID %#x", gotRecv, wc.ID)
				}
				if length := wantLen[gotRecv]; wc.ByteLen != length {
					t.Fatalf("receive %d (from %v %d): %d bytes, want %d", gotRecv, w.Opcode, w.ID, wc.ByteLen, wantLen[gotRecv])
				}
				if w.Opcode != uverbs.WRSend && (wc.Flags&uverbs.WCFlagWithImm == 0 || wc.Imm != w.Imm) {
					t.Fatalf("receive %d: imm %#x flags %v, want %#x", gotRecv, wc.Imm, wc.Flags, w.Imm)
				}
				gotRecv++
				continue
			}
			w := wantSend[gotSend]
			if wc.ID != w.ID {
				t.Fatalf("send completion %d: ID %d, want %d", gotSend, wc.ID, w.ID)
			}
			wantOp := map[uverbs.WROpcode]uverbs.WCOpcode{
				uverbs.WRRDMAWrite: uverbs.WCRDMAWrite, uverbs.WRRDMAWriteWithImm: uverbs.WCRDMAWrite,
				uverbs.WRSend: uverbs.WCSend, uverbs.WRSendWithImm: uverbs.WCSend, uverbs.WRRDMARead: uverbs.WCRDMARead,
				uverbs.WRAtomicCmpAndSwp: uverbs.WCCompSwap, uverbs.WRAtomicFetchAndAdd: uverbs.WCFetchAdd,
			}[w.Opcode]
			if wc.Opcode != wantOp || wc.QPN != uverbs.QPN(r.qp.sq.qpn) {
				t.Fatalf("send completion %d: %v on QP %#x, want %v", gotSend, wc.Opcode, wc.QPN, wantOp)
			}
			gotSend++
		}
		// The consumer index record always tracks what was consumed.
		if ci := record(r.cqRec, 0); ci != r.cq.ci&0xffffff {
			t.Fatalf("CQ consumer record %d, consumer index %d", ci, r.cq.ci)
		}
	}
	if gotSend != len(wantSend) {
		t.Fatalf("%d send completions, %d expected", gotSend, len(wantSend))
	}
	laps := r.cq.ci / r.cq.cnt
	sqLaps := r.qp.sq.curPost / r.qp.sq.cnt
	t.Logf("%d WRs, %d CQEs: %d CQ laps (owner flips), %d send-queue laps", posted, r.cq.ci, laps, sqLaps)
	if laps < 100 || sqLaps < 100 {
		t.Fatalf("too few laps to exercise wrap-around: CQ %d, SQ %d", laps, sqLaps)
	}
}

// TestCQOwnerAcrossCounterWrap runs the consumer index across 2^32 and
// checks the owner-bit rule and the 24-bit consumer record on the way.
func TestCQOwnerAcrossCounterWrap(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 7, 0)
	start := uint32(1<<32 - 40)
	r.cq.ci = start
	r.hca.SetCQProducer(start)
	// The HCA's index wraps at 24 bits; its consumer record must agree.
	storeRecord(r.cq.setCI, byteSwap32(start&0xffffff))
	var wcs [3]uverbs.WC
	for i := range 100 {
		// A stale entry of the previous pass must not be taken as valid.
		if n, err := r.cq.poll(wcs[:], r.lookup); n != 0 || err != nil {
			t.Fatalf("step %d: polled %d completions from an empty CQ", i, n)
		}
		wr := []uverbs.SendWR{{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled}}
		if _, err := r.qp.postSend(wr); err != nil {
			t.Fatal(err)
		}
		r.qp.postRecv([]uverbs.RecvWR{{ID: uint64(i)}})
		if !r.hca.step() {
			t.Fatal("HCA stalled")
		}
		n, err := r.cq.poll(wcs[:], r.lookup)
		if err != nil {
			t.Fatal(err)
		}
		if n != 2 || wcs[0].ID != uint64(i) || wcs[1].ID != uint64(i) {
			t.Fatalf("step %d (ci %#x): %d completions %+v", i, r.cq.ci, n, wcs[:n])
		}
		if got := record(r.cqRec, 0); got != r.cq.ci&0xffffff {
			t.Fatalf("step %d: consumer record %#x, ci %#x", i, got, r.cq.ci)
		}
	}
	if r.cq.ci >= start {
		t.Fatalf("consumer index %#x did not wrap", r.cq.ci)
	}
}

// TestDoorbellRegisterWrites checks what reaches the UAR: a regular
// doorbell is the first 8 bytes of the last control segment in the current
// half; a single inline WQE goes out whole by BlueFlame (following the
// queue wrap); the halves alternate; the CQ arm lands at +0x20.
func TestDoorbellRegisterWrites(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 2, MaxInlineData: 100, MaxRecvWR: 1, MaxRecvSGE: 1}, 3, 512)
	sq := &r.qp.sq
	half := func(i int) []byte { return r.uar[bfOffset+i*256 : bfOffset+(i+1)*256] }
	sge := uverbs.SGE{Addr: dma.Addr(r.bufs), Length: 64, LKey: 1}

	// 1) Regular doorbell (not inline) into half 0.
	if _, err := r.qp.postSend([]uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, SGL: []uverbs.SGE{sge}}}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(half(0)); got != binary.LittleEndian.Uint64(sq.buf[0:8]) {
		t.Fatalf("doorbell %#x, control segment % x", got, sq.buf[0:8])
	}
	if rec := record(r.qpRec, 4); rec != sq.curPost {
		t.Fatalf("send record %d, producer %d", rec, sq.curPost)
	}
	// 2) One inline WQE that wraps the queue: BlueFlame into half 1.
	sq.curPost = sq.cnt - 1 // the WQE starts in the last WQEBB
	resetSQ(sq)
	copy(r.bufs, []byte("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
	in := uverbs.SGE{Addr: dma.Addr(r.bufs), Length: 90}
	if _, err := r.qp.postSend([]uverbs.SendWR{{Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: []uverbs.SGE{in}}}); err != nil {
		t.Fatal(err)
	}
	last := int(sq.cnt-1) * sendWQEBB
	want := append(append([]byte{}, sq.buf[last:]...), sq.buf[:64]...) // 2 WQEBBs: ds = 1 + 6
	if got := half(1)[:128]; string(got) != string(want) {
		t.Fatalf("BlueFlame copy\n% x\nwant\n% x", got, want)
	}
	// 3) Batches use the regular doorbell, alternating back to half 0.
	two := []uverbs.SendWR{{Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: []uverbs.SGE{in}}, {Opcode: uverbs.WRSend, SGL: []uverbs.SGE{sge}}}
	resetSQ(sq)
	if n, err := r.qp.postSend(two); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	if got := binary.LittleEndian.Uint64(half(0)); got != binary.LittleEndian.Uint64(sq.buf[sq.lastCtrl:]) {
		t.Fatalf("batch doorbell %#x, last control segment % x", got, sq.buf[sq.lastCtrl:sq.lastCtrl+8])
	}
	// 4) Without BlueFlame registers (bf_reg_size 0) everything is an
	// 8-byte doorbell at the same offset.
	nr := newSimRig(t, uverbs.QPCaps{MaxSendWR: 4, MaxSendSGE: 1, MaxInlineData: 60, MaxRecvWR: 1, MaxRecvSGE: 1}, 3, 0)
	for i := range 3 {
		if _, err := nr.qp.postSend([]uverbs.SendWR{{ID: uint64(i), Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: []uverbs.SGE{{Addr: dma.Addr(nr.bufs), Length: 40}}}}); err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint64(nr.uar[bfOffset:]); got != nr.qp.sq.doorbellValue() {
			t.Fatalf("post %d: doorbell %#x, want %#x", i, got, nr.qp.sq.doorbellValue())
		}
		if nr.uar[bfOffset+8] != 0 {
			t.Fatalf("post %d: a BlueFlame copy reached a doorbell-only register", i)
		}
	}
	// 5) CQ arm.
	r.cq.ci = 5
	r.cq.armSN.Store(2)
	r.cq.arm(true)
	if got, want := binary.BigEndian.Uint64(r.uar[cqDoorbellOffset:]), uint64(2<<28|1<<24|5)<<32|0x99; got != want {
		t.Fatalf("arm doorbell %#x, want %#x", got, want)
	}
	if got := record(r.cqRec, 4); got != 2<<28|1<<24|5 {
		t.Fatalf("arm record %#x", got)
	}
}

func byteSwap32(v uint32) uint32 {
	return binary.BigEndian.Uint32(binary.LittleEndian.AppendUint32(nil, v))
}

// resetSQ forgets every posted request, as if all had completed.
func resetSQ(sq *sendQueue) {
	sq.head = 0
	sq.pub.Store(0)
	sq.tail.Store(0)
}

// TestPostAndPollOnDifferentGoroutines posts on one goroutine and polls on
// another, as the uverbs contract allows (one owner per queue, not per
// QP), with the HCA on a third. Under -race this proves the head/tail
// publication between poster and poller.
func TestPostAndPollOnDifferentGoroutines(t *testing.T) {
	r := newSimRig(t, uverbs.QPCaps{MaxSendWR: 16, MaxSendSGE: 1, MaxRecvWR: 16, MaxRecvSGE: 1}, 31, 512)
	const total = 20000
	stopHCA := r.runHCA(t)
	var wg sync.WaitGroup
	wg.Go(func() { // the poster
		wr := []uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendSignaled, RemoteAddr: 8, RKey: 1,
			SGL: []uverbs.SGE{{Addr: dma.Addr(r.bufs), Length: 8, LKey: 1}}}}
		for i := 0; i < total; {
			wr[0].ID = uint64(i)
			n, err := r.qp.postSend(wr)
			if err != nil && !errors.Is(err, uverbs.ErrQueueFull) {
				t.Error(err)
				return
			}
			if n == 0 {
				runtime.Gosched()
			}
			i += n
		}
	})
	var wcs [8]uverbs.WC
	lastProgress := time.Now() // a stall detector, as in TestSimulatedHCALaps
	for got := 0; got < total; {
		if time.Since(lastProgress) > 30*time.Second {
			t.Fatalf("stuck after %d completions", got)
		}
		n, err := r.cq.poll(wcs[:], r.lookup)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			lastProgress = time.Now()
		}
		for _, wc := range wcs[:n] {
			if wc.ID != uint64(got) || wc.Status != uverbs.WCSuccess {
				t.Fatalf("completion %d: %+v", got, wc)
			}
			got++
		}
		if n == 0 {
			runtime.Gosched()
		}
	}
	stopHCA()
	wg.Wait()
}
