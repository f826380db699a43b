package rdmanl

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
)

// TestUverbsChardevInGuest compares netlink's answer with sysfs for every rxe
// device of the Soft-RoCE guest.
func TestUverbsChardevInGuest(t *testing.T) {
	topo := srenv.Require(t)
	for _, d := range append(topo.Devs[:], topo.Lo) {
		c, err := UverbsChardev(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		ibdev, err := os.ReadFile("/sys/class/infiniband_verbs/" + c.Name + "/ibdev")
		if err != nil || strings.TrimSpace(string(ibdev)) != d.Name {
			t.Errorf("%s: netlink says %s, whose ibdev is %q (%v)", d.Name, c.Name, ibdev, err)
		}
		dev, _ := os.ReadFile("/sys/class/infiniband_verbs/" + c.Name + "/dev")
		if got := fmt.Sprintf("%d:%d", c.Major, c.Minor); got != strings.TrimSpace(string(dev)) {
			t.Errorf("%s: dev %s, sysfs %q", d.Name, got, dev)
		}
		if c.DriverID != 14 || c.ABI != 2 {
			t.Errorf("%s: driver id %d abi %d, want rxe (14) abi 2", d.Name, c.DriverID, c.ABI)
		}
	}
	if _, err := UverbsChardev("nonexistent0"); err == nil {
		t.Error("lookup of a missing device succeeded")
	}
}
