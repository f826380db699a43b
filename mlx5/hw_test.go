//go:build amd64 || arm64

package mlx5_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/leakcheck"
	"github.com/rdmago/te/uverbs/verbstest"
)

// The hardware tier: the provider-neutral verbs conformance suite on a real
// ConnectX device, loopback between two QPs of one port (RoCE: by GID;
// InfiniBand: by LID).
//
// It skips when the host has no mlx5 device, also under CI=true: CI has no
// ConnectX, and this is a hardware tier, not an environment tier that CI
// provisions. TE_MLX5_DEVICE=mlx5_N picks a device; TE_MLX5_GID=i a GID
// index (default: the port's first IPv4-mapped RoCE v2 GID).
func TestHardwareConformance(t *testing.T) {
	dev, gid := findMLX5(t)
	t.Logf("running the verbs conformance suite on %s port 1, GID index %d", dev.Name, gid)
	d := verbstest.Device{Name: dev.Name, Port: 1, GIDIndex: gid}
	for _, p := range []struct {
		name string
		p    uverbs.Provider
	}{{"static-uar", mlx5.Provider()}, {"dynamic-uar", mlx5.NewProvider(mlx5.Options{DynamicUAR: true})}} {
		t.Run(p.name, func(t *testing.T) {
			verbstest.Run(t, verbstest.Target{A: d, B: d, Options: &uverbs.Options{Providers: []uverbs.Provider{p.p}}})
		})
	}
}

func findMLX5(t *testing.T) (uverbs.Device, int) {
	t.Helper()
	devs, err := uverbs.Devices()
	if err != nil {
		t.Fatalf("listing RDMA devices: %v", err)
	}
	want := os.Getenv("TE_MLX5_DEVICE")
	for _, d := range devs {
		if d.DriverID != uverbs.DriverMLX5 || (want != "" && d.Name != want) {
			continue
		}
		if st, err := d.PortState(1); err != nil || st != uverbs.PortActive {
			t.Logf("%s port 1 is %v (%v): not usable", d.Name, st, err)
			continue
		}
		if ll, _ := os.ReadFile("/sys/class/infiniband/" + d.Name + "/ports/1/link_layer"); strings.TrimSpace(string(ll)) == "InfiniBand" {
			return d, 0 // addressed by LID; the suite needs no GID
		}
		ents, err := d.GIDs(1)
		if err != nil {
			t.Fatalf("%s: GIDs: %v", d.Name, err)
		}
		for _, e := range ents {
			if os.Getenv("TE_MLX5_GID") != "" {
				if os.Getenv("TE_MLX5_GID") == strconv.Itoa(e.Index) {
					return d, e.Index
				}
				continue
			}
			if e.Type == uverbs.GIDTypeRoCEv2 && e.GID.Addr().Is4() {
				return d, e.Index
			}
		}
		t.Logf("%s port 1 has no IPv4 RoCE v2 GID", d.Name)
	}
	t.Skip("SKIP hardware tier: no usable mlx5 (ConnectX) device with an active port on this host. " +
		"This tier needs real hardware and skips even under CI=true; the mlx5 data path is covered " +
		"in CI by the byte-exact mlx5dv oracle and the simulated-HCA tests.")
	return uverbs.Device{}, 0
}

// TestMain fails the binary if any verbs object is still open at exit.
func TestMain(m *testing.M) { leakcheck.Main(m) }
