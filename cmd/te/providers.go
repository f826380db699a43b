package main

import (
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/uverbs"
)

// providers are the verbs providers this binary carries: every command that
// opens an RDMA device (devices, perf) goes through verbsOptions, so a
// device of either driver opens the same way everywhere.
var providers = []uverbs.Provider{rxe.Provider(), mlx5.Provider()}

// verbsOptions open devices with providers.
var verbsOptions = &uverbs.Options{Providers: providers}
