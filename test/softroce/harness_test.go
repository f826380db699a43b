// Package softroce holds host-side checks of the Soft-RoCE harness scripts;
// the harness itself is run.sh (see ENV.md).
package softroce

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestScriptsParse(t *testing.T) {
	for _, f := range []string{"run.sh", "bench.sh", "guest/init", "perf/run.sh", "perf/engine.sh"} {
		if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", f, err, out)
		}
	}
}

// TestEnvContract checks that the guest exports every variable of the
// contract that srenv and the device tests rely on, and that ENV.md names it.
func TestEnvContract(t *testing.T) {
	init, err := os.ReadFile("guest/init")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("ENV.md")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, line := range strings.Split(string(init), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "export "); ok {
			for _, m := range regexp.MustCompile(`\b(SR_[A-Z0-9_]+)=`).FindAllStringSubmatch(rest, -1) {
				exported[m[1]] = true
			}
		}
	}
	want := []string{"SR_GUEST", "SR_MTU", "SR_KVER", "SR_TOOLS", "SR_OUT", "SR_HOST_A", "SR_HOST_B", "SR_PAIRS"}
	for _, base := range []string{"SR_DEV", "SR_IP", "SR_GID", "SR_GIDADDR"} {
		for _, s := range []string{"0", "1", "2", "3", "LO"} {
			want = append(want, base+s)
		}
	}
	for _, s := range []string{"0", "1", "2", "3"} {
		want = append(want, "SR_NETDEV"+s)
	}
	for _, v := range want {
		if !exported[v] {
			t.Errorf("guest/init does not export %s", v)
		}
		name := strings.TrimRight(v, "0123456789")
		name = strings.TrimSuffix(name, "LO")
		if !strings.Contains(string(doc), "`"+v+"`") && !strings.Contains(string(doc), "`"+name) {
			t.Errorf("ENV.md does not document %s", v)
		}
	}
}
