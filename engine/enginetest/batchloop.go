package enginetest

import (
	"context"

	"github.com/rdmago/te/engine"
)

// BatchLoop returns run, which moves reqs through e as one batch
// (allocate, submit, wait, free) and keeps the first error, and failed,
// which reports it. Allocation tests measure run; they check failed
// after, since a run that failed early allocates less.
func BatchLoop(ctx context.Context, e *engine.Engine, reqs []engine.Request) (run func(), failed func() error) {
	var first error
	run = func() {
		b, err := e.AllocateBatch(len(reqs))
		if err == nil {
			err = e.Submit(b, reqs)
		}
		if err == nil {
			err = e.Wait(ctx, b)
		}
		if err == nil {
			err = e.FreeBatch(b)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return run, func() error { return first }
}
