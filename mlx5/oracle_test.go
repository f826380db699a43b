//go:build amd64 || arm64

package mlx5

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/dma"
	"github.com/rdmago/te/uverbs"
)

// The oracle is a C program compiled against rdma-core's mlx5dv.h. It
// builds the same work requests into a ring with mlx5dv's struct layouts
// and inline helpers (mlx5dv_set_ctrl_seg, mlx5dv_x86_set_ctrl_seg,
// mlx5dv_set_data_seg, struct mlx5_wqe_raddr_seg/atomic_seg/inl_data_seg),
// following rdma-core's post_send composition (segment order, inline and
// data-segment wrap at the end of the queue, WQEBB accounting). Our Go
// builders must leave the ring byte-for-byte identical after every post.

const oraclePrelude = `#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <endian.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

struct ring { uint8_t *start, *qend; unsigned cnt, cur_post; uint32_t qpn; uint8_t sig; };
static void *wqe_at(struct ring *q, unsigned idx) { return q->start + ((size_t)idx << MLX5_SEND_WQE_SHIFT); }
static int x86_mismatch;

static void post(struct ring *q, struct ibv_send_wr *wr) {
	unsigned idx = q->cur_post & (q->cnt - 1);
	struct mlx5_wqe_ctrl_seg *ctrl = wqe_at(q, idx);
	uint8_t *seg = (uint8_t *)ctrl;
	int size = sizeof(*ctrl) / 16, i;
	uint8_t opcode = 0;
	uint32_t imm = 0;
	uint8_t fm = q->sig |
		((wr->send_flags & IBV_SEND_SIGNALED) ? MLX5_WQE_CTRL_CQ_UPDATE : 0) |
		((wr->send_flags & IBV_SEND_SOLICITED) ? MLX5_WQE_CTRL_SOLICITED : 0) |
		((wr->send_flags & IBV_SEND_FENCE) ? MLX5_WQE_CTRL_FENCE : 0);
	*(uint32_t *)(seg + 8) = 0;
	seg += sizeof(*ctrl);
	switch (wr->opcode) {
	case IBV_WR_SEND: opcode = MLX5_OPCODE_SEND; break;
	case IBV_WR_SEND_WITH_IMM: opcode = MLX5_OPCODE_SEND_IMM; imm = wr->imm_data; break;
	case IBV_WR_RDMA_WRITE: opcode = MLX5_OPCODE_RDMA_WRITE; goto raddr;
	case IBV_WR_RDMA_WRITE_WITH_IMM: opcode = MLX5_OPCODE_RDMA_WRITE_IMM; imm = wr->imm_data; goto raddr;
	case IBV_WR_RDMA_READ: opcode = MLX5_OPCODE_RDMA_READ;
	raddr: {
		struct mlx5_wqe_raddr_seg *r = (void *)seg;
		r->raddr = htobe64(wr->wr.rdma.remote_addr);
		r->rkey = htobe32(wr->wr.rdma.rkey);
		r->reserved = 0;
		seg += sizeof(*r);
		size += sizeof(*r) / 16;
		break;
	}
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		struct mlx5_wqe_raddr_seg *r = (void *)seg;
		struct mlx5_wqe_atomic_seg *a = (void *)(r + 1);
		struct mlx5_wqe_data_seg *d = (void *)(a + 1);
		opcode = wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? MLX5_OPCODE_ATOMIC_CS : MLX5_OPCODE_ATOMIC_FA;
		r->raddr = htobe64(wr->wr.atomic.remote_addr);
		r->rkey = htobe32(wr->wr.atomic.rkey);
		r->reserved = 0;
		if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
			a->swap_add = htobe64(wr->wr.atomic.swap);
			a->compare = htobe64(wr->wr.atomic.compare_add);
		} else {
			a->swap_add = htobe64(wr->wr.atomic.compare_add);
		}
		mlx5dv_set_data_seg(d, 8, wr->sg_list[0].lkey, wr->sg_list[0].addr);
		size += (sizeof(*r) + sizeof(*a) + sizeof(*d)) / 16;
		goto ctrl;
	}
	default: break;
	}
	if (wr->send_flags & IBV_SEND_INLINE) {
		struct mlx5_wqe_inl_data_seg *h = (void *)seg;
		uint8_t *w = (uint8_t *)(h + 1);
		int inl = 0;
		for (i = 0; i < wr->num_sge; i++) {
			uint8_t *src = (uint8_t *)(uintptr_t)wr->sg_list[i].addr;
			int len = wr->sg_list[i].length;
			inl += len;
			if (w + len > q->qend) {
				int c = q->qend - w;
				memcpy(w, src, c);
				src += c;
				len -= c;
				w = wqe_at(q, 0);
			}
			memcpy(w, src, len);
			w += len;
		}
		if (inl) {
			h->byte_count = htobe32(inl | MLX5_INLINE_SEG);
			size += (inl + sizeof(h->byte_count) + 15) / 16;
		}
	} else {
		struct mlx5_wqe_data_seg *d = (void *)seg;
		for (i = 0; i < wr->num_sge; i++) {
			if (!wr->sg_list[i].length)
				continue;
			if ((uint8_t *)d == q->qend)
				d = wqe_at(q, 0);
			mlx5dv_set_data_seg(d, wr->sg_list[i].length, wr->sg_list[i].lkey, wr->sg_list[i].addr);
			d++;
			size++;
		}
	}
ctrl:
	mlx5dv_set_ctrl_seg(ctrl, q->cur_post & 0xffff, opcode, 0, q->qpn, fm, size, 0, imm);
	{
		struct mlx5_wqe_ctrl_seg x;
		mlx5dv_x86_set_ctrl_seg(&x, q->cur_post & 0xffff, opcode, 0, q->qpn, fm, size, 0, imm);
		if (memcmp(&x, ctrl, sizeof(x)))
			x86_mismatch++;
	}
	q->cur_post += (size * 16 + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB;
}

static void hexout(const void *p, size_t n) {
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
}

static void fill_pattern(uint8_t *b, size_t n) {
	for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(i * 7 + 3);
}
`

