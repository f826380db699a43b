package leakcheck

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	var w strings.Builder
	if got := check(0, nil, &w); got != 0 || w.Len() != 0 {
		t.Errorf("no leaks: status %d, output %q", got, w.String())
	}
	if got := check(1, nil, &w); got != 1 {
		t.Errorf("failed tests, no leaks: status %d", got)
	}
	live := []string{"QP 0x11 on rxe0", "CQ 3 on rxe0"}
	if got := check(0, live, &w); got != 99 {
		t.Errorf("leaks after passing tests: status %d, want 99", got)
	}
	if out := w.String(); !strings.Contains(out, "FAIL: 2 verbs objects leaked") || !strings.Contains(out, "QP 0x11 on rxe0") || !strings.Contains(out, "CQ 3 on rxe0") {
		t.Errorf("report %q", out)
	}
	w.Reset()
	if got := check(3, live, &w); got != 3 || !strings.Contains(w.String(), "leaked") {
		t.Errorf("leaks after failing tests: status %d, output %q", got, w.String())
	}
}
