package main

import (
	"context"
	"fmt"
	"os"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/internal/rdmasetup"
)

func init() {
	register(command{
		name:    "rxe",
		summary: "add or remove a Soft-RoCE (rdma_rxe) device on a netdev: te rxe add eth0, te rxe del rxe0 (root)",
		run:     runRXE,
	})
}

const rxeUse = "te rxe add NETDEV [--name NAME] | te rxe del NAME"

const rxeAbout = `te rxe add NETDEV loads rdma_rxe if needed and creates a Soft-RoCE device on
NETDEV (named NAME, default the lowest free rxeN), then prints its name;
te rxe del NAME removes it.

Soft-RoCE runs RoCE v2 in the kernel over any Ethernet netdev, so te's RDMA
paths (te perf, te bench --protocol rdma) work on hosts without an RDMA NIC.
Both peers need one; they reach each other at the netdevs' IP addresses.
Needs root (CAP_SYS_MODULE to load the module, CAP_NET_ADMIN for the link).`

func runRXE(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("te rxe", rxeUse, rxeAbout, os.Stdout)
	name := fs.String("name", "", "add: the new device's name (default: the lowest free rxeN)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	pos := fs.Args()
	h := rdmasetup.Default()
	switch {
	case len(pos) == 2 && pos[0] == "add":
		dev, err := h.AddRXE(ctx, pos[1], *name)
		if err != nil {
			return err
		}
		fmt.Printf("%s on %s (te devices -d %s shows it; te rxe del %s removes it)\n", dev, pos[1], dev, dev)
		return nil
	case len(pos) == 2 && pos[0] == "del" && *name == "":
		if err := h.DelRXE(pos[1]); err != nil {
			return err
		}
		fmt.Printf("removed %s\n", pos[1])
		return nil
	case len(pos) == 2 && pos[0] == "del":
		return fs.Usagef("--name is for add; del takes the device's name: te rxe del NAME")
	}
	return fs.Usagef("want add NETDEV or del NAME, got %q", pos)
}
