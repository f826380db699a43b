package mlx5

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/testenv"
)

// requireGCC returns the gcc path, skipping on a laptop without gcc or the
// UAPI header but failing under CI=true, where both are part of the image.
func requireGCC(t *testing.T, header string) string {
	t.Helper()
	return testenv.GCC(t, "gcc linux-libc-dev", header)
}

// layoutCase pairs a Go ABI struct with its C struct name.
type layoutCase struct {
	c  string
	gt reflect.Type
}

func abiCases() []layoutCase {
	return []layoutCase{
		{"mlx5_ib_alloc_ucontext_req_v2", reflect.TypeFor[AllocUcontextReqV2]()},
		{"mlx5_ib_alloc_ucontext_resp", reflect.TypeFor[AllocUcontextResp]()},
		{"mlx5_ib_alloc_pd_resp", reflect.TypeFor[AllocPDResp]()},
		{"mlx5_ib_create_cq", reflect.TypeFor[CreateCQ]()},
		{"mlx5_ib_create_cq_resp", reflect.TypeFor[CreateCQResp]()},
		{"mlx5_ib_create_qp", reflect.TypeFor[CreateQP]()},
		{"mlx5_ib_create_qp_resp", reflect.TypeFor[CreateQPResp]()},
	}
}

// TestLayoutAgainstHeader compiles a C program against
// /usr/include/rdma/mlx5-abi.h that prints sizeof and offsetof/sizeof of
// every member named by a `c` tag, and compares with reflect's sizes and
// field offsets (= unsafe.Sizeof and Offsetof) of the Go structs.
func TestLayoutAgainstHeader(t *testing.T) {
	gcc := requireGCC(t, "/usr/include/rdma/mlx5-abi.h")
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include <rdma/mlx5-abi.h>\n#include <rdma/mlx5_user_ioctl_cmds.h>\n#include <rdma/mlx5_user_ioctl_verbs.h>\nint main(void){\n")
	type want struct {
		key      string
		off, len uintptr
	}
	var wants []want
	for _, c := range abiCases() {
		fmt.Fprintf(&src, "printf(\"%s sizeof %%zu\\n\", sizeof(struct %s));\n", c.c, c.c)
		wants = append(wants, want{c.c + " sizeof", c.gt.Size(), 0})
		for i := 0; i < c.gt.NumField(); i++ {
			f := c.gt.Field(i)
			tag := f.Tag.Get("c")
			if tag == "" {
				if f.Name != "_" {
					t.Errorf("%s.%s has no c tag", c.gt.Name(), f.Name)
				}
				continue
			}
			fmt.Fprintf(&src, "printf(\"%s.%s %%zu %%zu\\n\", offsetof(struct %s, %s), sizeof(((struct %s*)0)->%s));\n",
				c.c, tag, c.c, tag, c.c, tag)
			wants = append(wants, want{c.c + "." + tag, f.Offset, f.Type.Size()})
		}
	}
	// Constants mirrored from the headers.
	consts := map[string]uint64{
		"MLX5_IB_UVERBS_ABI_VERSION":             ABIVersion,
		"MLX5_LIB_CAP_4K_UAR":                    LibCap4KUAR,
		"MLX5_LIB_CAP_DYN_UAR":                   LibCapDynUAR,
		"MLX5_QP_FLAG_SCATTER_CQE":               QPFlagScatterCQE,
		"MLX5_QP_FLAG_BFREG_INDEX":               QPFlagBFRegIndex,
		"MLX5_QP_FLAG_UAR_PAGE_INDEX":            QPFlagUARPageIndex,
		"MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD":   CQFlagCQE128BPad,
		"MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX": CQFlagUARPageIndex,
		"MLX5_IB_MMAP_REGULAR_PAGE":              MmapRegularPage,
		"MLX5_IB_MMAP_WC_PAGE":                   MmapWCPage,
		"MLX5_IB_MMAP_NC_PAGE":                   MmapNCPage,
		"MLX5_IB_OBJECT_UAR":                     ObjectUAR,
		"MLX5_IB_METHOD_UAR_OBJ_ALLOC":           MethodUARObjAlloc,
		"MLX5_IB_METHOD_UAR_OBJ_DESTROY":         MethodUARObjDestroy,
		"MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE":      AttrUARAllocHandle,
		"MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE":        AttrUARAllocType,
		"MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET": AttrUARAllocMmapOff,
		"MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH": AttrUARAllocMmapLen,
		"MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID":     AttrUARAllocPageID,
		"MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE":    AttrUARDestroyHandle,
		"MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF":         UARAllocTypeBF,
		"MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC":         UARAllocTypeNC,
	}
	for name, v := range consts {
		fmt.Fprintf(&src, "printf(\"const %s %%llu\\n\", (unsigned long long)(%s));\n", name, name)
		wants = append(wants, want{"const " + name, uintptr(v), 0})
	}
	fmt.Fprintf(&src, "printf(\"const offsetof_ece %%zu\\n\", offsetof(struct mlx5_ib_create_qp, ece_options));\n")
	wants = append(wants, want{"const offsetof_ece", CreateQPMinLen, 0})
	src.WriteString("return 0;}\n")

	got := runC(t, gcc, src.String())
	for _, w := range wants {
		fields, ok := got[w.key]
		if !ok {
			t.Errorf("%s: not printed by the C program", w.key)
			continue
		}
		if fields[0] != uint64(w.off) {
			t.Errorf("%s: Go offset/value %d, C %d", w.key, w.off, fields[0])
		}
		if len(fields) > 1 && fields[1] != uint64(w.len) {
			t.Errorf("%s: Go size %d, C %d", w.key, w.len, fields[1])
		}
	}
}

