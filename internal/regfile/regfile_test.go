package regfile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, fi, err := Read(p, 5)
	if err != nil || string(b) != "hello" || fi.Size() != 5 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("Read = %q, %v, %v", b, fi, err)
	}
	if _, _, err := Read(p, 4); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), p) {
		t.Fatalf("over the limit: %v", err)
	}
	if _, _, err := Read(filepath.Join(dir, "none"), 5); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
	if _, _, err := Read("", 5); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("empty path: %v", err)
	}
	if _, _, err := Read(dir, 5); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("directory: %v", err)
	}
	// A file whose size fstat does not report is still bounded.
	if _, _, err := Read("/proc/self/maps", 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("/proc/self/maps with a 4-byte limit: %v", err)
	}
}

// A FIFO, a device and a socket fail at once: the open of a FIFO with
// no writer would block forever without O_NONBLOCK.
func TestReadNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo:        "a FIFO",
		link:        "a FIFO",
		"/dev/null": "a character device",
		"/dev/zero": "a character device",
		sock:        "", // open(2) of a socket fails with ENXIO
	} {
		done := make(chan error, 1)
		go func() {
			_, _, err := Read(path, 1<<20)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || (want != "" && (!errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), want))) {
				t.Errorf("Read(%s) = %v, want an error naming %q", path, err, want)
			}
		case <-time.After(time.Second):
			t.Fatalf("Read(%s) still blocked after 1 s", path)
		}
	}
}