// sqCase is a sequence of work requests posted into one ring.
type sqCase struct {
	name   string
	cnt    uint32 // WQEBBs
	start  uint32 // initial producer counter
	qpn    uint32
	sigAll bool
	wrs    []uverbs.SendWR
}

// payloadArena hands out inline payloads from mmap'd memory (inline SGEs
// point at real bytes, copied at post time).
type payloadArena struct {
	b   []byte
	off int
}

func (a *payloadArena) take(n int, seed byte) uverbs.SGE {
	p := a.b[a.off : a.off+n]
	for i := range p {
		p[i] = seed + byte(i*13)
	}
	a.off += n
	return uverbs.SGE{Addr: dma.Addr(p), Length: uint32(n), LKey: 0x1234}
}

func sqCases(t *testing.T) []sqCase {
	arena := &payloadArena{b: mapped(t, 1<<20)}
	sge := func(addr uint64, n, lkey uint32) uverbs.SGE {
		return uverbs.SGE{Addr: addr, Length: n, LKey: uverbs.LKey(lkey)}
	}
	one := []uverbs.SGE{sge(0x7f00_1234_5000, 4096, 0xabcd01)}
	inl := func(ns ...int) []uverbs.SGE {
		var s []uverbs.SGE
		for i, n := range ns {
			s = append(s, arena.take(n, byte(17*i+1)))
		}
		return s
	}
	write := func(id uint64, sgl []uverbs.SGE, f uverbs.SendFlags) uverbs.SendWR {
		return uverbs.SendWR{ID: id, Opcode: uverbs.WRRDMAWrite, Flags: f, SGL: sgl, RemoteAddr: 0x5555_0000_1000 + id, RKey: 0x77aa55}
	}
	cases := []sqCase{
		{name: "send", cnt: 8, qpn: 0x1234, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendSignaled, SGL: one},
			{ID: 2, Opcode: uverbs.WRSendWithImm, Flags: uverbs.SendSolicited | uverbs.SendSignaled, Imm: 0xdeadbeef,
				SGL: []uverbs.SGE{sge(0x1000, 1, 1), sge(0x2000, 2, 2)}},
			{ID: 3, Opcode: uverbs.WRSend, SGL: nil},
		}},
		{name: "rdma", cnt: 16, qpn: 0xabcdef, wrs: []uverbs.SendWR{
			write(1, one, uverbs.SendSignaled),
			{ID: 2, Opcode: uverbs.WRRDMAWriteWithImm, Imm: 0x01020304, RemoteAddr: 0xffff_ffff_ffff_fff0, RKey: 0xffffffff,
				SGL: []uverbs.SGE{sge(0x10, 16, 3), sge(0x20, 0, 4), sge(0x30, 48, 5)}},
			{ID: 3, Opcode: uverbs.WRRDMARead, Flags: uverbs.SendFence | uverbs.SendSignaled, RemoteAddr: 0x8000, RKey: 9, SGL: one},
			{ID: 4, Opcode: uverbs.WRRDMARead, RemoteAddr: 0x8000, RKey: 9,
				SGL: []uverbs.SGE{sge(0x100, 8, 1), sge(0x200, 8, 2), sge(0x300, 8, 3), sge(0x400, 8, 4)}},
		}},
		{name: "atomics", cnt: 8, qpn: 7, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRAtomicCmpAndSwp, Flags: uverbs.SendSignaled, RemoteAddr: 0x9000, RKey: 0x42,
				CompareAdd: 0x0102030405060708, Swap: 0x1112131415161718, SGL: []uverbs.SGE{sge(0x4000, 8, 0x99)}},
			{ID: 2, Opcode: uverbs.WRAtomicFetchAndAdd, RemoteAddr: 0x9008, RKey: 0x42,
				CompareAdd: 1, Swap: 0xffff, SGL: []uverbs.SGE{sge(0x4008, 8, 0x99)}},
		}},
		{name: "sigall", cnt: 4, qpn: 0x10, sigAll: true, wrs: []uverbs.SendWR{
			write(1, one, 0), write(2, one, uverbs.SendSignaled|uverbs.SendFence),
		}},
		{name: "inline-sizes", cnt: 64, qpn: 0x55, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(0)},
			{ID: 2, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(1)},
			{ID: 3, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(12)},
			{ID: 4, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(13)},
			{ID: 5, Opcode: uverbs.WRSendWithImm, Flags: uverbs.SendInline | uverbs.SendSignaled, Imm: 5, SGL: inl(28)},
			{ID: 6, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendInline, RemoteAddr: 0x100, RKey: 1, SGL: inl(60)},
			{ID: 7, Opcode: uverbs.WRRDMAWriteWithImm, Flags: uverbs.SendInline, Imm: 7, RemoteAddr: 0x100, RKey: 1, SGL: inl(100, 3, 97)},
			{ID: 8, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(220)},
		}},
		// The WQE starts in the last WQEBB: inline payload and data
		// segments continue at the start of the queue.
		{name: "inline-wrap", cnt: 4, start: 3, qpn: 0x99, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRRDMAWrite, Flags: uverbs.SendInline, RemoteAddr: 0x100, RKey: 1, SGL: inl(100)},
		}},
		{name: "inline-wrap-exact", cnt: 4, start: 7, qpn: 0x99, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(44, 20)},
		}},
		{name: "inline-wrap-split-sge", cnt: 4, start: 11, qpn: 0x99, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRSend, Flags: uverbs.SendInline, SGL: inl(30, 30, 30)},
		}},
		{name: "sge-wrap", cnt: 4, start: 3, qpn: 0x99, wrs: []uverbs.SendWR{
			{ID: 1, Opcode: uverbs.WRRDMAWrite, RemoteAddr: 0x100, RKey: 1,
				SGL: []uverbs.SGE{sge(0x10, 1, 1), sge(0x20, 2, 2), sge(0x30, 3, 3), sge(0x40, 4, 4), sge(0x50, 5, 5)}},
			{ID: 2, Opcode: uverbs.WRSend, SGL: []uverbs.SGE{sge(0x10, 1, 1), sge(0x20, 2, 2), sge(0x30, 3, 3), sge(0x40, 4, 4)}},
		}},
		// The 16-bit WQE index in the control segment wraps too.
		{name: "index-wrap", cnt: 8, start: 0x1fffe, qpn: 0xffffff, wrs: []uverbs.SendWR{
			write(1, one, uverbs.SendSignaled), write(2, one, 0), write(3, one, 0),
		}},
	}
	// Many laps of random requests over rings of several sizes, starting
	// at several producer positions (including across the 16-bit wrap).
	rng := rand.New(rand.NewPCG(1, 2))
	for g, geo := range []struct{ cnt, start uint32 }{{4, 0}, {8, 0xfff0}, {16, 5}, {64, 0xffffffc0}} {
		mixed := sqCase{name: fmt.Sprintf("random-laps-%d", geo.cnt), cnt: geo.cnt, start: geo.start, qpn: 0x31337 + uint32(g)}
		for i := range 300 {
			var wr uverbs.SendWR
			wr.ID = uint64(i)
			wr.Flags = uverbs.SendFlags(rng.IntN(8)) // fence, signaled, solicited
			wr.RemoteAddr = rng.Uint64() &^ 7
			wr.RKey = uverbs.RKey(rng.Uint32())
			wr.Imm = rng.Uint32()
			switch k := rng.IntN(7); k {
			case 5, 6:
				wr.Opcode = uverbs.WROpcode(k)
				wr.CompareAdd, wr.Swap = rng.Uint64(), rng.Uint64()
				wr.SGL = []uverbs.SGE{sge(rng.Uint64(), 8, rng.Uint32())}
			default:
				wr.Opcode = uverbs.WROpcode(k)
				if k != 4 && rng.IntN(3) == 0 {
					wr.Flags |= uverbs.SendInline
					var ns []int
					for range rng.IntN(3) + 1 {
						ns = append(ns, rng.IntN(60))
					}
					wr.SGL = inl(ns...)
				} else {
					for range rng.IntN(5) {
						wr.SGL = append(wr.SGL, sge(rng.Uint64(), uint32(rng.IntN(3))*uint32(rng.IntN(70000)), rng.Uint32()))
					}
				}
			}
			mixed.wrs = append(mixed.wrs, wr)
		}
		cases = append(cases, mixed)
	}
	return cases
}

