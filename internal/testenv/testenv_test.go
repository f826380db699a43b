package testenv

import (
	"testing"
)

// fakeTB records how a helper ended the test, without ending this one.
type fakeTB struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, format
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, format
}

func TestUnavailable(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		f := &fakeTB{TB: t}
		Unavailable(f, "thing missing")
		if f.failed != (ci == "true") || f.skipped != (ci != "true") {
			t.Errorf("CI=%q: failed=%v skipped=%v", ci, f.failed, f.skipped)
		}
	}
}

func TestGCCMissingFile(t *testing.T) {
	t.Setenv("CI", "")
	f := &fakeTB{TB: t}
	GCC(f, "nothing", "/nonexistent/header.h")
	if !f.skipped {
		t.Fatal("a missing header did not make the test skip")
	}
}
