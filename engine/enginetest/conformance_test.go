package enginetest_test

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/segment"
	"github.com/rdmago/te/segment/storetest"
)

// TestConformance holds the test store to the contract every
// segment.Store meets, so engine tests run against realistic semantics.
func TestConformance(t *testing.T) {
	root := enginetest.NewMemStore()
	defer root.Close()
	storetest.Run(t, func(t *testing.T) segment.Store { return root.Process() },
		storetest.ListsAll(), storetest.Conflicts(), storetest.Settle(2*time.Second))
}
