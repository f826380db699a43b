package cli

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"unicode/utf8"
)

// MaxLogValue is how many bytes of one value (a string, an error, a
// Stringer such as an address) a log line of NewLogger keeps.
const MaxLogValue = 512

// MaxLogLine caps a line LogWriter writes.
const MaxLogLine = 4096

// NewLogger returns te's logger on w: text records at level and above.
// A value past MaxLogValue bytes is cut with a count (a peer's name, a
// store's key, an error quoting either), the handler quotes what does
// not print, and every line goes through LogWriter: whatever a peer or a
// store chose reaches no terminal raw and no line runs past the cap.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(w), &slog.HandlerOptions{Level: level, ReplaceAttr: capValue}))
}

func capValue(_ []string, a slog.Attr) slog.Attr {
	var s string
	switch v := a.Value; v.Kind() {
	case slog.KindString:
		s = v.String()
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			s = x.Error()
		case fmt.Stringer:
			s = x.String()
		default:
			return a
		}
	default:
		return a
	}
	if s, cut := cutAt(s, MaxLogValue); cut > 0 {
		a.Value = slog.StringValue(s + "…(" + strconv.Itoa(cut) + " more bytes)")
	}
	return a
}

// LogWriter returns a writer of log lines to w (one Write per record or
// line, as slog's handlers and package log write them): control
// characters other than newline, and bytes that are not UTF-8, are
// escaped as Go escapes them, and a line past MaxLogLine bytes is cut
// with a count of what was cut. Safe for concurrent use.
func LogWriter(w io.Writer) io.Writer { return &logWriter{w: w} }

type logWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	l.buf = l.buf[:0]
	for len(p) > 0 {
		line, rest, nl := bytes.Cut(p, []byte{'\n'})
		p = rest
		l.buf = appendLogLine(l.buf, line)
		if nl {
			l.buf = append(l.buf, '\n')
		}
	}
	if _, err := l.w.Write(l.buf); err != nil {
		return 0, err
	}
	return n, nil
}

// appendLogLine appends line to b escaped and capped (see LogWriter).
func appendLogLine(b, line []byte) []byte {
	const room = MaxLogLine - len("…( more bytes)") - 20
	start := len(b)
	mark, markAt := -1, 0 // where a cut line ends: in b, in line
	for j := 0; j < len(line); {
		if mark < 0 && len(b)-start > room {
			mark, markAt = len(b), j
		}
		r, size := utf8.DecodeRune(line[j:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = fmt.Appendf(b, `\x%02x`, line[j])
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			q := strconv.QuoteRune(r)
			b = append(b, q[1:len(q)-1]...)
		default:
			b = append(b, line[j:j+size]...)
		}
		j += size
		if mark >= 0 && len(b)-start > MaxLogLine {
			return fmt.Appendf(b[:mark], "…(%d more bytes)", len(line)-markAt)
		}
	}
	return b
}
