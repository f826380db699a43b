package uverbs

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmago/te/internal/rdmanl"
)

// sysfs is the root of the sysfs tree; tests point it at fixtures.
var sysfs = "/sys"

// devDir is where uverbs character devices live.
var devDir = "/dev/infiniband"

// Device describes an RDMA device found in sysfs.
type Device struct {
	Name       string   // ib device name, e.g. "rxe0", "mlx5_0"
	Uverbs     string   // its uverbs char device name, e.g. "uverbs0"
	Path       string   // /dev/infiniband/uverbsN
	DriverID   DriverID // from the driver binding (rxe: parent netdev; mlx5: PCI driver)
	ABIVersion int      // driver uverbs ABI version (rxe 2, mlx5 1)
	// DriverIDFrom says where DriverID came from: "netlink" (RDMA netlink
	// GET_CHARDEV, authoritative) or "sysfs" (the fallback rule).
	DriverIDFrom string
	Parent       string // rxe: the netdev it is bound to
	NodeGUID     string
	Ports        int
	// NUMANode is the NUMA node of the device's PCI function; -1 when the
	// kernel does not say (software devices such as rxe, one-node hosts).
	NUMANode int
}

// Devices lists the RDMA devices that have a uverbs char device, sorted by name.
func Devices() ([]Device, error) {
	ms, err := filepath.Glob(filepath.Join(sysfs, "class/infiniband_verbs/uverbs*"))
	if err != nil {
		return nil, err
	}
	idx, nlErr := rdmanl.Indexes() // one netlink dump for all devices
	var out []Device
	for _, m := range ms {
		d, err := deviceFromUverbs(m, idx, nlErr == nil)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// LookupDevice finds the device with the given ib name.
func LookupDevice(name string) (Device, error) {
	ms, err := filepath.Glob(filepath.Join(sysfs, "class/infiniband_verbs/uverbs*"))
	if err != nil {
		return Device{}, err
	}
	for _, m := range ms {
		if ib, err := readStr(filepath.Join(m, "ibdev")); err == nil && ib == name {
			idx, nlErr := rdmanl.Indexes()
			return deviceFromUverbs(m, idx, nlErr == nil)
		}
	}
	return Device{}, fmt.Errorf("%w: %q", ErrNoDevice, name)
}

func readStr(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func deviceFromUverbs(m string, nlIndex map[string]uint32, useNL bool) (Device, error) {
	ib, err := readStr(filepath.Join(m, "ibdev"))
	if err != nil {
		return Device{}, fmt.Errorf("uverbs: read %s/ibdev: %w", m, err)
	}
	d := Device{Name: ib, Uverbs: filepath.Base(m)}
	d.Path = filepath.Join(devDir, d.Uverbs)
	if s, err := readStr(filepath.Join(m, "abi_version")); err == nil {
		d.ABIVersion, _ = strconv.Atoi(s)
	}
	ibdir := filepath.Join(sysfs, "class/infiniband", ib)
	d.NodeGUID, _ = readStr(filepath.Join(ibdir, "node_guid"))
	if ps, err := os.ReadDir(filepath.Join(ibdir, "ports")); err == nil {
		d.Ports = len(ps)
	}
	d.Parent, _ = readStr(filepath.Join(ibdir, "parent"))
	d.NUMANode = -1
	if s, err := readStr(filepath.Join(ibdir, "device/numa_node")); err == nil {
		if n, err := strconv.Atoi(s); err == nil {
			d.NUMANode = n
		}
	}
	if id, ok := netlinkDriverID(ib, nlIndex, useNL); ok {
		d.DriverID, d.DriverIDFrom = id, "netlink"
	} else {
		d.DriverID, d.DriverIDFrom = driverFromSysfs(ibdir, d.Parent), "sysfs"
	}
	return d, nil
}

// netlinkDriverID asks RDMA netlink for the driver id; tests replace it.
var netlinkDriverID = func(ibdev string, index map[string]uint32, ok bool) (DriverID, bool) {
	i, found := index[ibdev]
	if !ok || !found {
		return 0, false
	}
	c, err := rdmanl.UverbsChardevByIndex(i)
	if err != nil || c.DriverID == 0 {
		return 0, false
	}
	return DriverID(c.DriverID), true
}

// driverFromSysfs applies the sysfs rule: a device with a parent netdev
// attribute is rxe; one whose PCI function is bound to mlx5_core is mlx5.
func driverFromSysfs(ibdir, parent string) DriverID {
	if link, err := os.Readlink(filepath.Join(ibdir, "device/driver")); err == nil {
		switch filepath.Base(link) {
		case "mlx5_core":
			return DriverMLX5
		}
	}
	if parent != "" || strings.HasPrefix(filepath.Base(ibdir), "rxe") {
		return DriverRXE
	}
	return DriverUnknown
}

// GIDType is the type of a GID table entry.
type GIDType uint8

// GID types.
const (
	GIDTypeIB     GIDType = 0 // IB
	GIDTypeRoCEv1 GIDType = 1 // RoCE v1
	GIDTypeRoCEv2 GIDType = 2 // RoCE v2
)

// GIDEntry is one valid entry of a port's GID table.
type GIDEntry struct {
	Port    int
	Index   int
	GID     GID
	Type    GIDType
	Netdev  string // bound netdev name ("" if none or unknown)
	Ifindex int    // bound netdev ifindex (0 if none or unknown)
}

// GIDs reads the valid GID entries of a port from sysfs (empty slots skipped).
func (d Device) GIDs(port int) ([]GIDEntry, error) {
	dir := filepath.Join(sysfs, "class/infiniband", d.Name, "ports", strconv.Itoa(port))
	ents, err := os.ReadDir(filepath.Join(dir, "gids"))
	if err != nil {
		return nil, fmt.Errorf("uverbs: %s port %d GIDs: %w", d.Name, port, err)
	}
	var out []GIDEntry
	for _, e := range ents {
		idx, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		s, err := readStr(filepath.Join(dir, "gids", e.Name()))
		if err != nil {
			continue
		}
		g, err := parseSysfsGID(s)
		if err != nil || g == (GID{}) {
			continue
		}
		t, err := readStr(filepath.Join(dir, "gid_attrs/types", e.Name()))
		if err != nil { // EINVAL for empty slots
			continue
		}
		ge := GIDEntry{Port: port, Index: idx, GID: g, Type: GIDTypeRoCEv1}
		switch t {
		case "RoCE v2":
			ge.Type = GIDTypeRoCEv2
		case "IB/RoCE v1":
			if ll, _ := readStr(filepath.Join(dir, "link_layer")); ll == "InfiniBand" {
				ge.Type = GIDTypeIB
			}
		}
		ge.Netdev, _ = readStr(filepath.Join(dir, "gid_attrs/ndevs", e.Name()))
		if ge.Netdev != "" {
			if s, err := readStr(filepath.Join(sysfs, "class/net", ge.Netdev, "ifindex")); err == nil {
				ge.Ifindex, _ = strconv.Atoi(s)
			}
		}
		out = append(out, ge)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// parseSysfsGID parses the uncompressed "xxxx:xxxx:...:xxxx" sysfs form.
func parseSysfsGID(s string) (GID, error) {
	var g GID
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return g, fmt.Errorf("uverbs: malformed GID %q", s)
	}
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 16)
		if err != nil || len(p) != 4 {
			return g, fmt.Errorf("uverbs: malformed GID %q", s)
		}
		g[2*i] = byte(v >> 8)
		g[2*i+1] = byte(v)
	}
	return g, nil
}

// FindGID picks, by value, the entry whose GID is addr (IPv4 addresses match
// their IPv4-mapped GID) and whose type is typ. It never assumes an index.
func FindGID(entries []GIDEntry, addr netip.Addr, typ GIDType) (GIDEntry, error) {
	want := GIDFromAddr(addr)
	for _, e := range entries {
		if e.GID == want && e.Type == typ {
			return e, nil
		}
	}
	return GIDEntry{}, fmt.Errorf("%w: %s (%s)", ErrNoGID, addr, typ)
}

// PortState reads a port's state from sysfs ("4: ACTIVE" -> 4).
func (d Device) PortState(port int) (PortState, error) {
	s, err := readStr(filepath.Join(sysfs, "class/infiniband", d.Name, "ports", strconv.Itoa(port), "state"))
	if err != nil {
		return 0, fmt.Errorf("uverbs: %s port %d state: %w", d.Name, port, err)
	}
	n, _, _ := strings.Cut(s, ":")
	v, err := strconv.Atoi(n)
	if err != nil {
		return 0, fmt.Errorf("uverbs: %s port %d: malformed state %q", d.Name, port, s)
	}
	return PortState(v), nil
}

// PortState is an IB port state.
type PortState uint8

// Port states.
const (
	PortDown        PortState = 1 // DOWN
	PortInit        PortState = 2 // INIT
	PortArmed       PortState = 3 // ARMED
	PortActive      PortState = 4 // ACTIVE
	PortActiveDefer PortState = 5 // ACTIVE_DEFER
)

// DeviceForAddr finds the device and port whose GID table holds the RoCE v2
// GID of addr (e.g. the IP of a rail's netdev), by value.
func DeviceForAddr(addr netip.Addr) (Device, GIDEntry, error) {
	ds, err := Devices()
	if err != nil {
		return Device{}, GIDEntry{}, err
	}
	for _, d := range ds {
		for p := 1; p <= d.Ports; p++ {
			ents, err := d.GIDs(p)
			if err != nil {
				continue
			}
			if g, err := FindGID(ents, addr, GIDTypeRoCEv2); err == nil {
				return d, g, nil
			}
		}
	}
	return Device{}, GIDEntry{}, fmt.Errorf("%w: no device has %s", ErrNoGID, addr)
}
