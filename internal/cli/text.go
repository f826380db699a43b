package cli

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxPrintable is how many bytes of a foreign string Printable keeps.
const MaxPrintable = 256

// Printable makes a string that came from elsewhere (a peer's descriptor,
// a store, a user's argument) safe to print in an error or a table:
// control characters, invalid UTF-8 and other non-printing runes are
// escaped as Go escapes them, and past MaxPrintable bytes the rest is cut,
// with a count of what was cut.
func Printable(s string) string {
	s, cut := cutAt(s, MaxPrintable)
	if strings.IndexFunc(s, func(r rune) bool { return r == utf8.RuneError || !strconv.IsPrint(r) }) >= 0 {
		q := strconv.Quote(s)
		s = q[1 : len(q)-1]
	}
	if cut > 0 {
		s += "…(" + strconv.Itoa(cut) + " more bytes)"
	}
	return s
}

// MaxErrorLine caps the length of an error ErrorLine prints.
const MaxErrorLine = 1024

// ErrorLine is err as one printable line: wrapped errors that repeat a
// link of the chain ("dial: dial: refused") say it once, control
// characters (from peers' strings) are escaped, and a very long message
// is cut with a count.
func ErrorLine(err error) string {
	if err == nil {
		return ""
	}
	s := dedupChain(err.Error())
	s = strings.ReplaceAll(s, "\n", "; ") // errors.Join
	s, cut := cutAt(s, MaxErrorLine)
	if cut > 0 {
		s += "…(" + strconv.Itoa(cut) + " more bytes)"
	}
	if strings.IndexFunc(s, func(r rune) bool { return r == utf8.RuneError || !strconv.IsPrint(r) }) >= 0 {
		q := strconv.Quote(s)
		s = q[1 : len(q)-1]
	}
	return s
}

// cutAt cuts s to at most n bytes at a rune's start and says how many
// bytes it cut.
func cutAt(s string, n int) (string, int) {
	if len(s) <= n {
		return s, 0
	}
	end := n
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end], len(s) - end
}

// dedupChain drops each link of an "a: b: c" chain that repeats an
// earlier one ("segment: not found: x: segment: not found: y" says
// "segment: not found" once), so wrapping layers that each name the same
// cause read as one line.
func dedupChain(s string) string {
	parts := strings.Split(s, ": ")
	out := parts[:0:0]
	for _, p := range parts {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ": ")
}