// runC compiles and runs src, returning its output lines keyed by the first
// word(s) before the numbers.
func runC(t *testing.T, gcc, src string) map[string][]uint64 {
	t.Helper()
	dir := t.TempDir()
	cfile := filepath.Join(dir, "layout.c")
	bin := filepath.Join(dir, "layout")
	if err := os.WriteFile(cfile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O0", "-Wall", "-Werror", "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run C layout program: %v", err)
	}
	res := map[string][]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		var key []string
		var nums []uint64
		for _, s := range f {
			if n, err := strconv.ParseUint(s, 10, 64); err == nil && len(key) > 0 {
				nums = append(nums, n)
			} else {
				key = append(key, s)
			}
		}
		res[strings.Join(key, " ")] = nums
	}
	return res
}

func TestBytesAliasesStruct(t *testing.T) {
	var r CreateQPResp
	b := Bytes(&r)
	if len(b) != SizeCreateQPResp {
		t.Fatalf("len %d", len(b))
	}
	b[0] = 7 // the kernel writes responses through this view
	b[24] = 0x11
	if r.BFRegIndex != 7 || r.SQN != 0x11 {
		t.Fatalf("Bytes does not alias the struct: %+v", r)
	}
}

func TestUAROffset(t *testing.T) {
	for _, c := range []struct {
		cmd, idx int
		want     int64
	}{
		{MmapRegularPage, 0, 0},
		{MmapRegularPage, 3, 3 * 4096},
		{MmapNCPage, 0, 0x300 * 4096},
		{MmapNCPage, 5, 0x305 * 4096},
		{MmapWCPage, 0x102, (0x10000 | 0x200 | 0x02) * 4096},
	} {
		if got := UAROffset(c.cmd, c.idx, 4096); got != c.want {
			t.Errorf("UAROffset(%d,%d) = %#x, want %#x", c.cmd, c.idx, got, c.want)
		}
	}
}

func TestMapUAR(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "uar")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := UAROffset(MmapNCPage, 1, PageSize)
	if err := f.Truncate(off + int64(PageSize)); err != nil {
		t.Fatal(err)
	}
	b, err := MapUAR(int(f.Fd()), off, PageSize)
	if err != nil {
		t.Fatal(err)
	}
	b[0x800] = 0x5a // write-only mapping, like a UAR
	if err := Unmap(b); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1)
	if _, err := f.ReadAt(got, off+0x800); err != nil || got[0] != 0x5a {
		t.Fatalf("store through the mapping not in the file: %v %x", err, got)
	}
	if err := Unmap(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := MapUAR(-1, 0, PageSize); err == nil {
		t.Fatal("MapUAR on a bad fd succeeded")
	}
}
