package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release, when a release build sets it:
// go build -ldflags "-X github.com/rdmago/te/internal/cli.version=v1.2.3".
var version string

// commit is the commit, for builds without the toolchain's VCS stamp
// (-buildvcs=false, a git worktree): the Makefile sets it with
// -X github.com/rdmago/te/internal/cli.commit=$(git rev-parse HEAD).
var commit string

// Build says which build this binary is, from what the Go toolchain
// records in it (debug.ReadBuildInfo): the module version, the commit it
// was built from and whether the tree had changes, the Go version and the
// build flags.
type Build struct {
	Version    string   `json:"version"`
	Commit     string   `json:"commit,omitempty"`
	CommitTime string   `json:"commit_time,omitempty"`
	Modified   bool     `json:"modified,omitempty"`
	Go         string   `json:"go"`
	Platform   string   `json:"platform"`
	Flags      []string `json:"build_flags,omitempty"`
}

// ReadBuild reads the running binary's build information.
func ReadBuild() Build {
	b := Build{Version: version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if b.Version == "" {
			b.Version = "devel"
		}
		b.Commit = commit
		return b
	}
	if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			b.CommitTime = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		case "GOOS", "GOARCH", "vcs":
		default:
			b.Flags = append(b.Flags, s.Key+"="+s.Value)
		}
	}
	if b.Commit == "" {
		b.Commit = commit
	}
	return b
}

// Short is the version with the commit: what --json reports as te_version.
func (b Build) Short() string {
	s := b.Version
	if c := b.Commit; c != "" && !strings.Contains(s, c[:min(12, len(c))]) {
		s += "+" + c[:min(12, len(c))]
	}
	if b.Modified && !strings.Contains(s, "dirty") {
		s += "-dirty"
	}
	return s
}

// String is what te version prints.
func (b Build) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "te %s\n", b.Version)
	if b.Commit != "" {
		mod := ""
		if b.Modified {
			mod = " (with uncommitted changes)"
		}
		fmt.Fprintf(&sb, "commit  %s%s", b.Commit, mod)
		if b.CommitTime != "" {
			fmt.Fprintf(&sb, ", %s", b.CommitTime)
		}
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "go      %s %s\n", b.Go, b.Platform)
	if len(b.Flags) > 0 {
		fmt.Fprintf(&sb, "build   %s\n", strings.Join(b.Flags, " "))
	}
	return sb.String()
}
