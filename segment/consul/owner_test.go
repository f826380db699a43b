package consul

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestSessionNameRoundTrip(t *testing.T) {
	me := self()
	if me.boot == "" || me.pidns == "" || me.start == 0 {
		t.Fatalf("self() read no boot id, PID namespace or start time from /proc: %+v", me)
	}
	got, ok := parseSessionName(me.sessionName())
	if !ok || got != (process{host: field(me.host), boot: me.boot, pidns: me.pidns, pid: me.pid, start: me.start}) {
		t.Fatalf("parse(%q) = %+v, %v", me.sessionName(), got, ok)
	}
	for _, bad := range []string{
		"", "te segment store", "te segment store host=h boot=b pidns=n pid=1", // a field missing
		"te segment store host=h boot=b pidns=n pid=x start=1", "te segment store host=h boot=b pidns=n pid=0 start=1",
		"te segment store myhost pid 12", // the names of earlier versions
		"other host=h boot=b pidns=n pid=1 start=1",
	} {
		if p, ok := parseSessionName(bad); ok {
			t.Errorf("parse(%q) = %+v, want failure", bad, p)
		}
	}
}

// provesGone is only ever true for a process of this boot and PID
// namespace that no longer runs; real processes stand in for owners.
func TestProvesGone(t *testing.T) {
	me := self()
	if me.boot == "" || me.pidns == "" {
		t.Fatalf("no boot id or PID namespace in /proc: %+v", me)
	}
	start := func() (*exec.Cmd, process) {
		t.Helper()
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		st, _, ok := procStat(c.Process.Pid)
		if !ok {
			t.Fatal("no /proc stat for the child")
		}
		return c, process{host: me.host, boot: me.boot, pidns: me.pidns, pid: c.Process.Pid, start: st}
	}
	live, liveP := start()
	if me.provesGone(me) || me.provesGone(liveP) {
		t.Fatal("a live process proved gone")
	}
	other := liveP
	other.boot = "another-boot"
	live.Process.Kill()
	waitZombie(t, live.Process.Pid)
	if !me.provesGone(liveP) {
		t.Error("a zombie (killed, not reaped) did not prove gone")
	}
	if me.provesGone(other) {
		t.Error("a process of another boot (maybe another machine) proved gone")
	}
	live.Wait()
	if !me.provesGone(liveP) {
		t.Error("a reaped process did not prove gone")
	}
	ns := liveP
	ns.pidns = "pid:[1]"
	if me.provesGone(ns) {
		t.Error("a process of another PID namespace proved gone")
	}
	// The same PID, started at another time: a reused PID.
	_, p2 := start()
	p2.start++
	if !me.provesGone(p2) {
		t.Error("a reused PID (other start time) did not prove gone")
	}
	reuse := me
	reuse.start++
	if !me.provesGone(reuse) {
		t.Error("this PID with another start time did not prove gone")
	}
	blind := me
	blind.boot = ""
	if blind.provesGone(liveP) {
		t.Error("a process that cannot read its boot id proved something gone")
	}
}

func waitZombie(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, zombie, ok := procStat(pid); !ok || zombie {
			return
		}
	}
	t.Fatalf("pid %d never became a zombie", pid)
}

func TestProcStatOddCommandNames(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	dir := t.TempDir()
	exe := dir + "/a b) (c"
	if err := os.Symlink("/bin/sleep", exe); err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c.Process.Kill(); c.Wait() }()
	st, zombie, ok := procStat(c.Process.Pid)
	mine, _, _ := procStat(os.Getpid())
	if !ok || zombie || st == 0 || st < mine {
		t.Fatalf("procStat of %q: start %d (ours %d), zombie %v, ok %v", exe, st, mine, zombie, ok)
	}
}
