package rdma_test

import (
	"errors"
	"testing"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/enginetest"
	"github.com/rdmago/te/rdma"
)

// TestCloseAfterFailedInstall: a host without the named device fails
// Install with the cause; Close afterwards (twice) returns without a
// panic, and Install after Close fails with ErrClosed. This needs no
// device, so it runs on every host.
func TestCloseAfterFailedInstall(t *testing.T) {
	e, err := engine.New(engine.Config{Name: "lifecycle", Store: enginetest.NewMemStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr := rdma.New(rdma.Config{Devices: []string{"no-such-rdma-device0"}})
	err = e.Install(tr)
	if err == nil {
		t.Fatal("Install on a missing device succeeded")
	}
	t.Logf("Install: %v", err)
	for i := 0; i < 2; i++ {
		if err := tr.Driver().Close(); err != nil {
			t.Fatalf("Close #%d after a failed Install: %v", i+1, err)
		}
	}
	if err := e.Install(tr); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("Install after Close: %v, want ErrClosed", err)
	}
}

// TestCloseWithoutInstall: Close of a transport never installed is a no-op.
func TestCloseWithoutInstall(t *testing.T) {
	tr := rdma.New(rdma.Config{})
	if err := tr.Driver().Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Driver().Close(); err != nil {
		t.Fatal(err)
	}
}
