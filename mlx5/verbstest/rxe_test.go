package verbstest_test

import (
	"testing"

	"github.com/rdmago/te/mlx5/verbstest"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/leakcheck"
)

// TestSuiteOnSoftRoCE runs the conformance suite against the rxe provider
// in the Soft-RoCE guest (test/softroce/run.sh ./mlx5/verbstest): across a
// veth rail and on the loopback device. It proves the suite on a real
// kernel, where CI has no ConnectX for the mlx5 hardware tier.
func TestSuiteOnSoftRoCE(t *testing.T) {
	topo := srenv.Require(t)
	opts := &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}
	a, b := topo.Pair(0)
	for _, tg := range []struct {
		name string
		a, b srenv.Dev
	}{{"rail-" + a.Name + "-" + b.Name, a, b}, {"loopback-" + topo.Lo.Name, topo.Lo, topo.Lo}} {
		t.Run(tg.name, func(t *testing.T) {
			verbstest.Run(t, verbstest.Target{
				A:       verbstest.Device{Name: tg.a.Name, Port: 1, GIDIndex: tg.a.GIDIndex},
				B:       verbstest.Device{Name: tg.b.Name, Port: 1, GIDIndex: tg.b.GIDIndex},
				Options: opts,
			})
		})
	}
}

// TestMain fails the binary if any verbs object is still open at exit.
func TestMain(m *testing.M) { leakcheck.Main(m) }
