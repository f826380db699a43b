//go:build amd64 || arm64

package rdma

import (
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/internal/mlx5sim"
	"github.com/rdmago/te/mlx5"
)

// TestSimConformance runs the engine's transport conformance suite over
// the RDMA transport on simulated ConnectX devices, two rails per host
// (the multi-rail cases take host A's ports down and up), on any host.
func TestSimConformance(t *testing.T) {
	f := mlx5sim.NewFabric()
	t.Cleanup(func() { f.Close() })
	opts := f.Options(mlx5.Provider())
	devs := func(host string) []string {
		return []string{f.AddDevice(host + "_mlx5_0").Name, f.AddDevice(host + "_mlx5_1").Name}
	}
	factory := func(devs []string) transporttest.Factory {
		return func(testing.TB) engine.Transport { return New(Config{Devices: devs, Options: opts}) }
	}
	a := devs("a")
	transporttest.Run(t, factory(a), transporttest.Options{Target: factory(devs("b")), Rails: &transporttest.Rails{
		Count: len(a),
		Bytes: func(tr engine.Transport) []uint64 {
			var out []uint64
			for _, r := range tr.(*Transport).Stats() {
				out = append(out, r.Bytes)
			}
			return out
		},
		SetLink: func(rail int, up bool) error { return f.SetPort(a[rail], up) },
	}})
}
