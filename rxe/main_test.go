package rxe_test

import (
	"testing"

	"github.com/rdmago/te/uverbs/leakcheck"
)

// TestMain fails the binary if any verbs object is still open at exit.
func TestMain(m *testing.M) { leakcheck.Main(m) }
