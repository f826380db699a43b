//go:build amd64 || arm64

package mlx5sim_test

import (
	"testing"

	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs/verbstest"
)

// TestVerbsConformance runs the provider-neutral verbs conformance suite
// (uverbs/verbstest: SEND/RECV, WRITE/READ, atomics, inline and SGLs,
// unsignaled wrap, error statuses, protection, a vanished peer, queue
// limits, completion events, zero allocations, RESET reuse) with the mlx5
// provider on two simulated devices: the simulator answers as the suite
// says a device must, and mlx5's rings pass it on any host (its hardware
// tier runs the same suite on ConnectX).
func TestVerbsConformance(t *testing.T) {
	f := newFabric(t)
	a, b := f.AddDevice("mlx5_0"), f.AddDevice("mlx5_1")
	verbstest.Run(t, verbstest.Target{
		A: verbstest.Device{Name: a.Name, GIDIndex: mlx5sim.GIDIndex}, B: verbstest.Device{Name: b.Name, GIDIndex: mlx5sim.GIDIndex},
		Options: f.Options(mlx5.Provider()),
	})
}
