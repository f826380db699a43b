package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmago/te/auth"
)

// sizeFlag is a byte count written as 4096, 64K, 64KiB, 1M, 1MiB, 1G or
// 1GiB (binary multiples), or 1KB, 1MB, 1GB (decimal ones).
type sizeFlag int64

var sizeSuffixes = []struct {
	s string
	m int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30},
	{"B", 1},
}

func parseSize(v string) (int64, error) {
	num, mult := v, int64(1)
	for _, s := range sizeSuffixes {
		if n, ok := strings.CutSuffix(v, s.s); ok {
			num, mult = n, s.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size (examples: 4096, 64KiB, 1MiB, 256M)", v)
	}
	return n * mult, nil
}

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func (s *sizeFlag) String() string { return formatSize(int64(*s)) }

// formatSize writes n with the largest binary unit that divides it.
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// secondsFlag is a duration written as whole seconds (Mooncake's
// --duration=10) or as a Go duration (500ms, 2s).
type secondsFlag time.Duration

func (d *secondsFlag) Set(v string) error {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		// Written so that NaN fails too (every comparison with it is false).
		if !(n > 0 && n <= 1e6) {
			return fmt.Errorf("%q: duration must be a positive number of seconds, at most 1e6", v)
		}
		*d = secondsFlag(n * float64(time.Second))
		return nil
	}
	t, err := time.ParseDuration(v)
	if err != nil || t <= 0 {
		return fmt.Errorf("%q is not a duration (examples: 5, 5s, 500ms)", v)
	}
	*d = secondsFlag(t)
	return nil
}

func (d *secondsFlag) String() string { return time.Duration(*d).String() }

// choiceFlag accepts one of a fixed set of words.
type choiceFlag struct {
	v  string
	ok []string
}

func (c *choiceFlag) Set(v string) error {
	for _, o := range c.ok {
		if strings.EqualFold(v, o) {
			c.v = o
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", v, strings.Join(c.ok, ", "))
}

func (c *choiceFlag) String() string {
	if c == nil {
		return ""
	}
	return c.v
}

// protocolsFlag accepts one transport or a comma-separated list (tcp,shm).
type protocolsFlag struct {
	v   []string
	ok  []string
	set bool
}

func (p *protocolsFlag) Set(v string) error {
	var out []string
	for _, w := range strings.Split(v, ",") {
		w = strings.ToLower(strings.TrimSpace(w))
		if !slices.Contains(p.ok, w) {
			return fmt.Errorf("%q is not one of %s (or a comma-separated list of them)", w, strings.Join(p.ok, ", "))
		}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	p.v, p.set = out, true
	return nil
}

func (p *protocolsFlag) String() string {
	if p == nil {
		return ""
	}
	return strings.Join(p.v, ",")
}

// reportUnits are Mooncake's --report_unit choices: bytes (or bits, for
// the lower-case b) per second in that unit.
var reportUnits = map[string]float64{
	"GB": 1e9, "GiB": 1 << 30, "Gb": 1e9 / 8,
	"MB": 1e6, "MiB": 1 << 20, "Mb": 1e6 / 8,
	"KB": 1e3, "KiB": 1 << 10, "Kb": 1e3 / 8,
}

// aliasUsage marks the usage text of alias flags, so printFlags can leave
// them out of the listing.
const aliasUsage = "alias for --"

// alias makes --old (Mooncake's spelling, e.g. block_size) set the same
// value as --name.
func alias(fs *flag.FlagSet, name, old string) {
	f := fs.Lookup(name)
	fs.Var(f.Value, old, aliasUsage+name)
}

// printFlags lists fs's flags like flag.PrintDefaults, with two dashes and
// without the aliases, which it names on one line at the end.
func printFlags(fs *flag.FlagSet) {
	w := fs.Output()
	var aliases []string
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, aliasUsage) {
			aliases = append(aliases, "--"+f.Name)
			return
		}
		kind, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if d := f.DefValue; d != "" && d != "false" && d != "0" {
			line += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintln(w, line)
	})
	if len(aliases) > 0 {
		fmt.Fprintf(w, "\nMooncake's spellings are accepted too: %s\n", strings.Join(aliases, ", "))
	}
}

// defaultMetadata is the --metadata default of every command: $TE_METADATA,
// else the embedded store.
func defaultMetadata() string {
	if v := os.Getenv("TE_METADATA"); v != "" {
		return v
	}
	return "p2p"
}

// metadataURI maps Mooncake's spellings of the embedded store to ours.
func metadataURI(v string) string {
	switch strings.ToLower(v) {
	case "", "p2p", "p2phandshake", "p2p://":
		return "p2p://127.0.0.1:0"
	}
	return v
}

// authFlag adds --auth-file to fs: the cluster secret's file, default
// $TE_AUTH_FILE (blank means unset, as in auth.FromEnv). A blank
// --auth-file is an error: leaving the flag out turns authentication off.
func authFlag(fs *flag.FlagSet) *string {
	p := auth.EnvPath()
	fs.Var(authFileFlag{&p}, "auth-file", "`file` holding the cluster secret (mode 0600, at least 16 bytes): peers must prove they hold it (default $"+auth.EnvFile+"; unset: no authentication)")
	return &p
}

// authFileFlag refuses a blank file name, which would otherwise silently
// mean no authentication.
type authFileFlag struct{ p *string }

func (f authFileFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("blank file name: name the secret file, or leave the flag out to run without authentication")
	}
	*f.p = v
	return nil
}

func (f authFileFlag) String() string {
	if f.p == nil {
		return ""
	}
	return *f.p
}

// listFlag is a comma-separated list of names.
type listFlag struct{ v []string }

func (l *listFlag) Set(v string) error {
	l.v = nil
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n == "" {
			return fmt.Errorf("empty name in %q", v)
		}
		l.v = append(l.v, n)
	}
	return nil
}

func (l *listFlag) String() string { return strings.Join(l.v, ",") }
