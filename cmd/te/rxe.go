package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/rdmago/te/internal/rdmasetup"
)

func init() {
	register(command{
		name:    "rxe",
		summary: "add or remove a Soft-RoCE (rdma_rxe) device on a netdev: te rxe add eth0, te rxe del rxe0 (root)",
		run:     runRXE,
	})
}

func rxeUsage(fs *flag.FlagSet) func() {
	return func() {
		fmt.Fprintf(fs.Output(), "usage:\n"+
			"  te rxe add NETDEV [--name NAME]   load rdma_rxe if needed and create a Soft-RoCE device on NETDEV\n"+
			"                                    (named NAME, default the lowest free rxeN); prints its name\n"+
			"  te rxe del NAME                   remove that Soft-RoCE device\n\n"+
			"Soft-RoCE runs RoCE v2 in the kernel over any Ethernet netdev, so te's RDMA\n"+
			"paths (te perf, te bench --protocol rdma) work on hosts without an RDMA NIC.\n"+
			"Both peers need one; they reach each other at the netdevs' IP addresses.\n"+
			"Needs root (CAP_SYS_MODULE to load the module, CAP_NET_ADMIN for the link).\n\nflags:\n")
		fs.PrintDefaults()
	}
}

func runRXE(ctx context.Context, args []string) error {
	fs := newFlags("rxe")
	name := fs.String("name", "", "add: the new device's name (default: the lowest free rxeN)")
	fs.Usage = rxeUsage(fs)
	// flags may come before or after the positional arguments
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsage
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
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
	}
	fmt.Fprintf(fs.Output(), "te rxe: want \"add NETDEV\" or \"del NAME\", got %q\n", pos)
	fs.Usage()
	return errUsage
}
