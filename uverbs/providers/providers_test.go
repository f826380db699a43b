package providers_test

import (
	"testing"

	"github.com/rdmago/te/uverbs"
	"github.com/rdmago/te/uverbs/providers"
)

// TestAll: one provider per driver te supports, and nothing else.
func TestAll(t *testing.T) {
	got := map[uverbs.DriverID]string{}
	for _, p := range providers.Options().Providers {
		if prev, dup := got[p.DriverID()]; dup {
			t.Errorf("driver %s carried twice (%s, %s)", p.DriverID(), prev, p.Name())
		}
		got[p.DriverID()] = p.Name()
	}
	want := map[uverbs.DriverID]string{uverbs.DriverRXE: "rxe", uverbs.DriverMLX5: "mlx5"}
	if len(got) != len(want) {
		t.Errorf("providers %v, want %v", got, want)
	}
	for id, name := range want {
		if got[id] != name {
			t.Errorf("driver %s: provider %q, want %q", id, got[id], name)
		}
	}
	// Each call returns a list of its own.
	a, b := providers.All(), providers.All()
	a[0] = nil
	if b[0] == nil {
		t.Error("All shares its slice between calls")
	}
}
