// Package rdmasetup is the way from a host without an RDMA device to one
// with a device: Diagnose says why no device is usable and what to run,
// AddRXE and DelRXE create and remove Soft-RoCE (rdma_rxe) links over RDMA
// netlink, loading the module first. `te devices` and `te rxe` are its
// front ends.
package rdmasetup

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmago/te/internal/kmod"
)

// Host is where Diagnose looks; Default is the running host, tests point
// the paths at fixtures.
type Host struct {
	Sys     string // sysfs root, "/sys"
	Dev     string // "/dev"
	Modules *kmod.Loader
	// Netdevs lists the network interfaces; nil means the running host's.
	Netdevs func() ([]Netdev, error)
}

// Default is the running host.
func Default() Host {
	return Host{Sys: "/sys", Dev: "/dev", Modules: kmod.Default()}
}

// Netdev is a network interface an rxe link could sit on.
type Netdev struct {
	Name     string
	Up       bool
	Loopback bool
	Addrs    []netip.Addr
	RDMA     string // the RDMA device already on it, if any
}

func (n Netdev) String() string {
	s := n.Name
	if !n.Up {
		s += " (down)"
	}
	for _, a := range n.Addrs {
		if !a.IsLinkLocalUnicast() {
			s += " " + a.String()
		}
	}
	if n.RDMA != "" {
		s += " [" + n.RDMA + "]"
	}
	return s
}

// Finding is one reason no RDMA device is usable, and what to run.
type Finding struct {
	Problem string
	Fix     string // a command or an action; empty when there is none
}

// Devices lists the RDMA devices the kernel has (/sys/class/infiniband)
// and those of them with a uverbs character device.
func (h Host) Devices() (all, verbs []string) {
	all = listDir(filepath.Join(h.Sys, "class/infiniband"))
	for _, u := range listDir(filepath.Join(h.Sys, "class/infiniband_verbs")) {
		if ib, err := readStr(filepath.Join(h.Sys, "class/infiniband_verbs", u, "ibdev")); err == nil {
			verbs = append(verbs, ib)
		}
	}
	sort.Strings(verbs)
	return all, verbs
}

// ListNetdevs returns the network interfaces with their addresses and the
// RDMA device on each, loopback last.
func (h Host) ListNetdevs() ([]Netdev, error) {
	var nds []Netdev
	var err error
	if h.Netdevs != nil {
		nds, err = h.Netdevs()
	} else {
		nds, err = hostNetdevs()
	}
	if err != nil {
		return nil, err
	}
	parents := map[string]string{}
	all, _ := h.Devices()
	for _, ib := range all {
		if p, err := readStr(filepath.Join(h.Sys, "class/infiniband", ib, "parent")); err == nil {
			parents[p] = ib
		}
	}
	for i := range nds {
		if nds[i].RDMA == "" {
			nds[i].RDMA = parents[nds[i].Name]
		}
	}
	sort.SliceStable(nds, func(i, j int) bool { return !nds[i].Loopback && nds[j].Loopback })
	return nds, nil
}

