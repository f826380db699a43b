package ebpf

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestUnprivileged: without privileges Open fails clearly and the TCP
// transport still moves data. As root it runs itself again as user
// nobody, with no capabilities.
func TestUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		unprivileged(t)
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// nobody cannot enter the go build cache: run a copy it can read.
	dir, err := os.MkdirTemp("", "te-ebpf-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "ebpf.test")
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err == nil {
		_, err = io.Copy(dst, src)
		dst.Close()
	}
	src.Close()
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestUnprivileged$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("as nobody:\n%s", out.String())
	if err != nil {
		t.Fatalf("unprivileged child: %v", err)
	}
	if !strings.Contains(out.String(), "--- PASS: TestUnprivileged") || !strings.Contains(out.String(), "Open: ebpf: tracing needs root") {
		t.Fatal("the unprivileged child did not pass")
	}
}

func unprivileged(t *testing.T) {
	tr, err := Open(Filter{})
	if err == nil {
		tr.Close()
		t.Fatalf("Open as uid %d succeeded", os.Geteuid())
	}
	if !errors.Is(err, ErrPermission) || !strings.Contains(err.Error(), "needs root") {
		t.Fatalf("Open as uid %d: %v; want ErrPermission saying root is needed", os.Geteuid(), err)
	}
	t.Logf("Open: %v", err)
	// The engine keeps working untraced, and TCP_INFO still counts.
	p := newLanePair(t, 16<<20)
	src := p.ini.Mem.Bytes()
	for i := range src {
		src[i] = byte(i * 7)
	}
	if err := p.ini.Engine.Transfer(context.Background(), p.writes()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, p.tgt.Mem.Bytes()) {
		t.Fatal("data differs after the transfer")
	}
	var acked uint64
	for _, l := range p.iniTr.Lanes() {
		acked += l.Info.BytesAcked
	}
	if acked < uint64(len(src)) {
		t.Fatalf("TCP_INFO: %d bytes acknowledged over the lanes, %d written", acked, len(src))
	}
}
