package consul

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// process identifies a store's process well enough for a successor on the
// same machine to prove it gone. It is written into the session's name:
//
//	te segment store host=<hostname> boot=<boot id> pidns=<pid namespace> pid=<pid> start=<start ticks>
//
// A crashed owner's key otherwise stays held until its session's TTL runs
// out (TTL..2×TTL), and a process restarted under the same name in that
// window got segment.ErrConflict. With this, the restarted process sees
// that the holder ran on the same boot of the same kernel, in its own PID
// namespace, and that /proc no longer has that PID (or has a zombie, or
// another process that started at a different time): nothing alive can
// renew that session, so it is destroyed at once and the key taken over.
// Anything less certain (another machine or boot, another PID namespace,
// a name written by something else, /proc unreadable) keeps the conflict.
type process struct {
	host, boot, pidns string
	pid               int
	start             uint64 // clock ticks after boot (/proc/<pid>/stat field 22)
}

const sessionNamePrefix = "te segment store"

// self describes this process; fields it cannot read stay empty, and an
// empty boot or pidns never proves anything gone.
func self() process {
	p := process{pid: os.Getpid()}
	p.host, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		p.boot = strings.TrimSpace(string(b))
	}
	p.pidns, _ = os.Readlink("/proc/self/ns/pid")
	if st, _, ok := procStat(p.pid); ok {
		p.start = st
	}
	return p
}

func (p process) sessionName() string {
	return fmt.Sprintf("%s host=%s boot=%s pidns=%s pid=%d start=%d", sessionNamePrefix,
		field(p.host), field(p.boot), field(p.pidns), p.pid, p.start)
}

// field keeps a value one space-free token.
func field(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// parseSessionName reads a name written by sessionName.
func parseSessionName(name string) (process, bool) {
	rest, ok := strings.CutPrefix(name, sessionNamePrefix+" ")
	if !ok {
		return process{}, false
	}
	var p process
	seen := 0
	for _, kv := range strings.Fields(rest) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return process{}, false
		}
		var err error
		switch k {
		case "host":
			p.host = v
		case "boot":
			p.boot = v
		case "pidns":
			p.pidns = v
		case "pid":
			p.pid, err = strconv.Atoi(v)
		case "start":
			p.start, err = strconv.ParseUint(v, 10, 64)
		default:
			continue
		}
		if err != nil {
			return process{}, false
		}
		seen++
	}
	return p, seen == 5 && p.pid > 0
}

// provesGone reports whether other, described by a session name, is
// certainly not running: it ran on this boot of this machine's kernel, in
// this PID namespace, and its PID is free, a zombie, or another process.
func (me process) provesGone(other process) bool {
	if me.boot == "" || me.boot == "-" || me.pidns == "" || me.pidns == "-" ||
		other.boot != me.boot || other.pidns != me.pidns || other.pid <= 0 || other.start == 0 {
		return false
	}
	if other.pid == me.pid {
		return other.start != me.start
	}
	start, zombie, ok := procStat(other.pid)
	if !ok {
		// Unreadable: gone only when the PID has no /proc entry at all.
		_, err := os.Stat("/proc/" + strconv.Itoa(other.pid))
		return os.IsNotExist(err)
	}
	return zombie || start != other.start
}

// procStat reads the start time and zombie state of pid from
// /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func procStat(pid int) (start uint64, zombie, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return 0, false, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64) // field 22
	if err != nil {
		return 0, false, false
	}
	return start, f[0] == "Z" || f[0] == "X", true
}
