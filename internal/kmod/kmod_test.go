package kmod

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fixture writes a module tree like Debian 12's rxe closure: rdma_rxe
// needs ib_uverbs, ib_core and the UDP tunnels; ib_core is loaded already,
// crc32c is built in.
func fixture(t *testing.T) (*Loader, *[]string) {
	t.Helper()
	root := t.TempDir()
	mods := filepath.Join(root, "lib/modules/6.1.0-test")
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(mods, "modules.dep"), ""+
		"kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko: kernel/drivers/infiniband/core/ib_uverbs.ko kernel/drivers/infiniband/core/ib_core.ko kernel/net/ipv4/udp_tunnel.ko kernel/net/ipv6/ip6_udp_tunnel.ko\n"+
		"kernel/drivers/infiniband/core/ib_uverbs.ko: kernel/drivers/infiniband/core/ib_core.ko\n"+
		"kernel/drivers/infiniband/core/ib_core.ko:\n"+
		"kernel/net/ipv4/udp_tunnel.ko:\n"+
		"kernel/net/ipv6/ip6_udp_tunnel.ko.xz:\n"+
		"kernel/crypto/crc32_generic.ko:\n"+
		"kernel/loop/a-b.ko: kernel/loop/c.ko\n"+
		"kernel/loop/c.ko: kernel/loop/a-b.ko\n"+
		"kernel/bad/needs_missing.ko: kernel/bad/missing.ko\n")
	write(filepath.Join(mods, "modules.builtin"), "kernel/crypto/crc32c_generic.ko\n")
	write(filepath.Join(root, "sys/module/ib_core/initstate"), "live\n")
	write(filepath.Join(root, "sys/module/crc32c_generic/parameters/x"), "")
	var loaded []string
	l := &Loader{Sys: filepath.Join(root, "sys"), Modules: mods, Release: "6.1.0-test"}
	l.finit = func(p string) error {
		loaded = append(loaded, p)
		return nil
	}
	return l, &loaded
}

func TestFilesOrder(t *testing.T) {
	l, _ := fixture(t)
	files, err := l.Files("rdma-rxe")
	if err != nil {
		t.Fatal(err)
	}
	for i := range files {
		files[i], _ = filepath.Rel(l.Modules, files[i])
	}
	want := []string{"kernel/drivers/infiniband/core/ib_uverbs.ko", "kernel/net/ipv4/udp_tunnel.ko",
		"kernel/net/ipv6/ip6_udp_tunnel.ko.xz", "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"}
	if !slices.Equal(files, want) {
		t.Errorf("files %q, want %q (ib_core is loaded: not again)", files, want)
	}
}

func TestLoad(t *testing.T) {
	l, loaded := fixture(t)
	if err := l.Load("rdma_rxe"); err != nil || len(*loaded) != 4 || filepath.Base((*loaded)[3]) != "rdma_rxe.ko" {
		t.Errorf("load: %v, loaded %q", err, *loaded)
	}
	*loaded = nil
	for _, m := range []string{"ib_core", "crc32c_generic", "crc32c-generic"} {
		if err := l.Load(m); err != nil || len(*loaded) != 0 {
			t.Errorf("load %s (loaded or built in): %v, loaded %q", m, err, *loaded)
		}
	}
	if err := l.Load("a-b"); err != nil || len(*loaded) != 2 { // a cycle loads each once
		t.Errorf("cycle: %v %q", err, *loaded)
	}
	if err := l.Load("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing module: %v", err)
	}
	if err := l.Load("needs_missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing dependency: %v", err)
	}
	l.finit = func(string) error { return os.ErrPermission }
	if err := l.Load("crc32_generic"); !errors.Is(err, os.ErrPermission) {
		t.Errorf("failing finit: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	l, _ := fixture(t)
	for name, want := range map[string]bool{"rdma_rxe": true, "crc32c_generic": true, "siw": false} {
		if got, err := l.Available(name); err != nil || got != want {
			t.Errorf("Available(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	l.Modules = filepath.Join(l.Modules, "absent")
	if _, err := l.Available("rdma_rxe"); err == nil {
		t.Error("no modules.dep: no error")
	}
	if !l.Loaded("ib_core") || l.Loaded("rdma_rxe") {
		t.Error("Loaded")
	}
}
