package rdma

import (
	"testing"

	"github.com/rdmago/te/rxe"
	"github.com/rdmago/te/uverbs"
)

// TestDefaultProviders: without a provider list the transport opens rxe
// and mlx5 devices (uverbs/providers), keeping the caller's other options
// and never writing into the caller's Options.
func TestDefaultProviders(t *testing.T) {
	drivers := func(o *uverbs.Options) map[uverbs.DriverID]bool {
		m := map[uverbs.DriverID]bool{}
		for _, p := range o.Providers {
			m[p.DriverID()] = true
		}
		return m
	}
	d := drivers(New(Config{}).cfg.Options)
	if len(d) != 2 || !d[uverbs.DriverRXE] || !d[uverbs.DriverMLX5] {
		t.Errorf("default providers %v, want rxe and mlx5", d)
	}
	mine := &uverbs.Options{AsyncEventBuffer: 7}
	got := New(Config{Options: mine}).cfg.Options
	if mine.Providers != nil || got.AsyncEventBuffer != 7 || len(got.Providers) != 2 {
		t.Errorf("options without providers: caller's now %+v, transport's %+v", mine, got)
	}
	only := &uverbs.Options{Providers: []uverbs.Provider{rxe.Provider()}}
	if got := New(Config{Options: only}).cfg.Options; got != only {
		t.Errorf("a given provider list was replaced: %+v", got)
	}
}
