package main

import (
	"testing"

	"github.com/rdmago/te/uverbs"
)

// TestProvidersCarried: te opens Soft-RoCE and ConnectX devices alike.
func TestProvidersCarried(t *testing.T) {
	got := map[uverbs.DriverID]string{}
	for _, p := range verbsOptions.Providers {
		if prev, dup := got[p.DriverID()]; dup {
			t.Errorf("driver %s carried twice (%s, %s)", p.DriverID(), prev, p.Name())
		}
		got[p.DriverID()] = p.Name()
	}
	for id, name := range map[uverbs.DriverID]string{uverbs.DriverRXE: "rxe", uverbs.DriverMLX5: "mlx5"} {
		if got[id] != name {
			t.Errorf("driver %s: provider %q, want %q", id, got[id], name)
		}
	}
}
