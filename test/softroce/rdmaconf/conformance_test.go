// Package rdmaconf runs the engine's transport conformance suite
// (engine/transporttest) over the RDMA transport between two processes in
// the Soft-RoCE guest: the test process is host A (rxe0, rxe2), a child
// process started by the suite is host B (rxe1, rxe3), and a second run
// puts both processes on the loopback device (rxelo). It has its own test
// binary, so its own -test.timeout in the guest: it took 123 s (6.1) and
// 92 s (6.12) of the default 300 s under TCG. rdma's TestConformance runs
// the suite with both hosts in one process.
//
//	test/softroce/run.sh ./test/softroce/rdmaconf
package rdmaconf_test

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/rdma"
	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs"
)

var opts = &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider(), mlx5.Provider()}}

func factory(devs []string) transporttest.Factory {
	return func(testing.TB) engine.Transport {
		return rdma.New(rdma.Config{Devices: devs, Options: opts})
	}
}

func names(ds []srenv.Dev) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Name
	}
	return out
}

// deadPeerBound is the transport's stated bound for a dead target on rxe:
// a slice in flight fails after the QP's retries (uverbs.RetryBound of
// rxe's defaults, ~7.5 s), its one engine retry may wait as long again on
// the other rail's QP or a handshake (5 s) before it fails; 10 s more for
// a guest under TCG that other tests load.
func deadPeerBound(t *testing.T) time.Duration {
	d, ok := rxe.Provider().(uverbs.RCDefaulter)
	if !ok {
		t.Fatal("rxe has no RC defaults")
	}
	rc := d.RCDefaults()
	return 2*uverbs.RetryBound(rc.Timeout, rc.RetryCnt) + 5*time.Second + 10*time.Second
}

// rails are the multi-rail hooks: per-rail completed bytes from the
// transport's Stats, and a rail taken down at host A's end of its veth
// pair (both hosts share the guest's network namespace).
func rails(topo srenv.Topo) *transporttest.Rails {
	return &transporttest.Rails{
		Count: len(topo.HostA),
		Bytes: func(tr engine.Transport) []uint64 {
			st := tr.(*rdma.Transport).Stats()
			out := make([]uint64, len(st))
			for i, r := range st {
				out[i] = r.Bytes
			}
			return out
		},
		SetLink: func(rail int, up bool) error {
			state := "down"
			if up {
				state = "up"
			}
			dev := topo.HostA[rail].Netdev
			if out, err := exec.Command("ip", "link", "set", dev, state).CombinedOutput(); err != nil {
				return fmt.Errorf("ip link set %s %s: %v: %s", dev, state, err, out)
			}
			return nil
		},
	}
}

// TestConformanceRemote: initiator on host A's rails in this process,
// target on host B's rails in a child process, with the multi-rail cases;
// then both on rxelo.
func TestConformanceRemote(t *testing.T) {
	topo := srenv.Require(t)
	bound := deadPeerBound(t)
	t.Run("rails", func(t *testing.T) {
		transporttest.RunRemote(t, factory(names(topo.HostA)), transporttest.Options{
			Target:   factory(names(topo.HostB)),
			DeadPeer: bound,
			Rails:    rails(topo),
		})
	})
	t.Run("loopback", func(t *testing.T) {
		lo := factory([]string{topo.Lo.Name})
		transporttest.RunRemote(t, lo, transporttest.Options{DeadPeer: bound})
	})
}
