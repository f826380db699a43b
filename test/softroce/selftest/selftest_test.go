// Package selftest checks the Soft-RoCE guest that test/softroce/run.sh builds:
// four rail devices and a loopback device with RoCE v2 IPv4 GIDs, routes that keep
// each rail on its own veth wire, and real RC traffic on every rail (rdma-core's
// ibv_rc_pingpong as both ends). run.sh runs it before any other test binary.
package selftest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/test/softroce/srenv"
)

func readSys(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

// sysfsGID formats a GID the way sysfs prints it: eight uncompressed 16-bit groups.
func sysfsGID(g [16]byte) string {
	parts := make([]string, 8)
	for i := range parts {
		parts[i] = fmt.Sprintf("%02x%02x", g[2*i], g[2*i+1])
	}
	return strings.Join(parts, ":")
}

func TestDevices(t *testing.T) {
	topo := srenv.Require(t)
	devs := append(topo.Devs[:], topo.Lo)
	uverbs := map[string]string{} // ibdev -> uverbsN
	ms, _ := filepath.Glob("/sys/class/infiniband_verbs/uverbs*")
	for _, m := range ms {
		uverbs[readSys(t, m+"/ibdev")] = filepath.Base(m)
	}
	for _, d := range devs {
		t.Run(d.Name, func(t *testing.T) {
			base := "/sys/class/infiniband/" + d.Name
			if got := readSys(t, base+"/parent"); got != d.Netdev {
				t.Errorf("parent netdev = %q, want %q", got, d.Netdev)
			}
			if got := readSys(t, base+"/ports/1/state"); got != "4: ACTIVE" {
				t.Errorf("port state = %q, want ACTIVE", got)
			}
			if got := readSys(t, base+"/ports/1/link_layer"); got != "Ethernet" {
				t.Errorf("link layer = %q", got)
			}
			i := strconv.Itoa(d.GIDIndex)
			if got, want := readSys(t, base+"/ports/1/gids/"+i), sysfsGID(d.GID); got != want {
				t.Errorf("gid[%s] = %s, want %s", i, got, want)
			}
			if got := readSys(t, base+"/ports/1/gid_attrs/types/"+i); got != "RoCE v2" {
				t.Errorf("gid[%s] type = %q, want RoCE v2", i, got)
			}
			// RPS over every CPU keeps each flow (each QP) on one CPU, so the
			// wire delivers a QP's packets in order (guest/init).
			rps := strings.ReplaceAll(readSys(t, "/sys/class/net/"+d.Netdev+"/queues/rx-0/rps_cpus"), ",", "")
			if m, err := strconv.ParseUint(rps, 16, 64); err != nil || m != 1<<runtime.NumCPU()-1 {
				t.Errorf("%s rps_cpus = %q, want every CPU (%x)", d.Netdev, rps, uint64(1)<<runtime.NumCPU()-1)
			}
			u, ok := uverbs[d.Name]
			if !ok {
				t.Fatalf("no uverbs char device for %s", d.Name)
			}
			f, err := os.OpenFile("/dev/infiniband/"+u, os.O_RDWR, 0)
			if err != nil {
				t.Fatalf("open /dev/infiniband/%s: %v", u, err)
			}
			f.Close()
			t.Logf("%s on %s ip %s gid[%d] %s via %s", d.Name, d.Netdev, d.IP, d.GIDIndex, d.IP.To16(), u)
		})
	}
}

func TestHosts(t *testing.T) {
	topo := srenv.Require(t)
	if len(topo.HostA) != 2 {
		t.Fatalf("host A has %d rails, want 2", len(topo.HostA))
	}
	seen := map[string]bool{}
	for r := range topo.HostA {
		a, b := topo.Pair(r)
		if seen[a.Name] || seen[b.Name] || a.Name == b.Name {
			t.Errorf("rail %d: device reused (%s, %s)", r, a.Name, b.Name)
		}
		seen[a.Name], seen[b.Name] = true, true
		if !a.IP.Mask(a.IP.DefaultMask()).Equal(b.IP.Mask(b.IP.DefaultMask())) || a.IP.Equal(b.IP) {
			t.Errorf("rail %d: %s %s and %s %s are not two ends of one subnet", r, a.Name, a.IP, b.Name, b.IP)
		}
	}
}

// TestRoutes checks that each rail's traffic leaves through its own veth, not lo.
func TestRoutes(t *testing.T) {
	topo := srenv.Require(t)
	for r := range topo.HostA {
		a, b := topo.Pair(r)
		for _, c := range [][2]srenv.Dev{{a, b}, {b, a}} {
			out, err := exec.Command("ip", "-o", "route", "get", c[1].IP.String(), "from", c[0].IP.String()).CombinedOutput()
			if err != nil {
				t.Fatalf("ip route get: %v: %s", err, out)
			}
			if !strings.Contains(string(out), " dev "+c[0].Netdev+" ") {
				t.Errorf("route %s -> %s: %s (want dev %s)", c[0].IP, c[1].IP, strings.TrimSpace(string(out)), c[0].Netdev)
			}
		}
	}
}

func counter(t *testing.T, netdev, name string) uint64 {
	v, err := strconv.ParseUint(readSys(t, "/sys/class/net/"+netdev+"/statistics/"+name), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// pingpong runs ibv_rc_pingpong with srv as server and cli as client.
func pingpong(t *testing.T, srv, cli srenv.Dev, port int) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := func(d srenv.Dev) []string {
		return []string{"-d", d.Name, "-g", strconv.Itoa(d.GIDIndex), "-p", strconv.Itoa(port), "-n", "50", "-s", "4096"}
	}
	s := exec.CommandContext(ctx, "ibv_rc_pingpong", args(srv)...)
	var sout strings.Builder
	s.Stdout, s.Stderr = &sout, &sout
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	var cout []byte
	var err error
	for try := 0; try < 50; try++ { // until the server listens
		cout, err = exec.CommandContext(ctx, "ibv_rc_pingpong", append(args(cli), "127.0.0.1")...).CombinedOutput()
		if err == nil || !strings.Contains(string(cout), "Couldn't connect") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	serr := s.Wait()
	if err != nil || serr != nil {
		t.Fatalf("ibv_rc_pingpong %s <- %s: client %v: %s\nserver %v: %s", srv.Name, cli.Name, err, cout, serr, sout.String())
	}
	return strings.TrimSpace(string(cout))
}

// TestRailTraffic sends RC traffic over each rail with rdma-core's tools and checks
// that the packets crossed that rail's veth pair and no other.
func TestRailTraffic(t *testing.T) {
	topo := srenv.Require(t)
	if !topo.Tools {
		t.Fatal("SR_TOOLS unset: the guest image lacks rdma-core tools")
	}
	for r := range topo.HostA {
		a, b := topo.Pair(r)
		t.Run(fmt.Sprintf("rail%d-%s-%s", r+1, a.Name, b.Name), func(t *testing.T) {
			before := map[string]uint64{}
			for _, d := range topo.Devs {
				before[d.Netdev] = counter(t, d.Netdev, "tx_packets")
			}
			out := pingpong(t, b, a, 18515+r)
			t.Log(out)
			for _, d := range topo.Devs {
				n := counter(t, d.Netdev, "tx_packets") - before[d.Netdev]
				onRail := d.Name == a.Name || d.Name == b.Name
				if onRail && n < 50 {
					t.Errorf("%s sent %d packets during the pingpong, want >= 50", d.Netdev, n)
				}
				if !onRail && n > 10 { // a few IPv6 router solicitations may go out
					t.Errorf("%s (other rail) sent %d packets during the pingpong", d.Netdev, n)
				}
			}
		})
	}
	t.Run("loopback-"+topo.Lo.Name, func(t *testing.T) {
		t.Log(pingpong(t, topo.Lo, topo.Lo, 18520))
	})
}
