package uverbs_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLayering enforces two rules on the packages of the verbs stack:
// unsafe is imported only by *_unsafe.go (and test) files, and
// golang.org/x/sys/unix only under internal/.
func TestLayering(t *testing.T) {
	root := ".."
	dirs := []string{"uverbs", "rxe", "internal/uapi", "internal/ucmd", "internal/dma", "internal/rdmanl"}
	for _, d := range dirs {
		files, _ := filepath.Glob(filepath.Join(root, d, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if p == "unsafe" && !strings.HasSuffix(f, "_unsafe.go") {
					t.Errorf("%s imports unsafe outside a *_unsafe.go file", f)
				}
				if p == "golang.org/x/sys/unix" && !strings.HasPrefix(d, "internal/") {
					t.Errorf("%s imports x/sys/unix outside internal/", f)
				}
			}
		}
	}
}
