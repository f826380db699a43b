package uverbs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysfs builds an rxe-shaped and an mlx5-shaped device tree.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	w := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w("class/infiniband_verbs/uverbs1/ibdev", "rxe0")
	w("class/infiniband_verbs/uverbs1/abi_version", "2")
	w("class/infiniband_verbs/uverbs0/ibdev", "mlx5_0")
	w("class/infiniband_verbs/uverbs0/abi_version", "1")
	rxe := "class/infiniband/rxe0/"
	w(rxe+"parent", "veth0")
	w(rxe+"node_guid", "7cfe:90ff:fe00:0001")
	w(rxe+"ports/1/state", "4: ACTIVE")
	w(rxe+"ports/1/link_layer", "Ethernet")
	w(rxe+"ports/1/gids/0", "fe80:0000:0000:0000:7cfe:90ff:fe00:0001")
	w(rxe+"ports/1/gid_attrs/types/0", "RoCE v2")
	w(rxe+"ports/1/gid_attrs/ndevs/0", "veth0")
	w(rxe+"ports/1/gids/1", "0000:0000:0000:0000:0000:0000:0000:0000") // hole (types/1 missing: EINVAL)
	w(rxe+"ports/1/gids/2", "0000:0000:0000:0000:0000:ffff:0a00:0101")
	w(rxe+"ports/1/gid_attrs/types/2", "RoCE v2")
	w(rxe+"ports/1/gid_attrs/ndevs/2", "veth0")
	w("class/net/veth0/ifindex", "3")
	mlx := "class/infiniband/mlx5_0/"
	w(mlx+"ports/1/state", "1: DOWN")
	w(mlx+"ports/1/link_layer", "Ethernet")
	w(mlx+"ports/1/gids/2", "0000:0000:0000:0000:0000:ffff:c0a8:0001")
	w(mlx+"ports/1/gid_attrs/types/2", "IB/RoCE v1")
	w(mlx+"ports/1/gids/3", "0000:0000:0000:0000:0000:ffff:c0a8:0001")
	w(mlx+"ports/1/gid_attrs/types/3", "RoCE v2")
	w(mlx+"device/numa_node", "1")
	w("bus/pci/drivers/mlx5_core/bind", "")
	if err := os.MkdirAll(filepath.Join(root, mlx, "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../bus/pci/drivers/mlx5_core", filepath.Join(root, mlx, "device/driver")); err != nil {
		t.Fatal(err)
	}
	old, oldNL := sysfs, netlinkDriverID
	sysfs = root
	netlinkDriverID = func(string, map[string]uint32, bool) (DriverID, bool) { return 0, false }
	t.Cleanup(func() { sysfs, netlinkDriverID = old, oldNL })
	return root
}

func TestDiscoveryFromSysfs(t *testing.T) {
	fakeSysfs(t)
	ds, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0].Name != "mlx5_0" || ds[1].Name != "rxe0" {
		t.Fatalf("devices %+v", ds)
	}
	m, r := ds[0], ds[1]
	if m.DriverID != DriverMLX5 || m.ABIVersion != 1 || m.Uverbs != "uverbs0" || m.Path != "/dev/infiniband/uverbs0" || m.NUMANode != 1 {
		t.Errorf("mlx5 %+v", m)
	}
	if r.DriverIDFrom != "sysfs" || r.DriverID != DriverRXE || r.ABIVersion != 2 || r.Parent != "veth0" || r.Ports != 1 || r.Uverbs != "uverbs1" || r.NUMANode != -1 {
		t.Errorf("rxe %+v", r)
	}
	if s, err := r.PortState(1); err != nil || s != PortActive || s.String() != "ACTIVE" {
		t.Errorf("port state %v %v", s, err)
	}
	if _, err := r.PortState(2); err == nil {
		t.Error("missing port has a state")
	}
	gids, err := r.GIDs(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(gids) != 2 || gids[0].Index != 0 || gids[1].Index != 2 || gids[1].Netdev != "veth0" || gids[1].Ifindex != 3 {
		t.Fatalf("gids %+v", gids)
	}
	g, err := FindGID(gids, netip.MustParseAddr("10.0.1.1"), GIDTypeRoCEv2)
	if err != nil || g.Index != 2 || g.GID.String() != "::ffff:10.0.1.1" || g.GID.Addr() != netip.MustParseAddr("10.0.1.1") {
		t.Fatalf("FindGID: %+v %v", g, err)
	}
	if _, err := FindGID(gids, netip.MustParseAddr("10.0.1.2"), GIDTypeRoCEv2); !errors.Is(err, ErrNoGID) {
		t.Fatalf("missing GID: %v", err)
	}
	// mlx5 has v1 and v2 entries for the same address: selection is by type, not index.
	mg, _ := m.GIDs(1)
	g, err = FindGID(mg, netip.MustParseAddr("192.168.0.1"), GIDTypeRoCEv2)
	if err != nil || g.Index != 3 {
		t.Fatalf("mlx5 RoCE v2 GID: %+v %v", g, err)
	}
	if d, g, err := DeviceForAddr(netip.MustParseAddr("192.168.0.1")); err != nil || d.Name != "mlx5_0" || g.Index != 3 {
		t.Errorf("DeviceForAddr: %s %+v %v", d.Name, g, err)
	}
	if _, _, err := DeviceForAddr(netip.MustParseAddr("10.9.9.9")); !errors.Is(err, ErrNoGID) {
		t.Errorf("DeviceForAddr of an unknown address: %v", err)
	}
	if _, err := LookupDevice("nope"); !errors.Is(err, ErrNoDevice) {
		t.Fatal(err)
	}
	if _, err := Open("rxe0", &Options{Providers: []Provider{}}); !errors.Is(err, ErrNoProvider) {
		t.Fatalf("open without a provider: %v", err)
	}
}

