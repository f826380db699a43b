//go:build amd64 || arm64

package mlx5

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/rdmago/te/internal/dma"
	abi "github.com/rdmago/te/internal/mlx5"
	"github.com/rdmago/te/internal/uapi"
	"github.com/rdmago/te/internal/ucmd"
	"github.com/rdmago/te/uverbs"
)

// fakeKernel stands in for the uverbs command file: a sparse temporary
// file whose pages play the UAR pages at their mmap offsets, so what the
// provider rings can be read back with ReadAt. It answers the mlx5 dynamic
// UAR ioctls, checking their attributes.
type fakeKernel struct {
	t    *testing.T
	f    *os.File
	uars map[uint32]fakeUAR // live dynamic UARs by handle
	next uint32
}

type fakeUAR struct {
	typ    uint64
	off    int64
	pageID uint32
}

func (k *fakeKernel) FD() int { return int(k.f.Fd()) }
func (k *fakeKernel) Write(cmd uint32, req, drvIn, resp, drvOut []byte) error {
	return errors.New("fake kernel: no write commands")
}

type fakeAttr struct {
	id, length, flags uint16
	data              uint64
}

func (k *fakeKernel) Ioctl(object, method uint16, build func(*ucmd.Builder), read func(*ucmd.Builder)) error {
	buf := make([]byte, 4096)
	b := ucmd.NewBuilder(buf, 0x7000_0000, uapi.DriverMLX5, object, method)
	build(b)
	if _, err := b.Finish(); err != nil {
		return err
	}
	le := binary.LittleEndian
	if le.Uint32(buf[16:]) != uapi.DriverMLX5 || object != abi.ObjectUAR {
		k.t.Errorf("ioctl driver %d object %#x", le.Uint32(buf[16:]), object)
		return errors.New("fake kernel: unexpected ioctl")
	}
	attrs := map[uint16]fakeAttr{}
	for i := range int(le.Uint16(buf[6:])) {
		a := buf[24+16*i:]
		attrs[le.Uint16(a)] = fakeAttr{id: le.Uint16(a), length: le.Uint16(a[2:]), flags: le.Uint16(a[4:]), data: le.Uint64(a[8:])}
	}
	for id, a := range attrs {
		if a.flags&uapi.AttrFMandatory == 0 {
			k.t.Errorf("ioctl attribute %#x not mandatory", id)
		}
	}
	switch method {
	case abi.MethodUARObjAlloc:
		typ, ok := attrs[abi.AttrUARAllocType]
		if !ok || typ.length != 8 || typ.data > abi.UARAllocTypeNC || attrs[abi.AttrUARAllocHandle].length != 0 ||
			attrs[abi.AttrUARAllocMmapOff].length != 8 || attrs[abi.AttrUARAllocMmapLen].length != 4 || attrs[abi.AttrUARAllocPageID].length != 4 {
			k.t.Errorf("UAR_OBJ_ALLOC attributes %+v", attrs)
			return errors.New("fake kernel: bad UAR_OBJ_ALLOC")
		}
		k.next++
		u := fakeUAR{typ: typ.data, off: int64(0x500+k.next) * int64(abi.PageSize), pageID: 100 + k.next}
		k.uars[k.next] = u
		for i := range int(le.Uint16(buf[6:])) {
			a := buf[24+16*i:]
			switch le.Uint16(a) {
			case abi.AttrUARAllocHandle:
				le.PutUint64(a[8:], uint64(k.next))
			case abi.AttrUARAllocMmapOff:
				le.PutUint64(b.Output(i), uint64(u.off))
			case abi.AttrUARAllocMmapLen:
				le.PutUint32(b.Output(i), uint32(abi.PageSize))
			case abi.AttrUARAllocPageID:
				le.PutUint32(b.Output(i), u.pageID)
			}
		}
	case abi.MethodUARObjDestroy:
		h := attrs[abi.AttrUARDestroyHandle]
		if _, ok := k.uars[uint32(h.data)]; !ok || h.length != 0 {
			k.t.Errorf("UAR_OBJ_DESTROY of handle %d (%+v)", h.data, h)
			return errors.New("fake kernel: bad UAR_OBJ_DESTROY")
		}
		delete(k.uars, uint32(h.data))
	default:
		return errors.New("fake kernel: unknown method")
	}
	if read != nil {
		read(b)
	}
	return nil
}

func newFakeKernel(t *testing.T) *fakeKernel {
	f, err := os.CreateTemp(t.TempDir(), "uverbs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(0x600 * int64(abi.PageSize)); err != nil { // static NC pages and dynamic UARs lie below
		t.Fatal(err)
	}
	return &fakeKernel{t: t, f: f, uars: map[uint32]fakeUAR{}}
}

