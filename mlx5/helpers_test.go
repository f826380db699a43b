//go:build amd64 || arm64

package mlx5

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/dma"

	"github.com/rdmago/te/internal/testenv"
)

// mapped returns n bytes of anonymous mmap'd memory unmapped at cleanup:
// rings the "HCA" and the code under test share are never Go heap.
func mapped(t testing.TB, n int) []byte {
	t.Helper()
	r, err := dma.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Unmap() })
	return r.Bytes()
}

// newTestSQ returns a send queue of cnt WQEBBs over mapped memory.
func newTestSQ(t testing.TB, cnt uint32, qpn uint32, sigAll bool, maxGS, maxInline int) *sendQueue {
	sq := &sendQueue{
		buf:       mapped(t, int(cnt)*sendWQEBB),
		cnt:       cnt,
		maxPost:   cnt,
		maxGS:     maxGS,
		maxInline: maxInline,
		qpn:       qpn,
		wrid:      make([]uint64, cnt),
		wqeHead:   make([]uint32, cnt),
	}
	if sigAll {
		sq.sigAll = ctrlCQUpdate
	}
	return sq
}

// requireOracle returns gcc and checks for rdma-core's mlx5dv.h. Both are
// part of the CI image (apt-get install gcc libibverbs-dev): there a
// missing one fails the test; elsewhere it skips loudly.
func requireOracle(t testing.TB) string {
	t.Helper()
	return testenv.GCC(t, "gcc libibverbs-dev", "/usr/include/infiniband/mlx5dv.h")
}

// runOracle compiles a C program against mlx5dv.h and returns its stdout.
func runOracle(t testing.TB, gcc, src string) string {
	t.Helper()
	dir := t.TempDir()
	c := filepath.Join(dir, "oracle.c")
	bin := filepath.Join(dir, "oracle")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-O1", "-mssse3", "-Wall", "-Werror", "-Wno-unused-function", "-Wno-unused-variable", "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc oracle: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run oracle: %v", err)
	}
	return string(out)
}

// cBytes renders b as a C array initializer.
func cBytes(b []byte) string {
	var s strings.Builder
	s.WriteString("{")
	for i, v := range b {
		if i > 0 {
			s.WriteString(",")
		}
		fmt.Fprintf(&s, "%d", v)
	}
	if len(b) == 0 {
		s.WriteString("0")
	}
	s.WriteString("}")
	return s.String()
}

// fillPattern writes a recognisable non-zero pattern, so that a byte one
// side writes and the other leaves alone shows up as a difference.
func fillPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
}

// unsafeRecordBytes returns the 4 bytes behind a doorbell record pointer.
func unsafeRecordBytes(p *uint32) []byte {
	return recordBytes(p)
}
