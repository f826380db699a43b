// Package hostid says which kernel and network namespace this process runs
// in, so that two processes can tell for certain that they share a host:
// the same boot (the kernel's random boot id) and the same network
// namespace (where abstract unix socket names live). Containers on one
// kernel with separate network namespaces count as different hosts: they
// cannot reach each other's abstract sockets.
package hostid

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

var (
	once sync.Once
	id   string
	err  error
)

// ID returns "<boot id>/<netns inode>", the same for every process of one
// boot in one network namespace.
func ID() (string, error) {
	once.Do(func() {
		b, rerr := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if rerr != nil {
			err = fmt.Errorf("hostid: boot id: %w", rerr)
			return
		}
		ns, rerr := os.Readlink("/proc/self/ns/net")
		if rerr != nil {
			err = fmt.Errorf("hostid: network namespace: %w", rerr)
			return
		}
		// ns reads "net:[4026531840]".
		ns = strings.TrimSuffix(strings.TrimPrefix(ns, "net:["), "]")
		id = strings.TrimSpace(string(b)) + "/" + ns
	})
	return id, err
}
