package interop

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/test/softroce/srenv"
)

// devinfo parses ibv_devinfo-style output into device -> key -> value, with
// port attributes keyed "port<N>/<key>" and GIDs "port<N>/GID[i]".
func devinfo(out string) map[string]map[string]string {
	res := map[string]map[string]string{}
	var dev map[string]string
	port := ""
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch {
		case k == "hca_id":
			dev = map[string]string{}
			res[v] = dev
			port = ""
		case dev == nil:
		case k == "port":
			port = "port" + v + "/"
		default:
			if strings.HasPrefix(k, "GID[") {
				k = strings.ReplaceAll(k, " ", "")
				v, _, _ = strings.Cut(v, " (") // te adds the netdev
			}
			dev[port+k] = v
		}
	}
	return res
}

func runOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// TestTeDevices compares `te devices -v` with rdma-core's `ibv_devinfo -v` on
// every guest device: identity, capabilities, port attributes and GID tables.
func TestTeDevices(t *testing.T) {
	topo := srenv.Require(t)
	if _, err := exec.LookPath("te"); err != nil {
		t.Fatalf("te is not in the guest: %v (run.sh ships cmd/te as /usr/bin/te)", err)
	}
	short := runOut(t, "te", "devices")
	for _, d := range append(topo.Devs[:], topo.Lo) {
		if !regexp.MustCompile(`(?m)^hca_id:\s+` + d.Name + `$`).MatchString(short) {
			t.Errorf("te devices does not list %s:\n%s", d.Name, short)
		}
	}
	ours := devinfo(runOut(t, "te", "devices", "-v"))
	theirs := devinfo(runOut(t, "ibv_devinfo", "-v"))
	keys := []string{"fw_ver", "node_guid", "sys_image_guid", "vendor_id", "vendor_part_id", "hw_ver",
		"phys_port_cnt", "max_mr_size", "max_qp", "max_qp_wr", "max_sge", "max_sge_rd", "max_cq", "max_cqe",
		"max_mr", "max_pd", "max_qp_rd_atom", "max_qp_init_rd_atom", "atomic_cap", "max_srq", "max_srq_wr",
		"max_srq_sge", "max_pkeys", "local_ca_ack_delay", "num_comp_vectors",
		"port1/state", "port1/max_mtu", "port1/active_mtu", "port1/sm_lid", "port1/port_lid",
		"port1/link_layer", "port1/max_msg_sz", "port1/pkey_tbl_len", "port1/gid_tbl_len",
		"port1/active_width", "port1/active_speed", "port1/phys_state"}
	for _, d := range append(topo.Devs[:], topo.Lo) {
		o, th := ours[d.Name], theirs[d.Name]
		if o == nil || th == nil {
			t.Errorf("%s: te has it: %v, ibv_devinfo has it: %v", d.Name, o != nil, th != nil)
			continue
		}
		for _, k := range keys {
			if o[k] != th[k] {
				t.Errorf("%s %s: te %q, ibv_devinfo %q", d.Name, k, o[k], th[k])
			}
		}
		ngid := 0
		for k, v := range th {
			if strings.Contains(k, "/GID[") {
				ngid++
				if o[k] != v {
					t.Errorf("%s %s: te %q, ibv_devinfo %q", d.Name, k, o[k], v)
				}
			}
		}
		if ngid < 2 {
			t.Errorf("%s: ibv_devinfo lists %d GIDs, want the default and the IPv4 one", d.Name, ngid)
		}
	}
	if t.Failed() {
		t.Logf("te devices -v:\n%s", runOut(t, "te", "devices", "-v", "-d", topo.Devs[0].Name))
	}
	if out, err := exec.Command("te", "devices", "-d", "no-such-device").CombinedOutput(); err == nil {
		t.Errorf("te devices -d no-such-device succeeded:\n%s", out)
	}
}

type perfJSON struct {
	Device, Peer, Op, Test string
	Bytes, Iters, MTU      int
	MBps                   float64 `json:"mb_per_s"`
	Min                    float64 `json:"t_min_us"`
	Typical                float64 `json:"t_typical_us"`
	Max                    float64 `json:"t_max_us"`
}

func tePerf(t *testing.T, args ...string) perfJSON {
	t.Helper()
	rs := tePerfAll(t, args...)
	if len(rs) != 1 {
		t.Fatalf("te perf %v: %d results, want 1", args, len(rs))
	}
	return rs[0]
}