func (k *fakeKernel) read(t *testing.T, off int64, n int) []byte {
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
	bad := ucontextResp()
	bad.CQEVersion = 0
	if _, err := p.NewContext(k, abi.Bytes(&bad)); !errors.Is(err, uverbs.ErrNotSupported) {
		t.Errorf("context with CQE version 0: %v, want ErrNotSupported", err)
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
	// Device limits: a request whose power-of-two ring (entries+1 rounded
	// up, less one) exceeds max_cqe is refused here, not by the kernel.
	lim := uverbs.DeviceLimits{MaxCQE: 4095}
	if fit, err := ctx.NewCQ(uverbs.DriverCQConfig{Entries: 4095, Limits: lim}); err != nil {
		t.Errorf("CQ of 4095 entries under max_cqe 4095: %v", err)
	} else if err := fit.Destroyed(); err != nil {
		t.Error(err)
	}
	for _, n := range []int{4096, 1 << 24, 1 << 40} {
		if _, err := ctx.NewCQ(uverbs.DriverCQConfig{Entries: n, Limits: lim}); !errors.Is(err, uverbs.ErrInvalidWR) {
			t.Errorf("CQ of %d entries under max_cqe 4095: %v", n, err)
		}
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
	if cq.ring.armSN.Load() != 1 {
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
	if n, err := dcq.Poll(wc[:]); err != nil || n != 2 || wc[0].ID != 43 || wc[0].Opcode != uverbs.WCRecv || wc[1].ID != 42 || wc[1].Opcode != uverbs.WCSend {
		t.Fatalf("poll: %d %+v", n, wc[:n])
	}
	post()
	q.StateChanged(uverbs.QPStateReset)
	hca.Reset()
	if n, err := dcq.Poll(wc[:]); err != nil || n != 0 || cq.ring.ci != 4 {
		t.Fatalf("stale completions after RESET: %d %+v (ci %d)", n, wc[:n], cq.ring.ci)
	}
	post()
	if err := q.Destroyed(); err != nil {
		t.Fatal(err)
	}
	if err := q.Destroyed(); err != nil {
		t.Fatal("second Destroyed:", err)
	}
	if n, err := dcq.Poll(wc[:]); err != nil || n != 0 || ctx.qps.lookup(q.r.uidx) != retired {
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

// TestProviderDynamicUAR checks the opt-in dynamic UAR path: the context
// asks for DYN_UAR, arms CQs through an uncached page, gives every QP its
// own BlueFlame page (uncached without write-combining), passes the page
// indexes in the create commands, rings at the mapped offsets, and
// destroys every UAR object it allocated.
func TestProviderDynamicUAR(t *testing.T) {
	p := NewProvider(Options{DynamicUAR: true})
	in, _ := p.ContextRequest()
	var req abi.AllocUcontextReqV2
	copy(abi.Bytes(&req), in)
	if req.LibCaps != abi.LibCap4KUAR|abi.LibCapDynUAR {
		t.Fatalf("lib_caps %#x", req.LibCaps)
	}
	for _, bfRegSize := range []uint32{512, 0} {
		k := newFakeKernel(t)
		r := ucontextResp()
		r.TotBFRegs, r.BFRegSize = 0, bfRegSize // the kernel granted dynamic UARs
		dc, err := p.NewContext(k, abi.Bytes(&r))
		if err != nil {
			t.Fatal(err)
		}
		ctx := dc.(*Context)
		if len(k.uars) != 1 || k.uars[1].typ != abi.UARAllocTypeNC {
			t.Fatalf("context UARs %+v, want one NC page for CQ arms", k.uars)
		}
		dcq, _ := ctx.NewCQ(uverbs.DriverCQConfig{Entries: 8})
		_, cin, _ := dcq.Request()
		var ccq abi.CreateCQ
		copy(abi.Bytes(&ccq), cin)
		if ccq.Flags != abi.CQFlagUARPageIndex || ccq.UARPageIndex != 101 {
			t.Fatalf("CREATE_CQ %+v", ccq)
		}
		if err := dcq.Created(1, 15, abi.Bytes(&abi.CreateCQResp{CQN: 3})); err != nil {
			t.Fatal(err)
		}
		dcq.Arm(false)
		if got := binary.BigEndian.Uint64(k.read(t, k.uars[1].off+cqDoorbellOffset, 8)); got != 3 {
			t.Fatalf("arm doorbell %#x on the CQ page", got)
		}
		caps := uverbs.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 32}
		dqp, err := ctx.NewQP(uverbs.DriverQPConfig{Type: uverbs.QPTypeRC, Caps: caps, SendCQ: dcq, RecvCQ: dcq})
		if err != nil {
			t.Fatal(err)
		}
		wantType := uint64(abi.UARAllocTypeBF)
		if bfRegSize == 0 {
			wantType = abi.UARAllocTypeNC
		}
		if u := k.uars[2]; u.typ != wantType {
			t.Fatalf("QP UAR type %d, want %d", u.typ, wantType)
		}
		_, qin, _ := dqp.Request()
		var cqp abi.CreateQP
		copy(abi.Bytes(&cqp), qin)
		if cqp.Flags != abi.QPFlagUARPageIndex || cqp.BFRegIndex != 102 {
			t.Fatalf("CREATE_QP %+v", cqp)
		}
		if err := dqp.Created(uverbs.QPCreated{QPN: 0x77}, abi.Bytes(&abi.CreateQPResp{BFRegIndex: 999})); err != nil {
			t.Fatal(err)
		}
		q := dqp.(*QP)
		if q.r.db.shared || (q.r.db.bfHalf != 0) != (bfRegSize != 0) {
			t.Fatalf("QP register: shared %v BlueFlame half %d", q.r.db.shared, q.r.db.bfHalf)
		}
		if _, err := q.PostSend([]uverbs.SendWR{{Opcode: uverbs.WRSend}}); err != nil {
			t.Fatal(err)
		}
		if got := k.read(t, k.uars[2].off+bfOffset, 8); string(got) != string(q.r.sq.buf[:8]) {
			t.Fatalf("doorbell % x, control segment % x", got, q.r.sq.buf[:8])
		}
		if err := q.Destroyed(); err != nil {
			t.Fatal(err)
		}
		if _, ok := k.uars[2]; ok {
			t.Fatal("the QP's UAR outlived the QP")
		}
		dcq.Destroyed()
		if err := ctx.Close(); err != nil {
			t.Fatal(err)
		}
		if len(k.uars) != 0 {
			t.Fatalf("UARs left after Close: %+v", k.uars)
		}
	}
}
