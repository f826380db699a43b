package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/rdmasetup"
	"github.com/rdmago/te/uverbs"
)

func init() {
	register(command{
		name:    "devices",
		summary: "list RDMA devices (like ibv_devinfo); -v adds capabilities, ports and GID tables",
		run:     runDevices,
	})
}

var errNoDevices = errors.New("no RDMA devices found")

const devicesUse = "te devices [-v] [-d NAME]"

func runDevices(_ context.Context, args []string) error {
	fs := cli.NewFlagSet("te devices", devicesUse,
		"Lists the RDMA devices that have a uverbs char device, from sysfs and the\n"+
			"device's own answers to QUERY_DEVICE / QUERY_PORT / QUERY_GID_TABLE. With\n"+
			"none, says why and what to run (te rxe add NETDEV makes a Soft-RoCE device).", os.Stdout)
	verbose := fs.Bool("verbose", false, "also print device capabilities, every port and its GID table")
	only := fs.String("device", "", "show only the device `NAME` (e.g. rxe0, mlx5_0)")
	fs.Alias("verbose", "v") // ibv_devinfo's spellings
	fs.Alias("device", "d")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fs.Usagef("no arguments expected, got %q (a device is -d NAME)", fs.Args())
	}
	devs, err := uverbs.Devices()
	if err != nil {
		return err
	}
	if *only != "" {
		d, err := lookupDevice(*only)
		if err != nil {
			return err
		}
		devs = []uverbs.Device{d}
	}
	if len(devs) == 0 {
		return noDevices(rdmasetup.Default())
	}
	return printDevices(os.Stdout, devs, *verbose)
}

// noDevices is errNoDevices with the reasons and the command that makes a
// device, on one line.
func noDevices(h rdmasetup.Host) error {
	return fmt.Errorf("%w: %s", errNoDevices, rdmasetup.Summary(h.Diagnose()))
}

