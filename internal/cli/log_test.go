package cli

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
)

// noControl fails when out holds a control byte other than newline.
func noControl(t *testing.T, out string) {
	t.Helper()
	if i := strings.IndexFunc(out, func(r rune) bool { return r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 }); i >= 0 {
		t.Fatalf("control byte %q at %d: %q", out[i], i, out)
	}
}

// TestLogWriter: control characters and bytes that are not UTF-8 are
// escaped, newlines kept; a line past MaxLogLine is cut with the count of
// the bytes it lost, a line at the cap is not.
func TestLogWriter(t *testing.T) {
	var out bytes.Buffer
	w := LogWriter(&out)
	in := "title \x1b]0;pwned\x07 \r\tbell\xff C1 \u009b\nnext line é\n"
	if n, err := w.Write([]byte(in)); n != len(in) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if want := `title \x1b]0;pwned\a \r\tbell\xff C1 \u009b` + "\nnext line é\n"; out.String() != want {
		t.Fatalf("got  %q\nwant %q", out.String(), want)
	}
	for _, c := range []struct {
		line string
		cut  bool
	}{
		{strings.Repeat("a", MaxLogLine), false},
		{strings.Repeat("a", MaxLogLine+1), true},
		{strings.Repeat("\x1b", MaxLogLine/4), false}, // escaped, exactly the cap
		{strings.Repeat("\x1b", 1<<20), true},
		{strings.Repeat("é", MaxLogLine), true},
	} {
		out.Reset()
		w.Write([]byte(c.line + "\n"))
		got := out.String()
		noControl(t, got)
		if len(got) > MaxLogLine+1 || strings.Count(got, "\n") != 1 || strings.Contains(got, "more bytes)") != c.cut {
			t.Errorf("a line of %d bytes: %d written, cut %v: %.80q…%q", len(c.line), len(got), !c.cut, got, got[max(0, len(got)-40):])
		}
		if c.cut {
			// What was kept plus the count is the whole line.
			kept := strings.ReplaceAll(got[:strings.LastIndex(got, "…(")], `\x1b`, "\x1b")
			var n int
			if _, err := fmt.Sscanf(got[strings.LastIndex(got, "…(")+len("…("):], "%d", &n); err != nil || len(kept)+n != len(c.line) {
				t.Errorf("a line of %d bytes: %d kept and %d counted (%v)", len(c.line), len(kept), n, err)
			}
		}
	}
}

// TestNewLogger: every value (a string, an error, an address) is cut at
// MaxLogValue and quoted when it does not print; the line stays under
// the cap with several such values.
func TestNewLogger(t *testing.T) {
	var out bytes.Buffer
	log := NewLogger(&out, slog.LevelWarn)
	evil := strings.Repeat("\x1b[2J\x1b]0;pwned\x07", 1<<16)
	log.Info("not shown")
	log.Warn("te: a peer", "peer", &net.UnixAddr{Name: evil, Net: "unix"}, "name", evil, "err", errors.New("failed: "+evil), "n", 3)
	got := out.String()
	noControl(t, got)
	if len(got) > MaxLogLine+1 || strings.Count(got, "\n") != 1 || strings.Count(got, "more bytes)") != 3 || !strings.Contains(got, " n=3") || strings.Contains(got, "not shown") {
		t.Fatalf("%d bytes: %q", len(got), got)
	}
	out.Reset()
	log.Warn("short", "peer", "127.0.0.1:1", "err", errors.New("plain"))
	if want := `level=WARN msg=short peer=127.0.0.1:1 err=plain` + "\n"; !strings.HasSuffix(out.String(), want) {
		t.Fatalf("got %q, want a line ending %q", out.String(), want)
	}
}
