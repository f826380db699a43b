package rdmasetup

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/kmod"
)

type fakeHost struct {
	t    *testing.T
	root string
	Host
}

func newFake(t *testing.T) *fakeHost {
	root := t.TempDir()
	f := &fakeHost{t: t, root: root}
	f.Host = Host{Sys: filepath.Join(root, "sys"), Dev: filepath.Join(root, "dev"),
		Modules: &kmod.Loader{Sys: filepath.Join(root, "sys"), Modules: filepath.Join(root, "lib/modules/6.1.0-test"), Release: "6.1.0-test"},
		Netdevs: func() ([]Netdev, error) {
			return []Netdev{
				{Name: "lo", Up: true, Loopback: true, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}},
				{Name: "docker0", Up: false, Addrs: []netip.Addr{netip.MustParseAddr("172.17.0.1")}},
				{Name: "eth0", Up: true, Addrs: []netip.Addr{netip.MustParseAddr("fe80::1"), netip.MustParseAddr("10.0.0.5")}},
			}, nil
		}}
	return f
}

func (f *fakeHost) write(p, s string) {
	f.t.Helper()
	p = filepath.Join(f.root, p)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// device adds an RDMA device to the fake sysfs, with a uverbs char device
// when uverbs is not "", bound to netdev parent when parent is not "".
func (f *fakeHost) device(name, uverbs, parent string) {
	f.write("sys/class/infiniband/"+name+"/node_guid", "0000:0000:0000:0000\n")
	if parent != "" {
		f.write("sys/class/infiniband/"+name+"/parent", parent+"\n")
	}
	if uverbs != "" {
		f.write("sys/class/infiniband_verbs/"+uverbs+"/ibdev", name+"\n")
	}
}

func text(fs []Finding) string { return Explain(fs) }

func TestSummary(t *testing.T) {
	got := Summary([]Finding{{Problem: "a"}, {Problem: "b", Fix: "run x"}, {Problem: "c", Fix: "run y"}})
	if got != "a; b; c; fix: run x, then run y" {
		t.Errorf("summary %q", got)
	}
}

func TestDiagnoseNoDevice(t *testing.T) {
	f := newFake(t)
	// no modules tree at all: say what is known
	got := text(f.Diagnose())
	for _, want := range []string{"/sys/class/infiniband is empty", filepath.Join(f.root, "dev/infiniband") + " is missing",
		"whether kernel 6.1.0-test has it is unknown", "sudo te rxe add eth0", "10.0.0.5"} {
		if !strings.Contains(got, want) {
			t.Errorf("no modules tree: %q missing from\n%s", want, got)
		}
	}
	// the module exists but is not loaded
	f.write("lib/modules/6.1.0-test/modules.dep", "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko:\n")
	got = text(f.Diagnose())
	if !strings.Contains(got, "rdma_rxe (Soft-RoCE) is not loaded") || !strings.Contains(got, "fix: sudo te rxe add eth0") {
		t.Errorf("module not loaded:\n%s", got)
	}
	// the kernel lacks it
	f.write("lib/modules/6.1.0-test/modules.dep", "kernel/net/veth.ko:\n")
	if got = text(f.Diagnose()); !strings.Contains(got, "has no rdma_rxe module") || !strings.Contains(got, "linux-modules-extra") {
		t.Errorf("no module:\n%s", got)
	}
	// loaded, no link; a hardware driver loaded too
	f.write("sys/module/rdma_rxe/initstate", "live\n")
	f.write("sys/module/mlx5_ib/initstate", "live\n")
	got = text(f.Diagnose())
	if !strings.Contains(got, "loaded, but no netdev has an RDMA link") || !strings.Contains(got, "mlx5_ib") {
		t.Errorf("loaded, no link:\n%s", got)
	}
	// no candidate netdev: name them
	f.Netdevs = func() ([]Netdev, error) { return []Netdev{{Name: "eth1", Up: false}}, nil }
	if got = text(f.Diagnose()); !strings.Contains(got, "te rxe add NETDEV") || !strings.Contains(got, "eth1 (down)") {
		t.Errorf("no candidate:\n%s", got)
	}
}

func TestDiagnoseDevices(t *testing.T) {
	f := newFake(t)
	f.device("mlx5_0", "", "")
	if got := text(f.Diagnose()); !strings.Contains(got, "mlx5_0 exist, but none has a uverbs") || !strings.Contains(got, "modprobe ib_uverbs") {
		t.Errorf("no uverbs:\n%s", got)
	}
	f.device("mlx5_0", "uverbs0", "")
	if got := text(f.Diagnose()); !strings.Contains(got, "/dev/infiniband is missing") {
		t.Errorf("no /dev/infiniband:\n%s", got)
	}
	f.write("dev/infiniband/uverbs0", "")
	if got := f.Diagnose(); len(got) != 0 {
		t.Errorf("a usable device: findings\n%s", text(got))
	}
	if os.Geteuid() != 0 { // root opens anything
		os.Chmod(filepath.Join(f.root, "dev/infiniband/uverbs0"), 0)
		if got := text(f.Diagnose()); !strings.Contains(got, "no permission to open") {
			t.Errorf("unreadable device:\n%s", got)
		}
	}
}

func TestAddDelRXE(t *testing.T) {
	f := newFake(t)
	f.device("rxe0", "uverbs0", "lo")
	oldNew, oldDel := newLink, delLink
	t.Cleanup(func() { newLink, delLink = oldNew, oldDel })
	var calls []string
	newLink = func(ib, nd, typ string) error {
		calls = append(calls, "add "+ib+" "+nd+" "+typ)
		f.device(ib, "uverbs9", nd)
		f.write("sys/class/infiniband/"+ib+"/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001\n")
		f.write("sys/class/infiniband/"+ib+"/ports/1/gids/1", "0000:0000:0000:0000:0000:ffff:0a00:0005\n")
		return nil
	}
	delLink = func(ib string) error { calls = append(calls, "del "+ib); return nil }

	f.Modules.Modprobe = "" // rdma_rxe "loaded": nothing to load
	f.write("sys/module/rdma_rxe/initstate", "live\n")
	ctx := context.Background()
	name, err := f.AddRXE(ctx, "eth0", "")
	if err != nil || name != "rxe1" {
		t.Fatalf("add: %q %v", name, err)
	}
	if _, err := f.AddRXE(ctx, "eth0", ""); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "te rxe del rxe1") {
		t.Errorf("second link on eth0: %v", err)
	}
	if _, err := f.AddRXE(ctx, "eth9", ""); !errors.Is(err, ErrNoNetdev) || !strings.Contains(err.Error(), "eth0") {
		t.Errorf("missing netdev: %v", err)
	}
	if _, err := f.AddRXE(ctx, "docker0", "rxe0"); !errors.Is(err, ErrExists) {
		t.Errorf("taken name: %v", err)
	}
	for _, bad := range []string{"a/b", "rxe%d", strings.Repeat("x", 64)} {
		if _, err := f.AddRXE(ctx, "docker0", bad); err == nil || !strings.Contains(err.Error(), "device name") {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	newLink = func(string, string, string) error { return os.ErrPermission }
	if _, err := f.AddRXE(ctx, "docker0", ""); !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "needs root") {
		t.Errorf("not root: %v", err)
	}
	f.device("mlx5_0", "uverbs1", "")
	for name, want := range map[string]error{"rxe7": ErrNoDevice, "mlx5_0": ErrNotRXE} {
		if err := f.DelRXE(name); !errors.Is(err, want) {
			t.Errorf("del %s: %v, want %v", name, err, want)
		}
	}
	if err := f.DelRXE("rxe1"); err != nil {
		t.Fatal(err)
	}
	if want := "add rxe1 eth0 rxe|del rxe1"; strings.Join(calls, "|") != want {
		t.Errorf("calls %q, want %q", calls, want)
	}
}

func TestAddRXEWaitsForGID(t *testing.T) {
	f := newFake(t)
	f.write("sys/module/rdma_rxe/initstate", "live\n")
	old := newLink
	t.Cleanup(func() { newLink = old })
	newLink = func(ib, nd, typ string) error { f.device(ib, "uverbs0", nd); return nil } // no IPv4 GID ever
	ctx, cancel := context.WithTimeout(context.Background(), 100e6)
	defer cancel()
	if _, err := f.AddRXE(ctx, "eth0", "rxe5"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "IPv4 GID") {
		t.Errorf("no GID: %v", err)
	}
}