func cSendWR(s *strings.Builder, name string, wr *uverbs.SendWR) {
	if len(wr.SGL) > 0 {
		fmt.Fprintf(s, "\tstatic struct ibv_sge %s_sg[%d];\n", name, len(wr.SGL))
		for i, g := range wr.SGL {
			if wr.Flags&uverbs.SendInline != 0 {
				src := dma.At(wr.SGL[i].Addr, int(wr.SGL[i].Length))
				fmt.Fprintf(s, "\tstatic uint8_t %s_p%d[] = %s;\n", name, i, cBytes(src))
				fmt.Fprintf(s, "\t%s_sg[%d] = (struct ibv_sge){ .addr = (uintptr_t)%s_p%d, .length = %d, .lkey = %#x };\n", name, i, name, i, g.Length, uint32(g.LKey))
			} else {
				fmt.Fprintf(s, "\t%s_sg[%d] = (struct ibv_sge){ .addr = %#xULL, .length = %d, .lkey = %#x };\n", name, i, g.Addr, g.Length, uint32(g.LKey))
			}
		}
	}
	fmt.Fprintf(s, "\tstruct ibv_send_wr %s = { .wr_id = %d, .opcode = %d, .send_flags = %d, .num_sge = %d, .imm_data = htobe32(%#x) };\n",
		name, wr.ID, wr.Opcode, wr.Flags, len(wr.SGL), wr.Imm)
	if len(wr.SGL) > 0 {
		fmt.Fprintf(s, "\t%s.sg_list = %s_sg;\n", name, name)
	}
	if wr.Opcode == uverbs.WRAtomicCmpAndSwp || wr.Opcode == uverbs.WRAtomicFetchAndAdd {
		fmt.Fprintf(s, "\t%s.wr.atomic.remote_addr = %#xULL; %s.wr.atomic.rkey = %#x; %s.wr.atomic.compare_add = %#xULL; %s.wr.atomic.swap = %#xULL;\n",
			name, wr.RemoteAddr, name, uint32(wr.RKey), name, wr.CompareAdd, name, wr.Swap)
	} else {
		fmt.Fprintf(s, "\t%s.wr.rdma.remote_addr = %#xULL; %s.wr.rdma.rkey = %#x;\n", name, wr.RemoteAddr, name, uint32(wr.RKey))
	}
}

