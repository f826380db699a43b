// Package testenv holds the one policy every environment-dependent test
// follows: a test whose prerequisites are missing skips loudly on a
// developer's machine and fails under CI=true, where .ci/deps installs
// them. Only tests and test harnesses import it.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// CI reports whether the tests run under CI (CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable fails the test under CI and skips it loudly elsewhere.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("CI=true, but %s", msg)
		return
	}
	t.Skipf("SKIP (not CI): %s", msg)
}

// GCC returns the path of gcc after checking that the given files (C
// headers the test compiles against) exist; otherwise it calls
// Unavailable, naming the packages that provide them.
func GCC(t testing.TB, packages string, files ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	for _, f := range files {
		if err != nil {
			break
		}
		_, err = os.Stat(f)
	}
	if err != nil {
		Unavailable(t, "gcc and %v are needed (apt-get install -y --no-install-recommends %s): %v", files, packages, err)
	}
	return gcc
}

// RunAs makes cmd run as the given user and group (the caller must be
// root): tests of what another user may do.
func RunAs(cmd *exec.Cmd, uid, gid uint32) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
}
