package ebpf

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(dialChildEnv) != "" {
		dialChild()
		return
	}
	goleak.VerifyTestMain(m)
}
