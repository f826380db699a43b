// Package internal holds the module's internal packages; this test-only
// package enforces the import rules of the whole module.
package internal

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// allowSyscall lists files that may still import syscall outside
// internal/, or golang.org/x/sys/unix outside internal/unix, each with the
// reason and the change that removes it. Keep it empty.
var allowSyscall = map[string]string{}

// importRule checks one file's imports against the module's rules and
// returns the violations:
//   - no cgo, in any file;
//   - unsafe only in files named *_unsafe.go (tests: *_unsafe_test.go);
//   - golang.org/x/sys/unix only in internal/unix, tests included: every
//     other package calls the kernel through that one list (dependencies
//     such as cilium/ebpf are not walked);
//   - syscall only in internal/ (tests exempt: they send signals and check
//     errnos).
//
// path is slash-separated and relative to the module root.
func importRule(path string, imports []string) []string {
	base := filepath.Base(path)
	test := strings.HasSuffix(base, "_test.go")
	var bad []string
	for _, p := range imports {
		switch p {
		case "C":
			bad = append(bad, path+": imports \"C\" (cgo); te builds with CGO_ENABLED=0")
		case "unsafe":
			if !strings.HasSuffix(base, "_unsafe.go") && !strings.HasSuffix(base, "_unsafe_test.go") {
				bad = append(bad, path+": imports unsafe outside a *_unsafe.go file")
			}
		case "golang.org/x/sys/unix":
			if !strings.HasPrefix(path, "internal/unix/") {
				if _, ok := allowSyscall[path]; !ok {
					bad = append(bad, path+": imports "+p+" outside internal/unix (call internal/unix)")
				}
			}
		case "syscall":
			if !test && !strings.HasPrefix(path, "internal/") {
				if _, ok := allowSyscall[path]; !ok {
					bad = append(bad, path+": imports "+p+" outside internal/")
				}
			}
		}
	}
	return bad
}

func TestImportRuleCases(t *testing.T) {
	for _, c := range []struct {
		path    string
		imports []string
		bad     int
	}{
		{"uverbs/qp.go", []string{"fmt", "github.com/rdmago/te/internal/ucmd"}, 0},
		{"uverbs/qp.go", []string{"syscall"}, 1},
		{"rdma/poll.go", []string{"golang.org/x/sys/unix", "unsafe"}, 2},
		{"internal/ucmd/file_linux.go", []string{"github.com/rdmago/te/internal/unix", "syscall"}, 0},
		{"internal/ucmd/file_linux.go", []string{"golang.org/x/sys/unix"}, 1},
		{"internal/unix/unix_linux.go", []string{"golang.org/x/sys/unix"}, 0},
		{"internal/ucmd/write_test.go", []string{"golang.org/x/sys/unix"}, 1},
		{"internal/ucmd/bytes.go", []string{"unsafe"}, 1},
		{"internal/ucmd/bytes_unsafe.go", []string{"unsafe"}, 0},
		{"engine/memory_unsafe.go", []string{"unsafe"}, 0},
		{"engine/mem_test.go", []string{"syscall"}, 0},
		{"engine/mem_test.go", []string{"golang.org/x/sys/unix"}, 1},
		{"engine/mem_test.go", []string{"unsafe"}, 1},
		{"engine/view_unsafe_test.go", []string{"unsafe"}, 0},
		{"internal/x/x_test.go", []string{"C"}, 1},
		{"cmd/te/main.go", []string{"C", "syscall"}, 2},
		{"engine/mem_unix.go", []string{"syscall"}, 1},
	} {
		if got := importRule(c.path, c.imports); len(got) != c.bad {
			t.Errorf("%s %v: %d violations %q, want %d", c.path, c.imports, len(got), got, c.bad)
		}
	}
}

// TestImportRules parses every Go file of the module (tests, other
// platforms' files and ignored files included; testdata and nested
// modules excluded) and applies importRule.
func TestImportRules(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	fset := token.NewFileSet()
	var files int
	imported := map[string][]string{} // path -> imports, for the sanity checks
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p == root {
				return nil
			}
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		af, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		var imps []string
		for _, im := range af.Imports {
			s, err := strconv.Unquote(im.Path.Value)
			if err != nil {
				return err
			}
			imps = append(imps, s)
		}
		files++
		imported[rel] = imps
		for _, v := range importRule(rel, imps) {
			t.Error(v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw the module: files that must be there, with the imports
	// the rules are about.
	if files < 100 {
		t.Errorf("only %d Go files found under %s", files, root)
	}
	for p, want := range map[string]string{
		"internal/unix/unix_linux.go":   "golang.org/x/sys/unix",
		"internal/ucmd/file_linux.go":   "github.com/rdmago/te/internal/unix",
		"internal/ucmd/bytes_unsafe.go": "unsafe",
		"internal/importrules_test.go":  "go/parser",
		"engine/memory_unsafe.go":       "unsafe",
		"internal/uapi/layout_test.go":  "",
	} {
		imps, ok := imported[p]
		if !ok {
			t.Errorf("walk missed %s", p)
		} else if want != "" && !slices.Contains(imps, want) {
			t.Errorf("%s: imports %v, expected %s among them", p, imps, want)
		}
	}
	for p, why := range allowSyscall {
		imps, ok := imported[p]
		if !ok || (!slices.Contains(imps, "syscall") && !slices.Contains(imps, "golang.org/x/sys/unix")) {
			t.Logf("allowSyscall entry %s (%s) is no longer needed: delete it", p, why)
		}
	}
}
