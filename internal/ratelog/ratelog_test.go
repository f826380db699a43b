package ratelog

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rdmago/te/internal/testenv"
)

func TestWarn(t *testing.T) {
	var out testenv.Buffer
	l := New(slog.New(slog.NewTextHandler(&out, nil)), 50*time.Millisecond)
	// A stepped clock: the flood below must fall inside the interval
	// however slowly a loaded machine (or qemu-user) runs it.
	clock := time.Unix(1e9, 0)
	l.now = func() time.Time { return clock }
	if !l.Warn("first", "peer", "a") {
		t.Fatal("first line dropped")
	}
	for range 10 {
		if l.Warn("flood") {
			t.Fatal("a line within the interval was written")
		}
	}
	clock = clock.Add(49 * time.Millisecond)
	if l.Warn("flood") {
		t.Fatal("a line 49 ms into a 50 ms interval was written")
	}
	clock = clock.Add(11 * time.Millisecond)
	if !l.Warn("after", "peer", "b") {
		t.Fatal("line after the interval dropped")
	}
	s := out.String()
	if strings.Count(s, "\n") != 2 || !strings.Contains(s, "peer=a not_logged_since_last=0") || !strings.Contains(s, "peer=b not_logged_since_last=11") {
		t.Fatalf("log:\n%s", s)
	}
	New(nil, 0).Warn("discarded")
}
