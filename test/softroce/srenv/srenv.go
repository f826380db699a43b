// Package srenv reads the Soft-RoCE guest topology that test/softroce/run.sh
// exports to test binaries (see test/softroce/ENV.md): two simulated hosts
// with two rails each, plus a loopback device.
package srenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// ErrNotGuest reports that the process does not run inside the Soft-RoCE guest.
var ErrNotGuest = errors.New("srenv: not inside the Soft-RoCE guest (SR_GUEST unset)")

// NumRailDevs is the number of rail devices: rxe0..rxe3.
const NumRailDevs = 4

// Dev is one rxe device of the guest.
type Dev struct {
	Name     string   // ibdev name, e.g. "rxe0"
	Netdev   string   // netdev under it, e.g. "veth0"
	IP       net.IP   // IPv4 address of Netdev
	GIDIndex int      // port-1 GID table index of the RoCE v2 GID ::ffff:IP
	GID      [16]byte // that GID
}

// Topo is the guest topology.
type Topo struct {
	Devs  [NumRailDevs]Dev // Devs[2r] on host A, Devs[2r+1] on host B, rail r+1
	Lo    Dev              // rxe on lo
	HostA []Dev            // rail order
	HostB []Dev            // rail order; HostA[i] <-> HostB[i]
	MTU   int              // veth MTU
	Out   string           // directory collected by the host ("" if none)
	Tools bool             // rdma-core tools available in PATH
}

// Pair returns the two connected devices of rail r (0-based): host A's and host B's.
func (t Topo) Pair(r int) (a, b Dev) { return t.HostA[r], t.HostB[r] }

// InGuest reports whether SR_GUEST is set.
func InGuest() bool { return os.Getenv("SR_GUEST") == "1" }

// Load reads the topology from the environment. It returns ErrNotGuest
// outside the guest and a descriptive error when a variable is malformed.
func Load() (Topo, error) {
	var t Topo
	if !InGuest() {
		return t, ErrNotGuest
	}
	var err error
	for i := range t.Devs {
		if t.Devs[i], err = loadDev(strconv.Itoa(i)); err != nil {
			return t, err
		}
	}
	if t.Lo, err = loadDev("LO"); err != nil {
		return t, err
	}
	byName := map[string]Dev{}
	for _, d := range t.Devs {
		byName[d.Name] = d
	}
	for _, h := range []struct {
		env string
		dst *[]Dev
	}{{"SR_HOST_A", &t.HostA}, {"SR_HOST_B", &t.HostB}} {
		for _, n := range strings.Fields(os.Getenv(h.env)) {
			d, ok := byName[n]
			if !ok {
				return t, fmt.Errorf("srenv: %s names unknown device %q", h.env, n)
			}
			*h.dst = append(*h.dst, d)
		}
	}
	if len(t.HostA) == 0 || len(t.HostA) != len(t.HostB) {
		return t, fmt.Errorf("srenv: SR_HOST_A=%q and SR_HOST_B=%q must list the same number of devices",
			os.Getenv("SR_HOST_A"), os.Getenv("SR_HOST_B"))
	}
	if t.MTU, err = strconv.Atoi(os.Getenv("SR_MTU")); err != nil {
		return t, fmt.Errorf("srenv: SR_MTU: %w", err)
	}
	t.Out = os.Getenv("SR_OUT")
	t.Tools = os.Getenv("SR_TOOLS") == "1"
	return t, nil
}

func loadDev(suffix string) (Dev, error) {
	var d Dev
	get := func(k string) (string, error) {
		v := os.Getenv(k + suffix)
		if v == "" {
			return "", fmt.Errorf("srenv: %s%s is not set", k, suffix)
		}
		return v, nil
	}
	var err error
	if d.Name, err = get("SR_DEV"); err != nil {
		return d, err
	}
	if suffix == "LO" {
		d.Netdev = "lo"
	} else if d.Netdev, err = get("SR_NETDEV"); err != nil {
		return d, err
	}
	ip, err := get("SR_IP")
	if err != nil {
		return d, err
	}
	if d.IP = net.ParseIP(ip).To4(); d.IP == nil {
		return d, fmt.Errorf("srenv: SR_IP%s=%q is not an IPv4 address", suffix, ip)
	}
	gi, err := get("SR_GID")
	if err != nil {
		return d, err
	}
	if d.GIDIndex, err = strconv.Atoi(gi); err != nil || d.GIDIndex < 0 {
		return d, fmt.Errorf("srenv: SR_GID%s=%q is not a GID index", suffix, gi)
	}
	copy(d.GID[:], d.IP.To16()) // ::ffff:a.b.c.d, the RoCE v2 IPv4 GID
	return d, nil
}

// Require returns the topology for a device test. Outside the guest it skips
// the test loudly (CI runs device tests through test/softroce/run.sh, which
// never skips under CI=true); inside a misconfigured guest it fails the test.
func Require(t testing.TB) Topo {
	t.Helper()
	topo, err := Load()
	if errors.Is(err, ErrNotGuest) {
		t.Skip("SKIP (needs the Soft-RoCE guest): run `test/softroce/run.sh ./<this package>`")
	}
	if err != nil {
		t.Fatalf("Soft-RoCE guest environment is broken: %v", err)
	}
	return topo
}
