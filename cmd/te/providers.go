package main

import "github.com/rdmago/te/uverbs/providers"

// verbsOptions open devices with every provider te carries (rxe, mlx5):
// every command that opens an RDMA device (devices, perf, the rdma
// transport) goes through it, so a device of either driver opens the same
// way everywhere.
var verbsOptions = providers.Options()
