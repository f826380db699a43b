#!/bin/bash
# test/softroce/bench.sh - `te perf` next to perftest (ib_write_bw, ib_write_lat, ...)
# on the same rxe devices in one Soft-RoCE guest run; prints both numbers and the
# ratio te/perftest (BENCH lines). Benchmark output only: it fails when a tool fails,
# never on a number. Knobs: BENCH_N (iterations, default 1000), BENCH_RUNS (default 3),
# BENCH_ONLY (a shell pattern on row names, e.g. 'write_lat*'; default every row),
# plus run.sh's SR_* (e.g. SR_MTU=9000). The summary is also written to
# ${SR_OUT:-$SR_CACHE/bench}/bench.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export SR_OUT=${SR_OUT:-${SR_CACHE:-${HOME:-/tmp}/.cache/te-softroce}/bench}
# the payload reads BENCH_* from its own copy of this file
mkdir -p "${TMPDIR:-/tmp}"
P=$(mktemp -d "${TMPDIR:-/tmp}/te-bench.XXXXXX")
cp "$HERE/perf/run.sh" "$P/run.sh"
# Diagnostic build for the write-latency tail: te with the Go runtime's sysmon
# thread woken every 200 ms instead of every 10 ms while a goroutine runs (the
# runtime's proc.go patched through go build -overlay; GOROOT is not touched).
# Its row next to te's and perftest's shows how much of te's p99 that thread
# causes (README, "Write latency"). Skipped when sysmon's loop has changed.
src=$(go env GOROOT)/src/runtime/proc.go
O=$(mktemp -d "${TMPDIR:-/tmp}/te-bench-ovl.XXXXXX")
trap 'rm -rf "$P" "$O"' EXIT
if [ "$(grep -c '^		usleep(delay)$' "$src")" = 1 ]; then
	sed 's|^\t\tusleep(delay)$|\t\tdelay = 200 * 1000 // te bench.sh diagnostic: sysmon at 5 Hz\n\t\tusleep(delay)|' "$src" > "$O/proc.go"
	printf '{"Replace":{"%s":"%s"}}\n' "$src" "$O/proc.go" > "$O/overlay.json"
	(cd "$HERE/../.." && CGO_ENABLED=0 go build -overlay "$O/overlay.json" -o "$P/te-sysmon5hz" ./cmd/te) ||
		echo "bench.sh: diagnostic te-sysmon5hz build failed; its row is skipped" >&2
else
	echo "bench.sh: runtime sysmon loop not recognized in $src; the sysmon-5Hz row is skipped" >&2
fi
cp "$HERE/perf/engine.sh" "$P/engine.sh"
sed -i "2i BENCH_N=${BENCH_N:-1000} BENCH_RUNS=${BENCH_RUNS:-3} BENCH_ONLY='${BENCH_ONLY:-*}'" "$P/run.sh"
SR_PAYLOAD=$P SR_TEST_ARGS="${SR_TEST_ARGS:--test.run TestDevices}" "$HERE/run.sh" "$@"
