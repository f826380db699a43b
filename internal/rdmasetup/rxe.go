package rdmasetup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rdmago/te/internal/rdmanl"
	"net/netip"
)

// Errors of AddRXE and DelRXE, comparable with errors.Is.
var (
	ErrNoNetdev = errors.New("no such netdev")
	ErrExists   = errors.New("already exists")
	ErrNoDevice = errors.New("no such RDMA device")
	ErrNotRXE   = errors.New("not a Soft-RoCE (rxe) device")
)

// newLink and delLink are RDMA netlink's; tests replace them.
var (
	newLink = rdmanl.NewLink
	delLink = rdmanl.DelLink
)

// AddRXE loads rdma_rxe when needed and creates a Soft-RoCE device on
// netdev (named name, or the lowest free rxeN when name is empty), then
// waits until its uverbs device and, when netdev has an IPv4 address, its
// IPv4 GID are there. It returns the device's name. Needs root.
func (h Host) AddRXE(ctx context.Context, netdev, name string) (string, error) {
	nds, err := h.ListNetdevs()
	if err != nil {
		return "", err
	}
	var nd *Netdev
	var names []string
	for i := range nds {
		names = append(names, nds[i].Name)
		if nds[i].Name == netdev {
			nd = &nds[i]
		}
	}
	if nd == nil {
		return "", fmt.Errorf("%w %q (netdevs: %s)", ErrNoNetdev, netdev, strings.Join(names, ", "))
	}
	if nd.RDMA != "" {
		return "", fmt.Errorf("netdev %s: RDMA device %s %w on it (te rxe del %s removes it)", netdev, nd.RDMA, ErrExists, nd.RDMA)
	}
	if name == "" {
		name = h.nextName()
	}
	if err := checkName(name); err != nil {
		return "", err
	}
	if all, _ := h.Devices(); slices.Contains(all, name) {
		return "", fmt.Errorf("RDMA device %s %w (choose another name)", name, ErrExists)
	}
	if h.Modules != nil {
		if err := h.Modules.Load("rdma_rxe"); err != nil {
			return "", fmt.Errorf("load rdma_rxe: %w", err)
		}
		// rxe asks the crypto API for "crc32" when a link is added; some
		// kernels (Debian 12's 6.1) have it only as this module, which
		// request_module cannot load where modprobe is missing.
		if ok, _ := h.Modules.Available("crc32_generic"); ok {
			_ = h.Modules.Load("crc32_generic") // best effort: the link add says if it mattered
		}
	}
	if err := newLink(name, netdev, "rxe"); err != nil {
		switch {
		case errors.Is(err, fs.ErrPermission):
			return "", fmt.Errorf("%w (creating an RDMA link needs root: CAP_NET_ADMIN)", err)
		case errors.Is(err, fs.ErrNotExist):
			return "", fmt.Errorf("%w (rdma_rxe could not set up %s; on some kernels it needs crc32_generic: sudo modprobe crc32_generic; dmesg says more)", err, netdev)
		case errors.Is(err, errors.ErrUnsupported):
			return "", fmt.Errorf("%w (the kernel has no rxe link type: rdma_rxe is not loaded)", err)
		}
		return "", err
	}
	return name, h.waitReady(ctx, name, nd.Addrs)
}

// waitReady waits for the uverbs device of name and for an IPv4 GID when
// the netdev has an IPv4 address: the kernel fills the GID table after
// the link add returns.
func (h Host) waitReady(ctx context.Context, name string, addrs []netip.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	want4 := slices4(addrs)
	for {
		_, verbs := h.Devices()
		if slices.Contains(verbs, name) && (!want4 || h.hasIPv4GID(name)) {
			return nil
		}
		select {
		case <-ctx.Done():
			what := "its uverbs device"
			if slices.Contains(verbs, name) {
				what = "an IPv4 GID"
			}
			return fmt.Errorf("%s was created, but %s did not appear: %w", name, what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (h Host) hasIPv4GID(name string) bool {
	dir := filepath.Join(h.Sys, "class/infiniband", name, "ports/1/gids")
	for _, g := range listDir(dir) {
		if v, err := readStr(filepath.Join(dir, g)); err == nil && strings.HasPrefix(v, "0000:0000:0000:0000:0000:ffff:") {
			return true
		}
	}
	return false
}

// DelRXE removes the Soft-RoCE device name. The kernel waits until every
// process has closed the device. Needs root.
func (h Host) DelRXE(name string) error {
	all, _ := h.Devices()
	if !slices.Contains(all, name) {
		if len(all) == 0 {
			return fmt.Errorf("%w %q (there are no RDMA devices)", ErrNoDevice, name)
		}
		return fmt.Errorf("%w %q (devices: %s)", ErrNoDevice, name, strings.Join(all, ", "))
	}
	if _, err := os.Stat(filepath.Join(h.Sys, "class/infiniband", name, "parent")); err != nil {
		return fmt.Errorf("%s: %w (only links made by te rxe add or rdma link add can be removed)", name, ErrNotRXE)
	}
	if err := delLink(name); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("%w (removing an RDMA link needs root: CAP_NET_ADMIN)", err)
		}
		return err
	}
	return nil
}

// checkName refuses names the kernel would refuse or misread: it takes a
// '%' as a template ("rxe%d") and names up to IB_DEVICE_NAME_MAX-1 bytes.
func checkName(name string) error {
	if len(name) == 0 || len(name) > 63 || strings.ContainsAny(name, "/% \t\n") || name == "." || name == ".." {
		return fmt.Errorf("device name %q: want 1 to 63 characters without '/', '%%' or spaces", name)
	}
	return nil
}
