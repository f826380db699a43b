// Package kmod loads kernel modules for hosts where modprobe is missing
// (minimal images, containers with the host's /lib/modules mounted): the
// module's modules.dep closure, dependencies first, one finit_module(2)
// per file. Where modprobe exists it is used instead, so aliases,
// blacklists and options keep working.
package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotFound means the module is neither in modules.dep nor built in.
var ErrNotFound = errors.New("kmod: no such module")

// Loader loads modules of one kernel release.
type Loader struct {
	Sys      string // sysfs root, "/sys"
	Modules  string // "/lib/modules/<release>"
	Release  string // uname -r
	Modprobe string // path of modprobe; "" loads with finit_module
	// finit loads one module file; tests replace it.
	finit func(path string) error
}

// Default is the running kernel's Loader, using modprobe when it is on
// PATH or in /sbin, /usr/sbin.
func Default() *Loader {
	rel := release()
	l := &Loader{Sys: "/sys", Modules: filepath.Join("/lib/modules", rel), Release: rel, finit: finitModule}
	if p, err := lookModprobe(); err == nil {
		l.Modprobe = p
	}
	return l
}

// Name is a module's canonical name: dashes read as underscores, as the
// kernel does.
func Name(s string) string {
	s = filepath.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// Loaded reports whether the module is live in the kernel (loaded, or
// built in with a sysfs entry).
func (l *Loader) Loaded(name string) bool {
	dir := filepath.Join(l.Sys, "module", Name(name))
	if st, err := os.ReadFile(filepath.Join(dir, "initstate")); err == nil {
		return strings.TrimSpace(string(st)) == "live"
	}
	// built-in modules have no initstate; a directory means present
	_, err := os.Stat(dir)
	return err == nil && l.Builtin(name)
}

// Builtin reports whether modules.builtin lists the module.
func (l *Loader) Builtin(name string) bool {
	f, err := os.Open(filepath.Join(l.Modules, "modules.builtin"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if Name(sc.Text()) == Name(name) {
			return true
		}
	}
	return false
}

// Available reports whether the kernel has the module, as a loadable
// file or built in. It errs only when modules.dep cannot be read.
func (l *Loader) Available(name string) (bool, error) {
	if l.Builtin(name) {
		return true, nil
	}
	dep, err := l.readDep()
	if err != nil {
		return false, err
	}
	_, ok := dep[Name(name)]
	return ok, nil
}

type depEntry struct {
	file string   // relative to Modules
	deps []string // module names
}

// readDep parses modules.dep: "path.ko: dep.ko dep2.ko".
func (l *Loader) readDep() (map[string]depEntry, error) {
	f, err := os.Open(filepath.Join(l.Modules, "modules.dep"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("kmod: the module tree of kernel %s is not installed (no %s): %w", l.Release, l.Modules, err)
		}
		return nil, fmt.Errorf("kmod: %w", err)
	}
	defer f.Close()
	out := map[string]depEntry{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		file, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || file == "" {
			continue
		}
		e := depEntry{file: file}
		for _, d := range strings.Fields(rest) {
			e.deps = append(e.deps, Name(d))
		}
		out[Name(file)] = e
	}
	return out, sc.Err()
}

// Files returns the module files to load for name, dependencies first,
// skipping modules already loaded or built in.
func (l *Loader) Files(name string) ([]string, error) {
	dep, err := l.readDep()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	var visit func(n string, depth int) error
	visit = func(n string, depth int) error {
		if seen[n] {
			return nil
		}
		seen[n] = true
		if depth > 64 {
			return fmt.Errorf("kmod: modules.dep: dependency chain through %s too deep", n)
		}
		if l.Loaded(n) || l.Builtin(n) {
			return nil
		}
		e, ok := dep[n]
		if !ok {
			return fmt.Errorf("%w: %s (not in %s/modules.dep)", ErrNotFound, n, l.Modules)
		}
		for _, d := range e.deps {
			if err := visit(d, depth+1); err != nil {
				return err
			}
		}
		f := e.file
		if !filepath.IsAbs(f) {
			f = filepath.Join(l.Modules, f)
		}
		out = append(out, f)
		return nil
	}
	return out, visit(Name(name), 0)
}

// Load makes the module live: nothing when it already is, else modprobe
// (when l.Modprobe is set) or finit_module of its modules.dep closure.
func (l *Loader) Load(name string) error {
	if l.Loaded(name) || l.Builtin(name) {
		return nil
	}
	if l.Modprobe != "" {
		return runModprobe(l.Modprobe, Name(name))
	}
	files, err := l.Files(name)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := l.finit(f); err != nil {
			return fmt.Errorf("kmod: load %s: %w", f, err)
		}
	}
	return nil
}