// tePerfAll runs te perf --json and returns the results of its report.
func tePerfAll(t *testing.T, args ...string) []perfJSON {
	t.Helper()
	cmd := exec.Command("te", append([]string{"perf", "-json", "-timeout", "60s"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("te perf %v: %v\n%s%s", args, err, out, stderr.Bytes())
	}
	return perfResults(t, out)
}

// perfResults decodes te perf's --json output: te's report envelope.
func perfResults(t *testing.T, out []byte) []perfJSON {
	t.Helper()
	rep, err := cli.ParseReport(out)
	if err != nil || rep.Command != "perf" {
		t.Fatalf("te perf --json: not a perf report (%v):\n%s", err, out)
	}
	var rs []perfJSON
	for _, raw := range rep.Results {
		var r perfJSON
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("result %s: %v", raw, err)
		}
		rs = append(rs, r)
	}
	return rs
}

func checkPerf(t *testing.T, r perfJSON, op, test string, iters int) {
	t.Helper()
	if r.Op != op || r.Test != test || r.Iters != iters || r.Bytes == 0 || r.MTU == 0 {
		t.Errorf("result %+v, want op %s test %s iters %d", r, op, test, iters)
	}
	if test == "bw" && !(r.MBps > 0) {
		t.Errorf("bandwidth %v MB/s", r.MBps)
	}
	if test == "lat" && !(0 < r.Min && r.Min <= r.Typical && r.Typical <= r.Max) {
		t.Errorf("latency min %v typical %v max %v", r.Min, r.Typical, r.Max)
	}
	t.Logf("%s %s %s->%s: %.2f MB/s, typical %.2f us", op, test, r.Device, r.Peer, r.MBps, r.Typical)
}

// TestTePerf runs every te perf test once, briefly: both ends in one process
// on rail 1, server and client processes on rail 2, and the loopback device.
// It checks that each completes and reports sane numbers, not how fast.
func TestTePerf(t *testing.T) {
	topo := srenv.Require(t)
	a, b := topo.Pair(0)
	for _, op := range []string{"write", "read", "send"} {
		for _, test := range []string{"bw", "lat"} {
			t.Run(op+"-"+test, func(t *testing.T) {
				args := []string{"-d", a.Name, "-peer", b.Name, "-op", op, "-n", "100"}
				if test == "lat" {
					args = append(args, "-lat")
				}
				checkPerf(t, tePerf(t, args...), op, test, 100)
			})
		}
	}
	t.Run("server-client", func(t *testing.T) {
		a, b := topo.Pair(1)
		for _, lat := range []bool{false, true} {
			srv := exec.Command("te", "perf", "-d", b.Name, "-p", "18950", "-timeout", "60s")
			var sout bytes.Buffer
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			args := []string{"-d", a.Name, "127.0.0.1", "-p", "18950", "-op", "send", "-n", "100"}
			test := "bw"
			if lat {
				args, test = append(args, "-lat"), "lat"
			}
			r := tePerf(t, args...)
			if err := srv.Wait(); err != nil {
				t.Fatalf("server: %v\n%s", err, sout.String())
			}
			checkPerf(t, r, "send", test, 100)
			if r.Peer != b.Name {
				t.Errorf("peer %q, want %q", r.Peer, b.Name)
			}
		}
	})
	// Bandwidth tests sleep on completion events on rxe by default (-cq
	// auto); busy polling and an explicit ACK timeout and warm-up must work too.
	t.Run("cq-modes", func(t *testing.T) {
		for _, op := range []string{"write", "send"} {
			for _, cq := range []string{"poll", "event"} {
				args := []string{"-d", a.Name, "-peer", b.Name, "-op", op, "-n", "100", "-cq", cq, "-u", "16", "--warmup", "4"}
				checkPerf(t, tePerf(t, args...), op, "bw", 100)
			}
		}
	})
	t.Run("loopback", func(t *testing.T) {
		checkPerf(t, tePerf(t, "-d", topo.Lo.Name, "-peer", topo.Lo.Name, "-n", "100"), "write", "bw", 100)
	})
	t.Run("bad-input", func(t *testing.T) {
		cmd := exec.Command("te", "perf", "-d", a.Name, "-peer", b.Name, "-op", "bogus")
		if out, err := cmd.CombinedOutput(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), `--op "bogus"`) {
			t.Errorf("te perf -op bogus: %v, want exit status 2\n%s", err, out)
		}
		// a server fed garbage reports it and exits, it does not hang or crash
		srv := exec.Command("te", "perf", "-d", b.Name, "-p", "18951", "-timeout", "30s")
		var sout bytes.Buffer
		srv.Stdout, srv.Stderr = &sout, &sout
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		var c net.Conn
		var err error
		for i := 0; i < 100; i++ {
			if c, err = net.Dial("tcp", "127.0.0.1:18951"); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		// te's version in perftest's 16-byte field, then a bad test
		c.Write(append([]byte("6.06 te1"), make([]byte, 8)...))
		c.Write([]byte(`{"params": {"op": "write", "test": "bw", "size": -5, "iters": 1, "depth": 1}}` + "\n"))
		reply, _ := io.ReadAll(c)
		c.Close()
		err = srv.Wait()
		if err == nil || !strings.Contains(sout.String(), "-s -5") || !strings.Contains(string(reply), "error") {
			t.Errorf("server fed a bad request: %v, reply %q, output:\n%s", err, reply, sout.String())
		}
	})
}
