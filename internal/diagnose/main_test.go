package diagnose_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every probe connection and engine a walk opens is closed by the end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
