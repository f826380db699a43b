// Package cli holds te's command-line conventions, so every subcommand
// behaves alike: flags spelled --flag in help and errors, flags accepted
// before and after positional arguments, "did you mean" for typos, a short
// usage (not the whole help) after a mistake, -h printing the help on
// stdout and exiting 0, sizes written the way people write them, the build
// that made the binary, and one JSON envelope for every --json.
package cli

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ErrHelp is returned by Parse after it printed the help for -h or --help;
// the command exits 0.
var ErrHelp = flag.ErrHelp

// UsageError is a mistake on the command line: an unknown flag, a bad value,
// a missing argument. Its Error is one line that names the flag as --flag;
// the command exits 2 after printing it with Use.
type UsageError struct {
	Cmd string // "te bench"
	Use string // "te bench [flags]"
	Msg string
}

func (e *UsageError) Error() string { return e.Msg }

// Lines is what te prints for e: the message, then where to look.
func (e *UsageError) Lines() string {
	name := strings.TrimPrefix(e.Cmd, "te ")
	return fmt.Sprintf("%s: %s\nusage: %s  ('te help %s' lists the flags)\n", e.Cmd, e.Msg, e.Use, name)
}

// FlagSet is a flag.FlagSet with te's conventions. Define flags on the
// embedded set as usual; call Parse, not the embedded one.
type FlagSet struct {
	*flag.FlagSet
	cmd, use, about string
	help            io.Writer
	aliases         map[string]string // alias name -> flag it sets
	args            []string
}

// NewFlagSet returns a set for command cmd ("te bench"): use is the usage
// line ("te bench [flags]"), about the paragraph the help prints under it,
// help where -h prints (stdout).
func NewFlagSet(cmd, use, about string, help io.Writer) *FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Parse reports errors itself
	fs.Usage = func() {}
	return &FlagSet{FlagSet: fs, cmd: cmd, use: use, about: about, help: help, aliases: map[string]string{}}
}

// Cmd is the command's name, "te bench".
func (f *FlagSet) Cmd() string { return f.cmd }

// Alias makes each of names (another tool's spelling, say Mooncake's
// device_name, or a one-letter habit such as ibv_devinfo's -d) set the
// flag canonical. Help lists the aliases on one line.
// Spellings that differ from a flag only by '_' for '-' need no alias:
// Parse accepts them anyway.
func (f *FlagSet) Alias(canonical string, names ...string) {
	if f.Lookup(canonical) == nil {
		panic("cli: alias for undefined flag --" + canonical)
	}
	for _, n := range names {
		f.aliases[n] = canonical
	}
}

// Usagef returns a UsageError for this command.
func (f *FlagSet) Usagef(format string, a ...any) error {
	return &UsageError{Cmd: f.cmd, Use: f.use, Msg: fmt.Sprintf(format, a...)}
}

// Args are the positional arguments after Parse.
func (f *FlagSet) Args() []string { return f.args }

// NArg is len(Args()).
func (f *FlagSet) NArg() int { return len(f.args) }

// Arg is the i-th positional argument, or "".
func (f *FlagSet) Arg(i int) string {
	if i < 0 || i >= len(f.args) {
		return ""
	}
	return f.args[i]
}

// lookup finds the flag an argument names: the flag itself, an alias, or
// the flag with '_' written for '-'.
func (f *FlagSet) lookup(name string) *flag.Flag {
	if fl := f.Lookup(name); fl != nil {
		return fl
	}
	if c, ok := f.aliases[name]; ok {
		return f.Lookup(c)
	}
	if alt := strings.ReplaceAll(name, "_", "-"); alt != name {
		return f.lookup(alt)
	}
	return nil
}

type boolFlag interface{ IsBoolFlag() bool }

// Parse parses args: flags as --name value, --name=value, -name value or
// -name=value, anywhere among the positional arguments; "--" ends the
// flags. -h and --help (unless the command defines them) print the help on
// the help writer and return ErrHelp. Every other mistake is a UsageError.
func (f *FlagSet) Parse(args []string) error {
	f.args = f.args[:0]
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			f.args = append(f.args, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' || isNumber(a) {
			f.args = append(f.args, a)
			continue
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		value, hasValue := "", false
		if k, v, ok := strings.Cut(name, "="); ok {
			name, value, hasValue = k, v, true
		}
		if name == "" || strings.HasPrefix(name, "-") {
			return f.Usagef("%q is not a flag (flags are --name or --name=value)", a)
		}
		fl := f.lookup(name)
		if fl == nil {
			if name == "h" || name == "help" {
				f.PrintHelp(f.help)
				return ErrHelp
			}
			return f.unknown(name)
		}
		if b, ok := fl.Value.(boolFlag); ok && b.IsBoolFlag() {
			if !hasValue {
				value = "true"
			}
		} else if !hasValue {
			if i+1 >= len(args) {
				return f.Usagef("--%s needs a value%s", fl.Name, kindHint(fl))
			}
			i++
			value = args[i]
		}
		if err := f.Set(fl.Name, value); err != nil {
			return f.Usagef("--%s %s: %s", fl.Name, value, flagErr(fl, err))
		}
	}
	return nil
}

