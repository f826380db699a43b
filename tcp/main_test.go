package tcp

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		runChildTarget()
		return
	}
	if os.Getenv(emfileEnv) != "" {
		runEMFILETarget()
		return
	}
	goleak.VerifyTestMain(m)
}
