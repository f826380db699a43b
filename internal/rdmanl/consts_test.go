package rdmanl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmago/te/internal/testenv"
)

// TestConstsMatchKernelHeaders compiles a C program against the installed
// UAPI header rdma_netlink.h and compares every command and attribute
// number this package sends or reads.
func TestConstsMatchKernelHeaders(t *testing.T) {
	if os.Getenv("SR_GUEST") == "1" {
		// The Soft-RoCE guest has no compiler; the host's unit tier
		// checks the constants.
		t.Skip("needs gcc: runs in the host's unit tier")
	}
	gcc := testenv.GCC(t, "gcc linux-libc-dev", "/usr/include/rdma/rdma_netlink.h")
	consts := []struct {
		c string
		v int
	}{
		{"RDMA_NL_NLDEV", nlNLDev}, {"RDMA_NLDEV_CMD_GET", cmdGet}, {"RDMA_NLDEV_CMD_GET_CHARDEV", cmdGetChardev},
		{"RDMA_NLDEV_CMD_NEWLINK", cmdNewLink}, {"RDMA_NLDEV_CMD_DELLINK", cmdDelLink},
		{"RDMA_NLDEV_ATTR_NDEV_NAME", attrNdevName}, {"RDMA_NLDEV_ATTR_LINK_TYPE", attrLinkType},
		{"RDMA_NLDEV_ATTR_DEV_INDEX", attrDevIndex}, {"RDMA_NLDEV_ATTR_DEV_NAME", attrDevName},
		{"RDMA_NLDEV_ATTR_CHARDEV_TYPE", attrChardevTyp}, {"RDMA_NLDEV_ATTR_CHARDEV_NAME", attrChardevNam},
		{"RDMA_NLDEV_ATTR_CHARDEV_ABI", attrChardevABI}, {"RDMA_NLDEV_ATTR_CHARDEV", attrChardev},
		{"RDMA_NLDEV_ATTR_UVERBS_DRIVER_ID", attrDriverID},
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <rdma/rdma_netlink.h>\nint main(void) {\n")
	var want strings.Builder
	for _, c := range consts {
		fmt.Fprintf(&src, "\tprintf(\"%s %%d\\n\", (int)%s);\n", c.c, c.c)
		fmt.Fprintf(&want, "%s %d\n", c.c, c.v)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-Wall", "-o", filepath.Join(dir, "c"), filepath.Join(dir, "c.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "c")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != want.String() {
		t.Errorf("rdma_netlink.h says\n%s\nthe package has\n%s", out, want.String())
	}
}
