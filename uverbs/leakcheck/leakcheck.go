// Package leakcheck fails a test binary that leaves verbs objects open: its
// Main replaces the TestMain of every package whose tests open devices.
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
package leakcheck

import (
	"fmt"
	"io"
	"os"

	"github.com/rdmago/te/uverbs"
)

// Main runs the tests and exits with their status, or with 99 when they
// passed but verbs objects (uverbs.LiveObjects) are still open; those are
// listed on stderr.
func Main(m interface{ Run() int }) {
	os.Exit(check(m.Run(), uverbs.LiveObjects(), os.Stderr))
}

// check returns the exit status for tests that ended with code and left
// live open, reporting them to w.
func check(code int, live []string, w io.Writer) int {
	if len(live) == 0 {
		return code
	}
	fmt.Fprintf(w, "FAIL: %d verbs objects leaked:\n", len(live))
	for _, l := range live {
		fmt.Fprintln(w, "  ", l)
	}
	if code == 0 {
		code = 99
	}
	return code
}
