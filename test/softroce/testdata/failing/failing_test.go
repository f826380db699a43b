// Package failing is a payload for checking the harness's failure paths by hand:
//
//	test/softroce/run.sh ./test/softroce/testdata/failing                      # exit 1
//	SR_TEST_TIMEOUT=5s SR_TEST_ARGS='-test.run Hang' test/softroce/run.sh ./test/softroce/testdata/failing
package failing

import (
	"os"
	"testing"
	"time"
)

func TestPasses(t *testing.T) {}

func TestFails(t *testing.T) {
	if os.Getenv("SR_GUEST") == "1" {
		t.Fatal("intentional failure (harness failure-path check)")
	}
}

// TestHang hangs only under a short -test.timeout, so that a plain run stays quick.
func TestHang(t *testing.T) {
	if d, ok := t.Deadline(); ok && time.Until(d) < time.Minute && os.Getenv("SR_GUEST") == "1" {
		time.Sleep(time.Hour)
	}
}
