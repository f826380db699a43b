package uverbs_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/rdmago/te/test/softroce/srenv"
	"github.com/rdmago/te/uverbs/leakcheck"
)

// TestMain fails the binary if any verbs object is still open at exit.
// Outside the Soft-RoCE guest, unless -run says otherwise, the examples
// that need a device are skipped (test/softroce/run.sh ./uverbs runs them).
func TestMain(m *testing.M) {
	flag.Parse()
	if !srenv.InGuest() && flag.Lookup("test.run").Value.String() == "" {
		fmt.Fprintln(os.Stderr, "uverbs: SKIP Example_loopbackWrite (it needs the Soft-RoCE guest: test/softroce/run.sh ./uverbs)")
		flag.Set("test.skip", "^Example_loopbackWrite$")
	}
	leakcheck.Main(m)
}
