package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int64
		unit string
	}{
		{"4096", 4096, ""}, {"7B", 7, ""}, {"7b", 7, ""},
		{"4KiB", 4 << 10, "KiB"}, {"4kib", 4 << 10, "KiB"}, {"64K", 64 << 10, "KiB"}, {"64k", 64 << 10, "KiB"},
		{"1MiB", 1 << 20, "MiB"}, {"256M", 256 << 20, "MiB"}, {"1.5MiB", 3 << 19, "MiB"}, {"1.5mib", 3 << 19, "MiB"},
		{"1GiB", 1 << 30, "GiB"}, {"1G", 1 << 30, "GiB"}, {"2TiB", 2 << 40, "TiB"}, {"1t", 1 << 40, "TiB"},
		{"64kb", 64000, "KB"}, {"64KB", 64000, "KB"}, {"1MB", 1e6, "MB"}, {"1GB", 1e9, "GB"}, {"1TB", 1e12, "TB"},
		{"0.5GB", 5e8, "GB"}, {"1.5 MiB", 3 << 19, "MiB"}, {".5K", 512, "KiB"}, {"1.0001KB", 1000, "KB"},
	} {
		n, u, err := ParseSize(c.in)
		if err != nil || n != c.n || u != c.unit {
			t.Errorf("ParseSize(%q) = %d, %q, %v; want %d, %q", c.in, n, u, err, c.n, c.unit)
		}
	}
	for _, bad := range []string{"", "x", "-1", "KiB", "1.2.3M", "99999999999999999G", "1e3", "1 furlong", "9EiB", "1e400"} {
		if n, _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, n)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{
		4096: "4KiB", 1 << 20: "1MiB", 3 << 19: "1536KiB", 1 << 30: "1GiB", 1e9: "1GB", 128e9: "128GB",
		64000: "64KB", 1000001: "1000001B", 0: "0B", 7: "7B", 1 << 40: "1TiB", 5e12: "5TB",
	} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
	// A size prints in the unit given, and so do counts derived from it.
	for _, c := range []struct{ in, self, times128 string }{
		{"1GB", "1GB", "128GB"}, {"1.5MiB", "1.5MiB", "192MiB"}, {"64kb", "64KB", "8.192MB"}, {"4096", "4KiB", "512KiB"},
		{"1.1KiB", "1.1KiB", "140.75KiB"}, {"4KiB", "4KiB", "512KiB"}, {"1.5GB", "1.5GB", "192GB"}, {"3KB", "3KB", "384KB"},
	} {
		var s Size
		if err := s.Set(c.in); err != nil {
			t.Fatal(err)
		}
		if got := s.String(); got != c.self {
			t.Errorf("Size(%q).String() = %q, want %q", c.in, got, c.self)
		}
		if got := s.Format(s.N * 128); got != c.times128 {
			t.Errorf("Size(%q).Format(×128) = %q, want %q", c.in, got, c.times128)
		}
	}
}

func newTestSet(help *bytes.Buffer) (*FlagSet, *Size, *bool, *int) {
	fs := NewFlagSet("te bench", "te bench [flags] [name ...]", "Measures things.", help)
	block := NewSize(64 << 10)
	fs.Var(block, "block-size", "`bytes` per request")
	j := fs.Bool("json", false, "print JSON")
	n := fs.Int("threads", 1, "threads")
	fs.Var(NewChoice("write", "read", "write"), "operation", "the `op`")
	fs.Alias("block-size", "bs")
	return fs, block, j, n
}

