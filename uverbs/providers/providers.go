// Package providers lists the verbs providers te carries, so a program that
// opens RDMA devices (package uverbs, or the rdma transport, which uses this
// list by default) names them once instead of registering each.
package providers

import (
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/uverbs"
)

// All returns a new list of every provider: rxe (Soft-RoCE) and mlx5
// (ConnectX), one per kernel driver.
func All() []uverbs.Provider {
	return []uverbs.Provider{rxe.Provider(), mlx5.Provider()}
}

// Options returns uverbs.Options that open devices of any driver in All.
func Options() *uverbs.Options {
	return &uverbs.Options{Providers: All()}
}
