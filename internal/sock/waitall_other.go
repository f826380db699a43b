//go:build !linux

package sock

import (
	"errors"
	"time"
)

// SetWaitBound: see waitall_linux.go.
func SetWaitBound(int, time.Duration) error { return errors.ErrUnsupported }

// ReadWaitFD: see waitall_linux.go.
func ReadWaitFD(int, []byte) (int, error) { return 0, errors.ErrUnsupported }
