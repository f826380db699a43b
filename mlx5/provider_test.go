//go:build amd64

package mlx5

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/rdmago/te/internal/dma"
	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/uverbs"
)

// fakeKernel stands in for the uverbs command file: a sparse temporary
// file whose pages play the UAR pages at their mmap offsets, so what the
// provider rings can be read back with ReadAt.
type fakeKernel struct{ f *os.File }

func (k fakeKernel) FD() int { return int(k.f.Fd()) }
func (k fakeKernel) Write(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return errors.New("fake kernel: no commands")
}
func (k fakeKernel) Ioctl(object, method uint16, build func(*ucmd.Builder), read func(*ucmd.Builder)) error {
	return errors.New("fake kernel: no ioctls")
}

func newFakeKernel(t *testing.T) fakeKernel {
	f, err := os.CreateTemp(t.TempDir(), "uverbs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(abi.UAROffset(abi.MmapNCPage, 8, abi.PageSize)); err != nil {
		t.Fatal(err)
	}
	return fakeKernel{f}
}

func (k fakeKernel) read(t *testing.T, off int64, n int) []byte {
	b := make([]byte, n)
	if _, err := k.f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

func ucontextResp() abi.AllocUcontextResp {
	return abi.AllocUcontextResp{QPTabSize: 1 << 18, BFRegSize: 512, TotBFRegs: 16, CacheLineSize: 64,
		MaxSQDescSz: 512, MaxRQDescSz: 512, MaxSendWQEBB: 1 << 15, MaxRecvWR: 1 << 15, NumPorts: 1,
		CQEVersion: 1, LogUARSize: 12, NumUARsPerPage: 1}
}

// TestProviderDriverData checks the driver data the provider hands the
// core, and that doorbells reach the UAR page and offset the kernel's
// bfreg numbering designates, through the real provider objects.
func TestProviderDriverData(t *testing.T) {
	p := Provider()
	if p.Name() != "mlx5" || p.DriverID() != uverbs.DriverMLX5 {
		t.Fatal(p.Name(), p.DriverID())
	}
	in, outLen := p.ContextRequest()
	var req abi.AllocUcontextReqV2
	copy(abi.Bytes(&req), in)
	if len(in) != abi.SizeAllocUcontextReqV2 || outLen != abi.SizeAllocUcontextResp ||
		req != (abi.AllocUcontextReqV2{TotalNumBFRegs: 16, NumLowLatencyBFRegs: 4, MaxCQEVersion: 1, LibCaps: abi.LibCap4KUAR}) {
		t.Fatalf("GET_CONTEXT driver data %+v (%d bytes), out %d", req, len(in), outLen)
	}
	k := newFakeKernel(t)
	for _, bad := range []func(*abi.AllocUcontextResp){
		func(r *abi.AllocUcontextResp) { r.CQEVersion = 0 },
		func(r *abi.AllocUcontextResp) { r.TotBFRegs = 0 },
	} {
		r := ucontextResp()
		bad(&r)
		if _, err := p.NewContext(k, abi.Bytes(&r)); !errors.Is(err, uverbs.ErrNotSupported) {
			t.Errorf("context from %+v: %v, want ErrNotSupported", r, err)
		}
	}
	r := ucontextResp()
	dc, err := p.NewContext(k, abi.Bytes(&r))
	if err != nil {
		t.Fatal(err)
	}
	ctx := dc.(*Context)

	// CQ: cqe = entries-1 of a power-of-two ring, 64-byte CQEs, no flags.
	dcq, err := ctx.NewCQ(uverbs.DriverCQConfig{Entries: 100})
	if err != nil {
		t.Fatal(err)
	}
	cqe, cin, cout := dcq.Request()
	var ccq abi.CreateCQ
	copy(abi.Bytes(&ccq), cin)
	if cqe != 127 || cout != abi.SizeCreateCQResp || ccq.CQESize != 64 || ccq.Flags != 0 ||
		ccq.BufAddr%uint64(abi.PageSize) != 0 || ccq.DBAddr%8 != 0 || ccq.DBAddr == 0 {
		t.Fatalf("CREATE_CQ: cqe %d %+v out %d", cqe, ccq, cout)
	}
	if err := dcq.Created(1, 255, abi.Bytes(&abi.CreateCQResp{CQN: 9})); err == nil {
		t.Fatal("a CQ of another size was accepted")
	}
	if err := dcq.Created(1, 127, abi.Bytes(&abi.CreateCQResp{CQN: 9})); err != nil {
		t.Fatal(err)
	}
	cq := dcq.(*CQ)
	for i := 0; i < 128; i++ {
		if cq.ring.buf[i*cqeSize+cqeOpOwn] != 0xf0 {
			t.Fatalf("CQE %d not initialised INVALID", i)
		}
	}

	// QPs: no SCATTER_CQE, unique user indexes, power-of-two queues.
	caps := uverbs.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	if _, err := ctx.NewQP(uverbs.DriverQPConfig{Type: uverbs.QPTypeUD, Caps: caps}); !errors.Is(err, uverbs.ErrNotSupported) {
		t.Fatalf("UD QP: %v", err)
	}
	var qps []*QP
	for i := range 3 {
		dqp, err := ctx.NewQP(uverbs.DriverQPConfig{Type: uverbs.QPTypeRC, Caps: caps, SendCQ: dcq, RecvCQ: dcq})
		if err != nil {
			t.Fatal(err)
		}
		got, qin, qout := dqp.Request()
		var cqp abi.CreateQP
		copy(abi.Bytes(&cqp), qin)
		if cqp.Flags&abi.QPFlagScatterCQE != 0 || cqp.Flags != 0 || cqp.UIdx != uint32(i+1) || qout != abi.SizeCreateQPResp ||
			cqp.SQWQECount != 32 || cqp.RQWQECount != 16 || cqp.RQWQEShift != 5 || cqp.BufAddr%uint64(abi.PageSize) != 0 {
			t.Fatalf("CREATE_QP %d: %+v", i, cqp)
		}
		if got.MaxSendWR != 16 || got.MaxInlineData != 76 || got.MaxRecvWR != 16 || got.MaxRecvSGE != 2 {
			t.Fatalf("caps %+v", got)
		}
		qps = append(qps, dqp.(*QP))
	}
	// Library bfreg numbers (4 per UAR, 2 usable): 25 = UAR 6, second
	// register, dedicated (kernel number 13 of 16, 4 low-latency); 13 =
	// UAR 3, shared; 0 is the shared doorbell-only register.
	for i, c := range []struct {
		bfreg  uint32
		shared bool
		bf     bool
	}{{25, false, true}, {13, true, true}, {0, false, false}} {
		q := qps[i]
		if err := q.Created(uverbs.QPCreated{QPN: uverbs.QPN(0x100 + i)}, abi.Bytes(&abi.CreateQPResp{BFRegIndex: c.bfreg})); err != nil {
			t.Fatal(err)
		}
		if q.r.db.shared != c.shared || (q.r.db.bfHalf != 0) != c.bf {
			t.Fatalf("bfreg %d: shared %v BlueFlame half %d", c.bfreg, q.r.db.shared, q.r.db.bfHalf)
		}
		sge := []uverbs.SGE{{Addr: 0x1000, Length: 8, LKey: 1}}
		if n, err := q.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRRDMAWrite, SGL: sge, RemoteAddr: 8, RKey: 1}}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		page := int64(c.bfreg/4) * int64(abi.PageSize)
		off := page + bfOffset + int64(c.bfreg%4)*512
		if got := k.read(t, off, 8); string(got) != string(q.r.sq.buf[:8]) {
			t.Fatalf("bfreg %d: UAR at %#x holds % x, control segment % x", c.bfreg, off, got, q.r.sq.buf[:8])
		}
	}
	for _, bad := range []uint32{2, 3, 32} { // fast-path registers; beyond the 16 static ones
		q, _ := ctx.NewQP(uverbs.DriverQPConfig{Type: uverbs.QPTypeRC, Caps: caps})
		if err := q.Created(uverbs.QPCreated{QPN: 1}, abi.Bytes(&abi.CreateQPResp{BFRegIndex: bad})); err == nil {
			t.Errorf("bfreg %d accepted", bad)
		}
		q.Destroyed()
	}

	// Arm: record and doorbell at UAR page 0 + 0x20.
	if err := dcq.Arm(true); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint64(k.read(t, cqDoorbellOffset, 8)); got != uint64(1<<24)<<32|9 {
		t.Fatalf("arm doorbell %#x", got)
	}
	dcq.EventConsumed()
	if cq.ring.armSN != 1 {
		t.Fatal("arm sequence not advanced")
	}

	// A completion for QP 0 decodes; after RESET a stale one is dropped;
	// after destroy, its user index is retired.
	q := qps[0]
	hca := newSimHCA(t, &q.r, q.rec, &cq.ring, cq.rec, q.r.uidx)
	post := func() {
		wr := []uverbs.SendWR{{ID: 42, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled}}
		q.PostRecv([]uverbs.RecvWR{{ID: 43}})
		if _, err := q.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		hca.step()
	}
	var wc [4]uverbs.WC
	post()
	// The simulated HCA delivers the SEND to itself before completing it.
	if n := dcq.Poll(wc[:]); n != 2 || wc[0].ID != 43 || wc[0].Opcode != uverbs.WCRecv || wc[1].ID != 42 || wc[1].Opcode != uverbs.WCSend {
		t.Fatalf("poll: %d %+v", n, wc[:n])
	}
	post()
	q.StateChanged(uverbs.QPStateReset)
	hca.sqPI, hca.rqCI = 0, 0
	if n := dcq.Poll(wc[:]); n != 0 || cq.ring.ci != 4 {
		t.Fatalf("stale completions after RESET: %d %+v (ci %d)", n, wc[:n], cq.ring.ci)
	}
	post()
	if err := q.Destroyed(); err != nil {
		t.Fatal(err)
	}
	if err := q.Destroyed(); err != nil {
		t.Fatal("second Destroyed:", err)
	}
	if n := dcq.Poll(wc[:]); n != 0 || ctx.qps.lookup(q.r.uidx) != retired {
		t.Fatalf("completions of a destroyed QP: %d %+v", n, wc[:n])
	}
	for _, q := range qps[1:] {
		q.Destroyed()
	}
	if err := dcq.Destroyed(); err != nil {
		t.Fatal(err)
	}
	if err := dcq.Arm(false); err == nil {
		t.Fatal("arm after destroy succeeded")
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if _, err := ctx.NewQP(uverbs.DriverQPConfig{Type: uverbs.QPTypeRC, Caps: caps}); err == nil {
		t.Fatal("NewQP after Close succeeded")
	}
	_ = dma.PageSize
}