func TestParse(t *testing.T) {
	var help bytes.Buffer
	fs, block, j, n := newTestSet(&help)
	// Flags after positional arguments, one or two dashes, = or a space,
	// '_' for '-', an alias.
	if err := fs.Parse([]string{"a", "--json", "-threads=3", "b", "--block_size", "1GB", "--", "--c"}); err != nil {
		t.Fatal(err)
	}
	if !*j || *n != 3 || block.N != 1e9 || block.String() != "1GB" {
		t.Errorf("json %v threads %d block %v", *j, *n, block)
	}
	if got := strings.Join(fs.Args(), " "); got != "a b --c" {
		t.Errorf("args %q", got)
	}
	if err := fs.Parse([]string{"--bs=2K", "-5"}); err != nil || block.N != 2048 || fs.Arg(0) != "-5" {
		t.Errorf("alias: %v, %d, %q", err, block.N, fs.Args())
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--blok-size", "1"}, "unknown flag --blok-size; did you mean --block-size?"},
		{[]string{"--jsn"}, "unknown flag --jsn; did you mean --json?"},
		{[]string{"--thread", "2"}, "did you mean --threads?"},
		{[]string{"--b"}, "unknown flag --b"},
		{[]string{"--block-size"}, "--block-size needs a value (bytes)"},
		{[]string{"--block-size", "lots"}, "--block-size lots: not a size"},
		{[]string{"--threads", "x"}, "--threads x: not a whole number"},
		{[]string{"--json=maybe"}, "--json maybe: want true or false"},
		{[]string{"--operation", "copy"}, "--operation copy: not one of read, write"},
		{[]string{"---x"}, `"---x" is not a flag`},
	} {
		err := fs.Parse(c.args)
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(ue.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want a usage error with %q", c.args, err, c.want)
			continue
		}
		if strings.Contains(ue.Msg, " -block") || strings.Contains(ue.Msg, "\n") {
			t.Errorf("Parse(%q): %q spells a flag with one dash or spans lines", c.args, ue.Msg)
		}
		if l := ue.Lines(); strings.Count(l, "\n") != 2 || !strings.Contains(l, "te help bench") {
			t.Errorf("short usage:\n%s", l)
		}
	}

	for _, h := range []string{"-h", "--help", "-help"} {
		help.Reset()
		if err := fs.Parse([]string{"x", h}); !errors.Is(err, ErrHelp) {
			t.Errorf("Parse(%s) = %v, want ErrHelp", h, err)
		}
		out := help.String()
		for _, want := range []string{"usage: te bench [flags] [name ...]", "Measures things.", "  --block-size bytes", "(default 64KiB)", "--bs (--block-size)"} {
			if !strings.Contains(out, want) {
				t.Errorf("help lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "\n  -b") {
			t.Errorf("help spells a flag with one dash:\n%s", out)
		}
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"block-size", "batch-size", "buffer-size", "threads", "json", "duration", "metadata", "segment"}
	for typo, want := range map[string]string{
		"blocksize": "block-size", "block_szie": "block-size", "bach-size": "batch-size", "thread": "threads",
		"jsno": "json", "durration": "duration", "seg": "segment", "metdata": "metadata",
	} {
		if got := Suggest(typo, names); len(got) == 0 || got[0] != want {
			t.Errorf("Suggest(%q) = %v, want %s first", typo, got, want)
		}
	}
	if got := Suggest("zzzzzz", names); len(got) != 0 {
		t.Errorf("Suggest(zzzzzz) = %v", got)
	}
}

func TestValues(t *testing.T) {
	var l List
	l.OK = []string{"tcp", "shm", "rdma"}
	if err := l.Set("TCP, shm,tcp"); err != nil || l.String() != "tcp,shm" || !l.Given {
		t.Errorf("List = %v, %v", l.V, err)
	}
	if err := l.Set("udp"); err == nil || !strings.Contains(err.Error(), "udp is not one of tcp, shm, rdma") {
		t.Errorf("List(udp) = %v", err)
	}
	var names List
	if err := names.Set("rxe0,,rxe1"); err == nil {
		t.Error("empty item accepted")
	}
	c := NewChoice("GB", "GB", "GiB", "Gb")
	for in, want := range map[string]string{"gib": "GiB", "Gb": "Gb", "GB": "GB"} {
		if err := c.Set(in); err != nil || c.V != want {
			t.Errorf("Choice(%q) = %q, %v", in, c.V, err)
		}
	}
	var d Seconds
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "0.5": 500 * time.Millisecond, "250ms": 250 * time.Millisecond} {
		if err := d.Set(in); err != nil || d.D != want {
			t.Errorf("Seconds(%q) = %v, %v", in, d.D, err)
		}
	}
	for _, bad := range []string{"NaN", "-3", "Inf", "0", "soon", "-1s", "2e6"} {
		if err := d.Set(bad); err == nil {
			t.Errorf("Seconds(%q) accepted", bad)
		}
	}
}

func TestReport(t *testing.T) {
	fs, _, _, _ := newTestSet(new(bytes.Buffer))
	if err := fs.Parse([]string{"--block-size", "1GB", "--json"}); err != nil {
		t.Fatal(err)
	}
	type row struct {
		N int `json:"n"`
	}
	r := NewReport[row](fs)
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	got, err := ParseReport(b.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Command != "bench" || len(got.Results) != 0 || got.Flags["block_size"] != float64(1e9) || got.Flags["json"] != true || got.Flags["operation"] != "write" {
		t.Errorf("report %+v", got)
	}
	if _, ok := got.Flags["bs"]; ok {
		t.Error("an alias is listed among the flags")
	}
	r.Results = []row{{1}, {2}}
	b.Reset()
	r.Write(&b)
	if got, err := ParseReport(b.Bytes()); err != nil || len(got.Results) != 2 {
		t.Errorf("%v %v", got, err)
	}
	var m map[string]any
	json.Unmarshal(b.Bytes(), &m)
	m["extra"] = 1
	bad, _ := json.Marshal(m)
	if _, err := ParseReport(bad); err == nil || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Errorf("extra field: %v", err)
	}
	delete(m, "extra")
	delete(m, "host")
	bad, _ = json.Marshal(m)
	if _, err := ParseReport(bad); err == nil {
		t.Error("missing host accepted")
	}
	if _, err := ParseReport([]byte(`[{"n":1}]`)); err == nil {
		t.Error("a bare array accepted")
	}
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                  "plain",
		"a\x1b[2Jb":              `a\x1b[2Jb`,
		"tab\there":              `tab\there`,
		"ünïcode":                "ünïcode",
		"bad\xffutf8":            `bad\xffutf8`,
		"new\nline":              `new\nline`,
		strings.Repeat("x", 300): strings.Repeat("x", 256) + "…(44 more bytes)",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestErrorLine(t *testing.T) {
	for in, want := range map[string]string{
		"dial: dial: connection refused":                         "dial: connection refused",
		"open: handshake: handshake: refused: auth: wrong proof": "open: handshake: refused: auth: wrong proof",
		"a: b: c: b: c": "a: b: c",
		"engine: unknown segment: segment: not found: 10.0.0.1: segment: not found: p2p: bad name": "engine: unknown segment: segment: not found: 10.0.0.1: p2p: bad name",
		"peer said \x1b[31mhi": `peer said \x1b[31mhi`,
		"one\ntwo":             "one; two",
	} {
		if got := ErrorLine(errors.New(in)); got != want {
			t.Errorf("ErrorLine(%q) = %q, want %q", in, got, want)
		}
	}
	if got := ErrorLine(errors.New(strings.Repeat("y", 2000))); len(got) > MaxErrorLine+40 || !strings.Contains(got, "more bytes") {
		t.Errorf("long error: %d bytes", len(got))
	}
}

func TestReadBuild(t *testing.T) {
	b := ReadBuild()
	if b.Version == "" || !strings.HasPrefix(b.Go, "go") || b.Platform == "" || b.Short() == "" {
		t.Errorf("%+v", b)
	}
	if s := b.String(); !strings.HasPrefix(s, "te ") || !strings.Contains(s, "go ") {
		t.Errorf("%s", s)
	}
}

var _ flag.Getter = (*Size)(nil)
var _ flag.Getter = (*Choice)(nil)
var _ flag.Getter = (*List)(nil)
var _ flag.Getter = (*Seconds)(nil)

func TestNetCause(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = net.Dial("tcp", addr)
	if got := NetCause(fmt.Errorf("open segment: %w", err)); got != "refused" {
		t.Errorf("NetCause(%v) = %q", err, got)
	}
	ln, _ = net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err = c.Read(make([]byte, 1))
	if got := NetCause(err); got != "timeout" {
		t.Errorf("NetCause(%v) = %q", err, got)
	}
	if got := NetCause(errors.New("other")); got != "" {
		t.Errorf("NetCause(other) = %q", got)
	}
}

// TestStages: a setup past the threshold prints its stage, then "done"
// when it succeeded and "failed" when it did not (the error follows from
// the caller); a quick one prints nothing.
func TestStages(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{{nil, "done"}, {errors.New("no"), "failed"}} {
		var out bytes.Buffer
		s := NewStages(&out, "te x", 10*time.Millisecond)
		s.Stage("opening segment h:1")
		time.Sleep(50 * time.Millisecond)
		s.End(c.err)
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		if len(lines) != 2 || !strings.HasSuffix(lines[0], ": opening segment h:1 ...") || !strings.HasPrefix(lines[1], "te x: setup ") || !strings.HasSuffix(lines[1], ": "+c.want) {
			t.Errorf("End(%v) printed:\n%s\nwant the stage, then %q", c.err, out.String(), c.want)
		}
	}
	var out bytes.Buffer
	s := NewStages(&out, "te x", time.Minute)
	s.Stage("allocating")
	s.End(errors.New("no"))
	s.Done()
	if out.Len() != 0 {
		t.Errorf("a quick setup printed %q", out.String())
	}
}