// isNumber says whether a (starting with '-') is a negative number, which
// is a positional argument, not a flag.
func isNumber(a string) bool {
	for _, r := range a[1:] {
		if (r < '0' || r > '9') && r != '.' {
			return false
		}
	}
	return true
}

func kindHint(fl *flag.Flag) string {
	if kind, _ := flag.UnquoteUsage(fl); kind != "" {
		return " (" + kind + ")"
	}
	return ""
}

// flagErr words the flag package's parse errors ("parse error", "value
// out of range") for the flag's kind; the values of this package and of
// te's commands say what they want themselves.
func flagErr(fl *flag.Flag, err error) string {
	kind, _ := flag.UnquoteUsage(fl)
	switch err.Error() {
	case "parse error":
		switch kind {
		case "":
			return "want true or false"
		case "int", "uint":
			return "not a whole number"
		case "float":
			return "not a number"
		case "duration":
			return "not a duration (examples: 500ms, 2s, 1m)"
		}
		return "not a valid " + kind
	case "value out of range":
		return "out of range"
	}
	return err.Error()
}

// unknown is the error for an undefined flag, with the nearest names.
func (f *FlagSet) unknown(name string) error {
	var names []string
	f.VisitAll(func(fl *flag.Flag) { names = append(names, fl.Name) })
	for a := range f.aliases {
		names = append(names, a)
	}
	msg := fmt.Sprintf("unknown flag --%s", name)
	if s := Suggest(name, names); len(s) > 0 {
		for i := range s {
			if c, ok := f.aliases[s[i]]; ok {
				s[i] = c
			}
			s[i] = "--" + s[i]
		}
		msg += "; did you mean " + orList(dedup(s)) + "?"
	}
	return f.Usagef("%s", msg)
}

func dedup(s []string) []string {
	var out []string
	for _, v := range s {
		found := false
		for _, o := range out {
			found = found || o == v
		}
		if !found {
			out = append(out, v)
		}
	}
	return out
}

func orList(s []string) string {
	switch len(s) {
	case 1:
		return s[0]
	case 2:
		return s[0] + " or " + s[1]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Suggest returns the names closest to a mistyped one: within an edit
// distance that grows with the name's length, or that it is a prefix of.
// At most three, nearest first.
func Suggest(typo string, names []string) []string {
	t := strings.ToLower(strings.ReplaceAll(typo, "_", "-"))
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	limit := max(1, min(3, len(t)/3))
	for _, n := range names {
		ln := strings.ToLower(strings.ReplaceAll(n, "_", "-"))
		d := distance(t, ln)
		switch {
		case d <= limit:
		case len(t) >= 3 && strings.HasPrefix(ln, t):
			d = limit + 1
		default:
			continue
		}
		cs = append(cs, cand{n, d})
	}
	// Insertion sort: a handful of candidates, stable by name order given.
	for i := 1; i < len(cs); i++ {
		for j := i; j > 0 && cs[j].d < cs[j-1].d; j-- {
			cs[j], cs[j-1] = cs[j-1], cs[j]
		}
	}
	var out []string
	for _, c := range cs {
		if len(out) == 3 {
			break
		}
		out = append(out, c.name)
	}
	return out
}

// distance is the Damerau–Levenshtein (optimal string alignment) distance
// between a and b, in bytes.
func distance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// PrintHelp writes the usage line, the about text and every flag as
// --name, with the aliases named on one line at the end.
func (f *FlagSet) PrintHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", f.use)
	if f.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(f.about, "\n"))
	}
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintf(w, "\nflags:\n")
	}
	f.VisitAll(func(fl *flag.Flag) {
		kind, usage := flag.UnquoteUsage(fl)
		line := "  --" + fl.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if d := fl.DefValue; d != "" && d != "false" && d != "0" {
			line += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintln(w, line)
	})
	if len(f.aliases) > 0 {
		byFlag := map[string][]string{}
		var order []string
		f.VisitAll(func(fl *flag.Flag) { order = append(order, fl.Name) })
		for a, c := range f.aliases {
			byFlag[c] = append(byFlag[c], a)
		}
		var parts []string
		for _, c := range order {
			as := byFlag[c]
			slices.Sort(as)
			for _, a := range as {
				dash := "--"
				if len(a) == 1 {
					dash = "-" // a tool's one-letter habit: -d, -v
				}
				parts = append(parts, dash+a+" (--"+c+")")
			}
		}
		fmt.Fprintf(w, "\nother spellings accepted: %s; and any flag with _ for -\n", strings.Join(parts, ", "))
	}
}
