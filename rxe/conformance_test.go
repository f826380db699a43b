package rxe_test

import (
	"testing"

	"github.com/rdmago/te/uverbs/verbstest"
)

// TestConformance runs the provider-neutral verbs suite on rxe in the
// Soft-RoCE guest: between the two simulated hosts over a veth rail, and on
// the loopback device, with messages up to rxe's 8 MiB limit. The same
// suite runs on ConnectX in the mlx5 hardware tier, so both providers are
// held to one behaviour; this package's own tests add what is particular
// to rxe or to this harness.
func TestConformance(t *testing.T) {
	for _, tp := range topologies(t) {
		t.Run(tp.name, func(t *testing.T) {
			verbstest.Run(t, target(tp.a, tp.b))
		})
	}
}