func TestParseSysfsGID(t *testing.T) {
	for _, bad := range []string{"", "fe80::1", "0000:0000:0000:0000:0000:ffff:0a00", "zzzz:0000:0000:0000:0000:ffff:0a00:0001"} {
		if _, err := parseSysfsGID(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestNames(t *testing.T) {
	if MTU1024.Bytes() != 1024 || MTU(9).Bytes() != 0 || MTU4096.String() != "4096" {
		t.Error("MTU")
	}
	if QPStateRTS.String() != "RTS" || QPState(9).String() != "QPState(9)" {
		t.Error("QPState")
	}
	if WRAtomicFetchAndAdd.String() != "ATOMIC_FETCH_AND_ADD" || WCRecvRDMAWithImm.String() != "RECV_RDMA_WITH_IMM" {
		t.Error("opcodes")
	}
	if EventCQErr.String() != "CQ_ERR" || DriverRXE.String() != "rxe" || GIDTypeRoCEv2.String() != "RoCE v2" {
		t.Error("names")
	}
	// Values without a name fall back to type(value).
	if got := [...]string{WROpcode(200).String(), WCStatus(22).String(), WCStatus(1).String(), AsyncEventType(77).String(), EventWQFatal.String()}; got != [...]string{"WROpcode(200)", "WCStatus(22)", "local length error", "AsyncEventType(77)", "WQ_FATAL"} {
		t.Errorf("names %q", got)
	}
	wc := WC{ID: 3, Status: WCRemAccessErr, QPN: 0x11}
	var we *WCError
	if err := wc.Err(); !errors.As(err, &we) || we.Status != WCRemAccessErr || err.Error() == "" {
		t.Errorf("WC.Err: %v", err)
	}
}

// TestFindProvider: providers are chosen by driver from the list given,
// and an empty list says where to find one.
func TestFindProvider(t *testing.T) {
	p := fakeProvider{}
	if got, err := findProvider([]Provider{UnimplementedProvider{}, p}, 77); err != nil || got != p {
		t.Fatalf("provider in the list: %v, %v", got, err)
	}
	_, err := findProvider(nil, DriverID(77))
	if !errors.Is(err, ErrNoProvider) || !strings.Contains(err.Error(), "uverbs/providers") {
		t.Errorf("no providers: %v, want ErrNoProvider naming uverbs/providers", err)
	}
	_, err = findProvider([]Provider{UnimplementedProvider{}}, 77)
	if !errors.Is(err, ErrNoProvider) || !strings.Contains(err.Error(), "unimplemented") {
		t.Errorf("no provider for the driver: %v, want ErrNoProvider naming the providers given", err)
	}
	d := Device{Name: "rxe9", DriverID: DriverRXE, Path: "/nonexistent"}
	if _, err := d.Open(nil); !errors.Is(err, ErrNoProvider) {
		t.Errorf("Open without options: %v, want ErrNoProvider", err)
	}
}

type fakeProvider struct{ UnimplementedProvider }

func (fakeProvider) DriverID() DriverID { return 77 }

func FuzzParseSysfsGID(f *testing.F) {
	f.Add("0000:0000:0000:0000:0000:ffff:0a00:0101")
	f.Add("fe80:0000:0000:0000:7cfe:90ff:fe00:0001")
	f.Fuzz(func(t *testing.T, s string) {
		g, err := parseSysfsGID(s)
		if err != nil {
			return
		}
		// Re-print in the kernel's %pI6 form: it must parse back to the same GID.
		var b []byte
		for i := 0; i < 16; i += 2 {
			if i > 0 {
				b = append(b, ':')
			}
			b = append(b, []byte(fmt.Sprintf("%02x%02x", g[i], g[i+1]))...)
		}
		if g2, err := parseSysfsGID(string(b)); err != nil || g2 != g {
			t.Fatalf("%q -> %v -> %q -> %v %v", s, g, b, g2, err)
		}
	})
}