// lookupDevice is uverbs.LookupDevice with an error that names the
// devices there are, or says why there are none.
func lookupDevice(name string) (uverbs.Device, error) {
	d, err := uverbs.LookupDevice(name)
	if err == nil || !errors.Is(err, uverbs.ErrNoDevice) {
		return d, err
	}
	devs, _ := uverbs.Devices()
	if all, _ := rdmasetup.Default().Devices(); len(devs) == 0 && len(all) == 0 {
		return d, fmt.Errorf("no RDMA device %q: %w", name, noDevices(rdmasetup.Default()))
	}
	if len(devs) == 0 { // devices, but none te can open
		return d, fmt.Errorf("no RDMA device %q: %w", name, noDevices(rdmasetup.Default()))
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	return d, fmt.Errorf("no RDMA device %q (devices: %s)", name, strings.Join(names, ", "))
}

func printDevices(w io.Writer, devs []uverbs.Device, verbose bool) error {
	var errs []error
	for i, d := range devs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := printDevice(w, d, verbose); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// guid formats a 64-bit GUID as ibv_devinfo does: four groups of 16 bits.
func guid(v uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", v>>48, v>>32&0xffff, v>>16&0xffff, v&0xffff)
}

func printDevice(w io.Writer, d uverbs.Device, verbose bool) error {
	fmt.Fprintf(w, "hca_id:\t%s\n", d.Name)
	fmt.Fprintf(w, "\tdriver:\t\t\t%s (%s, abi %d)\n", d.DriverID, d.Uverbs, d.ABIVersion)
	if d.Parent != "" {
		fmt.Fprintf(w, "\tnetdev:\t\t\t%s\n", d.Parent)
	}
	c, err := d.Open(verbsOptions)
	if err != nil {
		fmt.Fprintf(w, "\tnode_guid:\t\t%s\n\tphys_port_cnt:\t\t%d\n", d.NodeGUID, d.Ports)
		fmt.Fprintf(w, "\t(cannot open: %v)\n", err)
		return fmt.Errorf("%s: %w", d.Name, err)
	}
	defer c.Close()
	a, err := c.QueryDevice()
	if err != nil {
		return err
	}
	fw := a.FWVer
	fmt.Fprintf(w, "\tfw_ver:\t\t\t%d.%d.%d\n", fw>>32, fw>>16&0xffff, fw&0xffff)
	fmt.Fprintf(w, "\tnode_guid:\t\t%s\n", guid(a.NodeGUID))
	fmt.Fprintf(w, "\tsys_image_guid:\t\t%s\n", guid(a.SysImageGUID))
	fmt.Fprintf(w, "\tvendor_id:\t\t%#x\n", a.VendorID)
	fmt.Fprintf(w, "\tvendor_part_id:\t\t%d\n", a.VendorPartID)
	fmt.Fprintf(w, "\thw_ver:\t\t\t%#x\n", a.HWVer)
	fmt.Fprintf(w, "\tphys_port_cnt:\t\t%d\n", a.PhysPortCnt)
	if !verbose {
		return nil
	}
	for _, f := range []struct {
		name string
		v    any
	}{
		{"max_mr_size", fmt.Sprintf("%#x", a.MaxMRSize)}, {"page_size_cap", fmt.Sprintf("%#x", a.PageSizeCap)},
		{"max_qp", a.MaxQP}, {"max_qp_wr", a.MaxQPWR}, {"device_cap_flags", fmt.Sprintf("0x%08x", a.DeviceCapFlags)},
		{"max_sge", a.MaxSGE}, {"max_sge_rd", a.MaxSGERd}, {"max_cq", a.MaxCQ}, {"max_cqe", a.MaxCQE},
		{"max_mr", a.MaxMR}, {"max_pd", a.MaxPD}, {"max_qp_rd_atom", a.MaxQPRdAtom},
		{"max_qp_init_rd_atom", a.MaxQPInitRdAtom}, {"atomic_cap", atomicCap(a.AtomicCap)},
		{"max_srq", a.MaxSRQ}, {"max_srq_wr", a.MaxSRQWR}, {"max_srq_sge", a.MaxSRQSGE},
		{"max_pkeys", a.MaxPKeys}, {"local_ca_ack_delay", a.LocalCAAckDelay}, {"num_comp_vectors", c.NumCompVectors()},
	} {
		fmt.Fprintf(w, "\t%-24s%v\n", f.name+":", f.v)
	}
	gids, gerr := c.QueryGIDTable()
	if gerr != nil { // kernels without the ioctl: sysfs has the same table
		gids = nil
		for p := 1; p <= int(a.PhysPortCnt); p++ {
			g, err := d.GIDs(p)
			if err != nil {
				return err
			}
			gids = append(gids, g...)
		}
	}
	sort.Slice(gids, func(i, j int) bool {
		if gids[i].Port != gids[j].Port {
			return gids[i].Port < gids[j].Port
		}
		return gids[i].Index < gids[j].Index
	})
	for p := 1; p <= int(a.PhysPortCnt); p++ {
		pa, err := c.QueryPort(uint8(p))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "\t\tport:\t%d\n", p)
		for _, f := range []struct {
			name string
			v    any
		}{
			{"state", fmt.Sprintf("PORT_%s (%d)", pa.State, pa.State)},
			{"max_mtu", fmt.Sprintf("%d (%d)", pa.MaxMTU.Bytes(), pa.MaxMTU)},
			{"active_mtu", fmt.Sprintf("%d (%d)", pa.ActiveMTU.Bytes(), pa.ActiveMTU)},
			{"sm_lid", pa.SMLID}, {"port_lid", pa.LID}, {"link_layer", linkLayer(pa.LinkLayer)},
			{"max_msg_sz", fmt.Sprintf("%#x", pa.MaxMsgSize)},
			{"port_cap_flags", fmt.Sprintf("0x%08x", pa.PortCapFlags)},
			{"pkey_tbl_len", pa.PKeyTblLen}, {"gid_tbl_len", pa.GIDTblLen},
			{"active_width", activeWidth(pa.ActiveWidth)}, {"active_speed", activeSpeed(pa.ActiveSpeed)},
			{"phys_state", physState(pa.PhysState)},
		} {
			fmt.Fprintf(w, "\t\t\t%-16s%v\n", f.name+":", f.v)
		}
		for _, g := range gids {
			if g.Port != p {
				continue
			}
			nd := g.Netdev
			if nd == "" && g.Ifindex != 0 {
				if ifi, err := net.InterfaceByIndex(g.Ifindex); err == nil {
					nd = ifi.Name
				}
			}
			fmt.Fprintf(w, "\t\t\tGID[%3d]:\t%s, %s", g.Index, g.GID, g.Type)
			if nd != "" {
				fmt.Fprintf(w, " (%s)", nd)
			}
			fmt.Fprintln(w)
		}
	}
	return nil
}

func atomicCap(v uint32) string {
	switch v {
	case 0:
		return "ATOMIC_NONE (0)"
	case 1:
		return "ATOMIC_HCA (1)"
	case 2:
		return "ATOMIC_GLOB (2)"
	}
	return fmt.Sprintf("%d", v)
}

func linkLayer(l uverbs.LinkLayer) string {
	switch l {
	case uverbs.LinkLayerInfiniBand, uverbs.LinkLayerUnspecified: // unspecified means IB
		return "InfiniBand"
	case uverbs.LinkLayerEthernet:
		return "Ethernet"
	}
	return fmt.Sprintf("LinkLayer(%d)", l)
}

func activeWidth(v uint8) string {
	names := map[uint8]string{1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
	if n, ok := names[v]; ok {
		return fmt.Sprintf("%s (%d)", n, v)
	}
	return fmt.Sprintf("invalid width (%d)", v)
}

func activeSpeed(v uint8) string {
	names := map[uint8]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
		32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}
	if n, ok := names[v]; ok {
		return fmt.Sprintf("%s (%d)", n, v)
	}
	return fmt.Sprintf("invalid speed (%d)", v)
}

func physState(v uint8) string {
	names := map[uint8]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION_TRAINING",
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY_TEST"}
	if n, ok := names[v]; ok {
		return fmt.Sprintf("%s (%d)", n, v)
	}
	return fmt.Sprintf("invalid physical state (%d)", v)
}
