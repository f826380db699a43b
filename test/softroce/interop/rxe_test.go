package interop

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/test/softroce/srenv"
)

// teFails runs te with args, wants exit status 1 within limit and the
// output to contain want.
func teFails(t *testing.T, limit time.Duration, want string, args ...string) {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("te", args...)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), want) || time.Since(start) > limit {
		t.Errorf("te %v: exit %v after %v, want 1 within %v and %q in:\n%s", args, cmd.ProcessState, time.Since(start), limit, want, out)
	}
}

func listed(t *testing.T, dev string) bool {
	return regexp.MustCompile(`(?m)^hca_id:\s+` + regexp.QuoteMeta(dev) + `$`).MatchString(runOut(t, "te", "devices"))
}

// TestTeRXE creates Soft-RoCE links with `te rxe add` and removes them
// with `te rxe del`: on a fresh veth netdev (the name te picks, the GID
// of the netdev's address), and on lo in place of the guest's rxelo, where
// `te perf` runs over the new device in one process and as server and
// client. The guest's rxelo is recreated at the end.
func TestTeRXE(t *testing.T) {
	topo := srenv.Require(t)
	teFails(t, 5*time.Second, `no RDMA device "nosuch9" (devices: `, "perf", "-d", "nosuch9", "-p", "18960")

	t.Run("veth", func(t *testing.T) {
		runOut(t, "/usr/bin/ip", "link", "add", "terxe0", "type", "veth", "peer", "name", "terxe1")
		t.Cleanup(func() { exec.Command("/usr/bin/ip", "link", "del", "terxe0").Run() })
		runOut(t, "/usr/bin/ip", "addr", "add", "10.0.9.1/24", "dev", "terxe0")
		runOut(t, "/usr/bin/ip", "link", "set", "terxe0", "up")
		runOut(t, "/usr/bin/ip", "link", "set", "terxe1", "up")
		out := runOut(t, "te", "rxe", "add", "terxe0")
		m := regexp.MustCompile(`^(rxe\d+) on terxe0 `).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("te rxe add terxe0 printed %q, want \"rxeN on terxe0 ...\"", out)
		}
		dev := m[1]
		for _, d := range append(topo.Devs[:], topo.Lo) {
			if d.Name == dev {
				t.Fatalf("te rxe add chose %s, which exists", dev)
			}
		}
		v := runOut(t, "te", "devices", "-v", "-d", dev)
		if !strings.Contains(v, "netdev:\t\t\tterxe0") || !strings.Contains(v, "::ffff:10.0.9.1, RoCE v2") {
			t.Errorf("te devices -v -d %s:\n%s", dev, v)
		}
		if !listed(t, dev) {
			t.Errorf("te devices does not list %s", dev)
		}
		teFails(t, 10*time.Second, "already exists on it", "rxe", "add", "terxe0")
		runOut(t, "te", "rxe", "del", dev)
		if listed(t, dev) {
			t.Errorf("%s is still listed after te rxe del", dev)
		}
		teFails(t, 5*time.Second, "no such RDMA device", "rxe", "del", dev)
	})

	t.Run("lo-perf", func(t *testing.T) {
		lo := topo.Lo.Name
		runOut(t, "te", "rxe", "del", lo)
		t.Cleanup(func() {
			if !listed(t, lo) {
				runOut(t, "te", "rxe", "add", "lo", "--name", lo)
			}
			if !listed(t, lo) {
				t.Errorf("%s was not recreated", lo)
			}
		})
		const dev = "rxetest"
		if out := runOut(t, "te", "rxe", "add", "--name", dev, "lo"); !strings.HasPrefix(out, dev+" on lo ") {
			t.Fatalf("te rxe add: %q", out)
		}
		if !listed(t, dev) {
			t.Fatalf("te devices does not list %s", dev)
		}
		checkPerf(t, tePerf(t, "-d", dev, "-peer", dev, "-n", "100"), "write", "bw", 100)
		srv := exec.Command("te", "perf", "-d", dev, "-p", "18961", "-timeout", "60s")
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		checkPerf(t, tePerf(t, "-d", dev, "127.0.0.1", "-p", "18961", "-op", "read", "-n", "100"), "read", "bw", 100)
		if err := srv.Wait(); err != nil {
			t.Errorf("server: %v", err)
		}
		runOut(t, "te", "rxe", "del", dev)
		if listed(t, dev) {
			t.Errorf("%s is still listed after te rxe del", dev)
		}
	})
}
