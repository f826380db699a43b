package rxe_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/rdmago/te/uverbs"
)

// TestMain fails the binary if any verbs object is still open at exit.
func TestMain(m *testing.M) {
	code := m.Run()
	if live := uverbs.LiveObjects(); len(live) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d verbs objects leaked:\n", len(live))
		for _, l := range live {
			fmt.Fprintln(os.Stderr, "  ", l)
		}
		if code == 0 {
			code = 99
		}
	}
	os.Exit(code)
}
