package cli

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Choice is a flag that takes one of a fixed set of words, in any case.
type Choice struct {
	V  string
	OK []string
}

// NewChoice is a Choice with default def among ok.
func NewChoice(def string, ok ...string) *Choice { return &Choice{V: def, OK: ok} }

func (c *Choice) Set(v string) error {
	// Case matters only where two choices differ by case alone (GB, Gb).
	for _, o := range c.OK {
		if o == v {
			c.V = o
			return nil
		}
	}
	for _, o := range c.OK {
		if strings.EqualFold(v, o) {
			c.V = o
			return nil
		}
	}
	return fmt.Errorf("not one of %s", strings.Join(c.OK, ", "))
}

func (c *Choice) String() string {
	if c == nil {
		return ""
	}
	return c.V
}

func (c *Choice) Get() any { return c.V }

// List is a flag holding a comma-separated list. With OK set, each item
// must be one of those words (in any case, kept lower-case) and repeats are
// dropped; without, any non-empty names are taken as written.
type List struct {
	V     []string
	OK    []string
	Given bool // set on the command line (not the default)
}

func (l *List) Set(v string) error {
	var out []string
	for _, w := range strings.Split(v, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			return fmt.Errorf("empty item in the list")
		}
		if l.OK != nil {
			w = strings.ToLower(w)
			if !slices.Contains(l.OK, w) {
				return fmt.Errorf("%s is not one of %s (or a comma-separated list of them)", Printable(w), strings.Join(l.OK, ", "))
			}
			if slices.Contains(out, w) {
				continue
			}
		}
		out = append(out, w)
	}
	l.V, l.Given = out, true
	return nil
}

func (l *List) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.V, ",")
}

func (l *List) Get() any {
	if l.V == nil {
		return []string{}
	}
	return l.V
}

// Seconds is a duration flag written as a number of seconds (Mooncake's
// and perftest's --duration=10, also 0.5) or as a Go duration (500ms, 2s).
type Seconds struct {
	D   time.Duration
	Max time.Duration // 0: 1e6 s
}

func (d *Seconds) Set(v string) error {
	limit := d.Max
	if limit == 0 {
		limit = 1e6 * time.Second
	}
	var t time.Duration
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		// Written so that NaN fails too (every comparison with it is false).
		if !(n > 0 && n <= limit.Seconds()) {
			return fmt.Errorf("want a positive number of seconds, at most %v", limit)
		}
		t = time.Duration(n * float64(time.Second))
	} else {
		var err error
		t, err = time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("not a duration (examples: 5, 5s, 500ms)")
		}
		if t <= 0 || t > limit {
			return fmt.Errorf("want a positive duration, at most %v", limit)
		}
	}
	d.D = t
	return nil
}

func (d *Seconds) String() string {
	if d == nil {
		return ""
	}
	return d.D.String()
}

// Get is the duration in seconds (for the JSON envelope).
func (d *Seconds) Get() any { return d.D.Seconds() }
