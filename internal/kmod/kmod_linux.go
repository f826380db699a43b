package kmod

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/rdmago/te/internal/unix"
)

// moduleInitCompressedFile asks the kernel to decompress the file itself
// (MODULE_INIT_COMPRESSED_FILE, linux/module.h; kernels with
// CONFIG_MODULE_DECOMPRESS).
const moduleInitCompressedFile = 4

func release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// finitModule loads one module file. A module that is already loaded
// (EEXIST) is success.
func finitModule(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags := 0
	if !strings.HasSuffix(path, ".ko") {
		flags = moduleInitCompressedFile
	}
	err = unix.FinitModule(fd, "", flags)
	switch {
	case err == nil, errors.Is(err, unix.EEXIST):
		return nil
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w (loading modules needs root: CAP_SYS_MODULE)", err)
	case flags != 0 && errors.Is(err, unix.EOPNOTSUPP), flags != 0 && errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%w (a compressed module the kernel cannot unpack itself: install kmod and use modprobe)", err)
	}
	return err
}

func lookModprobe() (string, error) {
	if p, err := exec.LookPath("modprobe"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/modprobe", "/sbin/modprobe"} {
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func runModprobe(modprobe, name string) error {
	out, err := exec.Command(modprobe, name).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if unix.Geteuid() != 0 {
			msg += " (loading modules needs root)"
		}
		return fmt.Errorf("kmod: %s %s: %w: %s", modprobe, name, err, msg)
	}
	return nil
}
