#!/bin/bash
# test/softroce/bench.sh - `te perf` next to perftest (ib_write_bw, ib_write_lat, ...)
# on the same rxe devices in one Soft-RoCE guest run; prints both numbers and the
# ratio te/perftest (BENCH lines). Benchmark output only: it fails when a tool fails,
# never on a number. Knobs: BENCH_N (iterations, default 1000), BENCH_RUNS (default 3),
# plus run.sh's SR_* (e.g. SR_MTU=9000). The summary is also written to
# ${SR_OUT:-$SR_CACHE/bench}/bench.txt.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export SR_OUT=${SR_OUT:-${SR_CACHE:-${HOME:-/tmp}/.cache/te-softroce}/bench}
# the payload reads BENCH_* from its own copy of this file
mkdir -p "${TMPDIR:-/tmp}"
P=$(mktemp -d "${TMPDIR:-/tmp}/te-bench.XXXXXX")
trap 'rm -rf "$P"' EXIT
cp "$HERE/perf/run.sh" "$P/run.sh"
sed -i "2i BENCH_N=${BENCH_N:-1000} BENCH_RUNS=${BENCH_RUNS:-3}" "$P/run.sh"
SR_PAYLOAD=$P SR_TEST_ARGS="${SR_TEST_ARGS:--test.run TestDevices}" "$HERE/run.sh" "$@"
