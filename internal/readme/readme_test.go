package readme

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// TestSnippetCompiles builds every complete program (a ```go block that
// starts with "package main") in README.md against this module: the file
// is laid over a directory of the module with go build -overlay, so the
// snippet sees the module's packages as a user's program would.
func TestSnippetCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindAllSubmatch(md, -1)
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go block with a complete program (package main)")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	for i, b := range blocks {
		dir := t.TempDir()
		src := filepath.Join(dir, "main.go")
		if err := os.WriteFile(src, b[1], 0o644); err != nil {
			t.Fatal(err)
		}
		// A directory that exists in no checkout: the overlay supplies its
		// only file.
		virt := filepath.Join(root, "internal", "readme", "snippet", "main.go")
		ov, _ := json.Marshal(map[string]any{"Replace": map[string]string{virt: src}})
		ovf := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(ovf, ov, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(gobin, "build", "-overlay", ovf, "-o", filepath.Join(dir, "snippet"), "./internal/readme/snippet")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("README program %d does not build: %v\n%s", i+1, err, out)
		}
	}
}
