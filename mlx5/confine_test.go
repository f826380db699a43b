//go:build amd64 || arm64

package mlx5

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnsafeConfined keeps raw memory access where it is reviewed: in this
// package only mem_unsafe.go may import unsafe (besides tests), and only
// the per-architecture mmio_*.s files are assembly.
func TestUnsafeConfined(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if imp.Path.Value == `"unsafe"` && f != "mem_unsafe.go" {
				t.Errorf("%s imports unsafe; raw memory access belongs in mem_unsafe.go", f)
			}
		}
	}
	asm, _ := filepath.Glob("*.s")
	if strings.Join(asm, " ") != "mmio_amd64.s mmio_arm64.s" {
		t.Errorf("assembly files %v, want only mmio_amd64.s and mmio_arm64.s", asm)
	}
	if _, err := os.Stat("mem_unsafe.go"); err != nil {
		t.Fatal(err)
	}
}