func hostNetdevs() ([]Netdev, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []Netdev
	for _, fi := range ifs {
		n := Netdev{Name: fi.Name, Up: fi.Flags&net.FlagUp != 0, Loopback: fi.Flags&net.FlagLoopback != 0}
		if as, err := fi.Addrs(); err == nil {
			for _, a := range as {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil {
					n.Addrs = append(n.Addrs, pfx.Addr())
				}
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// Candidate picks the netdev to suggest for `te rxe add`: the first one
// that is up, not loopback, has an IPv4 address and no RDMA device yet.
func Candidate(nds []Netdev) (Netdev, bool) {
	for _, n := range nds {
		if n.Up && !n.Loopback && n.RDMA == "" && slices4(n.Addrs) {
			return n, true
		}
	}
	return Netdev{}, false
}

func slices4(as []netip.Addr) bool {
	for _, a := range as {
		if a.Is4() || a.Is4In6() {
			return true
		}
	}
	return false
}

// Diagnose says why no RDMA device is usable here (an empty result: the
// host has at least one device te can open) and what to run about it.
func (h Host) Diagnose() []Finding {
	all, verbs := h.Devices()
	var out []Finding
	switch {
	case len(verbs) > 0:
		out = append(out, h.access(verbs)...)
	case len(all) > 0:
		out = append(out, Finding{
			Problem: fmt.Sprintf("RDMA devices %s exist, but none has a uverbs character device (module ib_uverbs is not loaded)", strings.Join(all, ", ")),
			Fix:     "sudo modprobe ib_uverbs"})
	default:
		out = append(out, h.noDevice()...)
	}
	return out
}

// access checks that the uverbs character devices can be opened.
func (h Host) access(verbs []string) []Finding {
	dir := filepath.Join(h.Dev, "infiniband")
	if _, err := os.Stat(dir); err != nil {
		return []Finding{{Problem: fmt.Sprintf("RDMA devices %s exist, but %s is missing", strings.Join(verbs, ", "), dir),
			Fix: "mount devtmpfs on /dev (containers: pass the host's /dev/infiniband, e.g. docker --device /dev/infiniband)"}}
	}
	var denied []string
	for _, u := range listDir(filepath.Join(h.Sys, "class/infiniband_verbs")) {
		p := filepath.Join(dir, u)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			f.Close()
			return nil // one usable device is enough
		}
		if errors.Is(err, os.ErrPermission) {
			denied = append(denied, p)
		}
	}
	if len(denied) > 0 {
		return []Finding{{Problem: "no permission to open " + strings.Join(denied, ", "),
			Fix: "run as root, or give your user access (rdma-core's udev rules make them 0666; or: sudo chmod 0666 /dev/infiniband/uverbs*)"}}
	}
	return []Finding{{Problem: "RDMA devices " + strings.Join(verbs, ", ") + " are listed in sysfs, but no uverbs character device under " + dir + " opens"}}
}

// noDevice explains a kernel with no RDMA device at all.
func (h Host) noDevice() []Finding {
	why := filepath.Join(h.Sys, "class/infiniband") + " is empty"
	if _, err := os.Stat(filepath.Join(h.Dev, "infiniband")); err != nil {
		why += " and " + filepath.Join(h.Dev, "infiniband") + " is missing"
	}
	var hw []string
	for _, m := range []string{"mlx5_ib", "irdma", "bnxt_re", "efa"} {
		if h.Modules != nil && h.Modules.Loaded(m) {
			hw = append(hw, m)
		}
	}
	if len(hw) > 0 {
		why += " (hardware drivers " + strings.Join(hw, ", ") + " are loaded: check the NIC's firmware, link and RoCE mode)"
	}
	out := []Finding{{Problem: why}}
	fix := h.rxeFix()
	switch {
	case h.Modules == nil:
	case h.Modules.Loaded("rdma_rxe"):
		out = append(out, Finding{Problem: "rdma_rxe (Soft-RoCE) is loaded, but no netdev has an RDMA link", Fix: fix})
	default:
		ok, err := h.Modules.Available("rdma_rxe")
		switch {
		case errors.Is(err, fs.ErrNotExist):
			out = append(out, Finding{Problem: "rdma_rxe (Soft-RoCE) is not loaded, and " + h.Modules.Modules + " is missing, so whether kernel " + h.Modules.Release + " has it is unknown",
				Fix: fix + " (needs a kernel with CONFIG_RDMA_RXE)"})
		case err != nil:
			out = append(out, Finding{Problem: "rdma_rxe (Soft-RoCE) is not loaded, and whether kernel " + h.Modules.Release + " has it is unknown: " + err.Error(),
				Fix: fix + " (needs a kernel with CONFIG_RDMA_RXE)"})
		case ok:
			out = append(out, Finding{Problem: "rdma_rxe (Soft-RoCE) is not loaded", Fix: fix})
		default:
			out = append(out, Finding{Problem: "kernel " + h.Modules.Release + " has no rdma_rxe module (cloud kernels often leave it out)",
				Fix: "install a kernel with CONFIG_RDMA_RXE=m (Debian: linux-image-amd64, not -cloud-amd64; Ubuntu: linux-modules-extra-$(uname -r)), then " + fix})
		}
	}
	return out
}

// rxeFix is the `te rxe add` command for this host's likeliest netdev.
func (h Host) rxeFix() string {
	nds, err := h.ListNetdevs()
	if err != nil {
		return "sudo te rxe add NETDEV"
	}
	if n, ok := Candidate(nds); ok {
		return "sudo te rxe add " + n.Name + " (Soft-RoCE on " + n.String() + ")"
	}
	var names []string
	for _, n := range nds {
		if !n.Loopback {
			names = append(names, n.String())
		}
	}
	if len(names) == 0 {
		return "sudo te rxe add lo (no other netdev; loopback rxe reaches only this host)"
	}
	return "sudo te rxe add NETDEV (netdevs: " + strings.Join(names, "; ") + "; bring one up with an IPv4 address)"
}

// Summary is findings as one line: the problems, then what to run.
func Summary(fs []Finding) string {
	var why, fix []string
	for _, f := range fs {
		why = append(why, f.Problem)
		if f.Fix != "" {
			fix = append(fix, f.Fix)
		}
	}
	s := strings.Join(why, "; ")
	if len(fix) > 0 {
		s += "; fix: " + strings.Join(fix, ", then ")
	}
	return s
}

// Explain formats findings for a terminal, one "why"/"fix" pair a line.
func Explain(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("  why: " + f.Problem + "\n")
		if f.Fix != "" {
			b.WriteString("  fix: " + f.Fix + "\n")
		}
	}
	return b.String()
}

func listDir(dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func readStr(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// nextName is the lowest rxeN not taken by an RDMA device.
func (h Host) nextName() string {
	all, _ := h.Devices()
	taken := map[string]bool{}
	for _, d := range all {
		taken[d] = true
	}
	for i := 0; ; i++ {
		if n := "rxe" + strconv.Itoa(i); !taken[n] {
			return n
		}
	}
}
