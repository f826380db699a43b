// Package regfile reads small files that a user names (a secret, a
// token) without letting the name make the reader block or swallow memory:
// the file is opened with O_NONBLOCK, so a FIFO or a device whose open
// would wait for a writer returns at once, then checked with fstat on the
// open descriptor (no window between check and read) to be a regular
// file no larger than the caller's bound.
package regfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Errors; compare with errors.Is.
var (
	// ErrNotRegular: the path names a FIFO, socket, device or directory.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge: the file holds more bytes than the caller allows.
	ErrTooLarge = errors.New("file too large")
)

// Read returns the contents of the regular file at path, which must hold
// at most limit bytes, and its FileInfo (from the same descriptor). It
// never blocks on a FIFO or device: those fail with ErrNotRegular. Files
// whose size fstat does not know (those of /proc) are read up to limit+1
// bytes and refused with ErrTooLarge past limit.
func Read(path string, limit int64) ([]byte, fs.FileInfo, error) {
	if path == "" {
		return nil, nil, &fs.PathError{Op: "open", Path: path, Err: fs.ErrNotExist}
	}
	// O_NONBLOCK: an open of a FIFO for reading returns at once instead
	// of waiting for a writer; reads of regular files ignore it.
	// O_NOCTTY: a terminal device named here does not become ours.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fi, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w (%s)", ErrNotRegular, kind(fi.Mode()))}
	}
	if fi.Size() > limit {
		return nil, fi, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: %d bytes, at most %d allowed", ErrTooLarge, fi.Size(), limit)}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		clear(b)
		return nil, fi, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(b)) > limit {
		clear(b)
		return nil, fi, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)}
	}
	return b, fi, nil
}

// kind names a non-regular file's type for an error message.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return m.Type().String()
}
