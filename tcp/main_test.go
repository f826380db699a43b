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
	goleak.VerifyTestMain(m)
}
