package uverbs

import (
	"fmt"
	"sort"
	"sync"
)

// Every live object (Context, PD, MR, CQ, QP, CompChannel, Buffer) is
// recorded here from creation until Close, so tests can prove nothing leaked.
var live struct {
	mu   sync.Mutex
	objs map[any]string
}

func track(o any, desc string) {
	live.mu.Lock()
	if live.objs == nil {
		live.objs = map[any]string{}
	}
	live.objs[o] = desc
	live.mu.Unlock()
}

func untrack(o any) {
	live.mu.Lock()
	delete(live.objs, o)
	live.mu.Unlock()
}

// LiveObjects describes every verbs object created and not yet closed, in
// this process. Tests call it at the end to detect leaks.
func LiveObjects() []string {
	live.mu.Lock()
	defer live.mu.Unlock()
	out := make([]string, 0, len(live.objs))
	for _, d := range live.objs {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

func describe(kind string, dev string, h Handle) string {
	return fmt.Sprintf("%s %d on %s", kind, h, dev)
}
