package ucmd

import "syscall"

// Errnos the verbs layer returns or tests for. They are syscall.Errno
// values, so errors.Is matches them against syscall's own; uverbs uses
// these names so that only internal/ imports syscall.
const (
	EINVAL          = syscall.EINVAL
	ENOMEM          = syscall.ENOMEM
	ENOTTY          = syscall.ENOTTY
	EPROTONOSUPPORT = syscall.EPROTONOSUPPORT
)
