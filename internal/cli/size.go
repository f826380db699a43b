package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// A unit of size. The binary units (KiB, MiB, GiB, TiB) and their one-letter
// shorthands (K, M, G, T) are powers of 1024; KB, MB, GB and TB are powers
// of 1000, as the SI and disk makers have them.
type unit struct {
	name string // canonical spelling
	n    int64
}

// units, largest first.
var units = []unit{
	{"TiB", 1 << 40}, {"TB", 1e12}, {"GiB", 1 << 30}, {"GB", 1e9},
	{"MiB", 1 << 20}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3},
}

// unitOf maps a suffix, in any case, to its unit.
func unitOf(s string) (unit, bool) {
	switch strings.ToLower(s) {
	case "", "b":
		return unit{"", 1}, true
	case "k", "kib":
		return units[6], true
	case "m", "mib":
		return units[4], true
	case "g", "gib":
		return units[2], true
	case "t", "tib":
		return units[0], true
	case "kb":
		return units[7], true
	case "mb":
		return units[5], true
	case "gb":
		return units[3], true
	case "tb":
		return units[1], true
	}
	return unit{}, false
}

// ParseSize reads a byte count: a number, possibly with a fraction, and an
// optional unit in any case: B; K, KiB; M, MiB; G, GiB; T, TiB (powers of
// 1024); KB, MB, GB, TB (powers of 1000). A fraction of a byte rounds to
// the nearest byte. It returns the count and the unit as written
// canonically ("" for bytes).
func ParseSize(s string) (int64, string, error) {
	v := strings.TrimSpace(s)
	suf := suffixOf(v)
	num := v[:len(v)-len(suf)]
	suf = strings.TrimSpace(suf)
	if num == "" || num == "." || strings.Count(num, ".") > 1 || strings.Trim(num, "0123456789.") != "" {
		return 0, "", fmt.Errorf("not a size (examples: 4096, 64KiB, 1.5MiB, 256M, 1GB)")
	}
	u, ok := unitOf(suf)
	if !ok {
		return 0, "", fmt.Errorf("unknown unit %q (want B; K, KiB, M, MiB, G, GiB, T, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000)", suf)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/u.n {
			return 0, "", fmt.Errorf("too large (at most 8EiB)")
		}
		return n * u.n, u.name, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, "", fmt.Errorf("not a size (examples: 4096, 64KiB, 1.5MiB, 256M, 1GB)")
	}
	b := math.Round(f * float64(u.n))
	if b >= math.MaxInt64 {
		return 0, "", fmt.Errorf("too large (at most 8EiB)")
	}
	return int64(b), u.name, nil
}

// FormatSize writes n bytes in the largest unit, binary or decimal, that
// holds it a whole number of times (1GiB, 128GB, 1536KiB), else in bytes
// (1000001B).
func FormatSize(n int64) string {
	for _, u := range units {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// Size is a flag holding a byte count written as ParseSize reads it. It
// prints in the unit the user gave.
type Size struct {
	N    int64
	Unit string // as given; "" for bytes or an unset default
	text string // as given
}

// NewSize is a Size flag with default n, shown in the largest exact unit.
func NewSize(n int64) *Size { return &Size{N: n} }

func (s *Size) Set(v string) error {
	n, u, err := ParseSize(v)
	if err != nil {
		return err
	}
	s.N, s.Unit, s.text = n, u, strings.TrimSpace(v)
	if s.Unit != "" {
		// The number as written, the unit as we spell it: 1.5MiB, 64KB.
		s.text = strings.TrimSpace(s.text[:len(s.text)-len(suffixOf(s.text))]) + s.Unit
	}
	return nil
}

// String writes the size in the unit the user gave (1.5MiB, 1GB), else in
// the largest exact unit.
func (s *Size) String() string {
	if s == nil {
		return ""
	}
	if s.text != "" && s.Unit != "" {
		return s.text
	}
	return s.Format(s.N)
}

// suffixOf is the trailing non-numeric part of a size.
func suffixOf(v string) string {
	i := len(v)
	for i > 0 && (v[i-1] < '0' || v[i-1] > '9') && v[i-1] != '.' {
		i--
	}
	return v[i:]
}

// Format writes another count (a derived footprint) in the family of the
// unit s was given in (binary or decimal): the largest unit of it that
// holds n a whole number of times or with at most three decimals. 128
// blocks of 1GB are 128GB, 4096 blocks of 64KiB 256MiB.
func (s *Size) Format(n int64) string {
	if s == nil || s.Unit == "" {
		return FormatSize(n)
	}
	given, _ := unitOf(s.Unit)
	binary := strings.Contains(given.name, "i")
	for _, u := range units {
		if strings.Contains(u.name, "i") != binary || n < u.n {
			continue
		}
		if n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.name
		}
		f := strconv.FormatFloat(float64(n)/float64(u.n), 'f', -1, 64)
		if dot := strings.IndexByte(f, '.'); dot >= 0 && len(f)-dot <= 4 {
			return f + u.name
		}
	}
	return FormatSize(n)
}

// Get is the count in bytes (for the JSON envelope's flags).
func (s *Size) Get() any { return s.N }
