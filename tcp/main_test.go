package tcp

import (
	"os"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"

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
	transporttest.ServeTargetIfChild(func() engine.Transport { return New(Config{}) })
	goleak.VerifyTestMain(m)
}