// TestSendWQEBytesMatchMlx5dv posts every case with our builder and with
// the C oracle and compares the whole ring after each post, the producer
// counter, the doorbell record and the 8-byte doorbell value.
func TestSendWQEBytesMatchMlx5dv(t *testing.T) {
	gcc := requireOracle(t)
	cases := sqCases(t)
	var src strings.Builder
	src.WriteString(oraclePrelude)
	src.WriteString("int main(void) {\n")
	for ci, c := range cases {
		fmt.Fprintf(&src, "{\n\tstatic uint8_t buf[%d] __attribute__((aligned(64)));\n", c.cnt*sendWQEBB)
		fmt.Fprintf(&src, "\tstruct ring q = { buf, buf + sizeof(buf), %d, %#x, %#x, %d };\n", c.cnt, c.start, c.qpn, map[bool]int{false: 0, true: 8}[c.sigAll])
		src.WriteString("\tfill_pattern(buf, sizeof(buf));\n")
		for wi := range c.wrs {
			src.WriteString("\t{\n")
			cSendWR(&src, "wr", &c.wrs[wi])
			src.WriteString("\tpost(&q, &wr);\n")
			fmt.Fprintf(&src, "\tprintf(\"S %d %d %%u \", q.cur_post); { uint32_t rec = htobe32(q.cur_post & 0xffff); hexout(&rec, 4); } printf(\" \"); hexout(buf, sizeof(buf)); printf(\"\\n\");\n", ci, wi)
			src.WriteString("\t}\n")
		}
		src.WriteString("}\n")
	}
	src.WriteString("printf(\"X86MISMATCH %d\\n\", x86_mismatch);\nreturn 0;\n}\n")
	out := runOracle(t, gcc, src.String())

	lines := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if f[0] == "X86MISMATCH" {
			if f[1] != "0" {
				t.Errorf("mlx5dv_set_ctrl_seg and mlx5dv_x86_set_ctrl_seg disagree on %s control segments", f[1])
			}
			continue
		}
		lines[f[1]+"/"+f[2]] = f[3:]
	}
	posts := 0
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sq := newTestSQ(t, c.cnt, c.qpn, c.sigAll, 8, int(c.cnt)*sendWQEBB)
			sq.maxPost = 1 << 30 // the oracle never completes anything
			sq.curPost = c.start
			fillPattern(sq.buf)
			for wi := range c.wrs {
				if err := sq.build(&c.wrs[wi]); err != nil {
					t.Fatalf("post %d (%v): %v", wi, c.wrs[wi].Opcode, err)
				}
				posts++
				want, ok := lines[fmt.Sprintf("%d/%d", ci, wi)]
				if !ok {
					t.Fatalf("oracle printed nothing for post %d", wi)
				}
				if got := strconv.FormatUint(uint64(sq.curPost), 10); got != want[0] {
					t.Fatalf("post %d: producer counter %s, mlx5dv %s", wi, got, want[0])
				}
				var rec [4]byte
				binary.LittleEndian.PutUint32(rec[:], bits.ReverseBytes32(sq.curPost&0xffff))
				if got := hex.EncodeToString(rec[:]); got != want[1] {
					t.Fatalf("post %d: doorbell record %s, mlx5dv %s", wi, got, want[1])
				}
				wantRing, _ := hex.DecodeString(want[2])
				if !bytes.Equal(sq.buf, wantRing) {
					for i := range wantRing {
						if sq.buf[i] != wantRing[i] {
							t.Fatalf("post %d (%v, %d SGEs, flags %#x): ring differs first at byte %d (WQEBB %d, +%d): got % x, mlx5dv % x",
								wi, c.wrs[wi].Opcode, len(c.wrs[wi].SGL), c.wrs[wi].Flags, i, i/64, i%64,
								sq.buf[i&^15:i&^15+16], wantRing[i&^15:i&^15+16])
						}
					}
				}
				// The regular doorbell writes the first 8 bytes of the
				// last control segment exactly as they lie in memory.
				var db [8]byte
				binary.LittleEndian.PutUint64(db[:], sq.doorbellValue())
				if !bytes.Equal(db[:], sq.buf[sq.lastCtrl:sq.lastCtrl+8]) {
					t.Fatalf("post %d: doorbell value % x, control segment % x", wi, db, sq.buf[sq.lastCtrl:sq.lastCtrl+8])
				}
			}
		})
	}
	t.Logf("%d posts in %d cases byte-identical with mlx5dv", posts, len(cases))
}
