package main

import (
	"strings"
	"testing"
)

// TestMooncakeWireCLI: te serve --protocol mooncake publishes through
// Mooncake's P2PHANDSHAKE socket and serves Mooncake's TCP wire; te bench
// and te segments reach it the same way, and the bytes check out both
// ways. Mooncake's wire has no authentication, so a secret is refused.
func TestMooncakeWireCLI(t *testing.T) {
	meta := "p2phandshake://127.0.0.1:0"
	srv, name, srvErr := serveProcess(t, "--protocol", "mooncake", "--metadata", meta, "--buffer-size", "16MiB")
	for _, op := range []string{"write", "read"} {
		stdout, stderr, code := runTE(t, "bench", "--protocol", "mooncake", "--metadata", meta, "--segment", name,
			"--operation", op, "--block-size", "64KiB", "--batch-size", "16", "--duration", "1", "--verify", "--quiet")
		if code != 0 || !strings.Contains(stdout, "over mooncake") || !strings.Contains(stdout, "verify: true") {
			t.Fatalf("te bench %s over mooncake: exit %d\n%s\n%s", op, code, stdout, stderr)
		}
	}
	stdout, stderr, code := runTE(t, "segments", "--metadata", meta, name)
	if code != 0 || !strings.Contains(stdout, "mooncake=") {
		t.Fatalf("te segments over P2PHANDSHAKE: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if log := stopped(srv, srvErr); !strings.Contains(log, "te serve: mooncake on ") {
		t.Fatalf("te serve does not say it serves mooncake:\n%s", log)
	}
	_, stderr, code = runTE(t, "serve", "--protocol", "mooncake", "--auth-file", secretFile(t))
	if code == 0 || !strings.Contains(stderr, "Mooncake's wire has no authentication") {
		t.Fatalf("te serve --protocol mooncake --auth-file: exit %d\n%s", code, stderr)
	}
}

// TestMooncakeFlagCLI: --mooncake spells the same thing the way Mooncake
// users say it: te serve --mooncake is a target on Mooncake's handshake
// socket, and te bench --mooncake reaches it with Mooncake's metadata
// spelling (P2PHANDSHAKE) and its transfer_engine_bench flags, --protocol
// tcp meaning Mooncake's TCP wire; with --metadata http://… both go
// through Mooncake's HTTP metadata server instead. Another protocol is
// refused.
func TestMooncakeFlagCLI(t *testing.T) {
	srv, name, srvErr := serveProcess(t, "--mooncake", "--buffer-size", "16MiB")
	stdout, stderr, code := runTE(t, "bench", "--mooncake", "--metadata", "P2PHANDSHAKE", "--segment", name,
		"--block-size", "64KiB", "--batch-size", "8", "--duration", "1", "--verify", "--quiet")
	if code != 0 || !strings.Contains(stdout, "over mooncake") || !strings.Contains(stdout, "verify: true") {
		t.Fatalf("te bench --mooncake --metadata P2PHANDSHAKE: exit %d\n%s\n%s", code, stdout, stderr)
	}
	stdout, stderr, code = runTE(t, "bench", "--mooncake", "--mode=initiator", "--metadata_server=P2PHANDSHAKE", "--segment_id="+name,
		"--protocol=tcp", "--operation=read", "--block_size=4096", "--batch_size=4", "--duration=1", "--verify")
	if code != 0 || !strings.Contains(stdout, "over mooncake") || !strings.Contains(stdout, "verify: true") {
		t.Fatalf("te bench --mooncake with transfer_engine_bench's flags: exit %d\n%s\n%s", code, stdout, stderr)
	}
	stdout, stderr, code = runTE(t, "segments", "--mooncake", "--metadata", "P2PHANDSHAKE", name)
	if code != 0 || !strings.Contains(stdout, "mooncake=") {
		t.Fatalf("te segments --mooncake: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if log := stopped(srv, srvErr); !strings.Contains(log, "te serve: mooncake on ") || !strings.Contains(log, "p2phandshake://127.0.0.1:") {
		t.Fatalf("te serve --mooncake does not say it serves mooncake on the handshake socket:\n%s", log)
	}
	// Through a Mooncake HTTP metadata server (te metadata serve's): the
	// segment is named by --name, its data address is its rpc_meta.
	meta := startMetadata(t, "")
	srv, _, srvErr = serveProcess(t, "--mooncake", "--metadata", meta, "--name", "te-target", "--listen", "127.0.0.1:0", "--buffer-size", "16MiB")
	stdout, stderr, code = runTE(t, "bench", "--mooncake", "--metadata", meta, "--segment", "te-target",
		"--block-size", "1MiB", "--batch-size", "4", "--duration", "1", "--verify", "--quiet")
	if code != 0 || !strings.Contains(stdout, "over mooncake") || !strings.Contains(stdout, "verify: true") {
		t.Fatalf("te bench --mooncake --metadata %s: exit %d\n%s\n%s", meta, code, stdout, stderr)
	}
	stopped(srv, srvErr)
	for _, cmd := range []string{"serve", "bench"} {
		_, stderr, code = runTE(t, cmd, "--mooncake", "--protocol", "shm")
		if code != 2 || !strings.Contains(stderr, "--mooncake") || !strings.Contains(stderr, "not shm") {
			t.Errorf("te %s --mooncake --protocol shm: exit %d\n%s", cmd, code, stderr)
		}
	}
}
