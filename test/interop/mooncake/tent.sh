#!/bin/bash
# test/interop/mooncake/tent.sh - te's shm transport beside Mooncake TENT's
# (kvcache-ai/Mooncake's new engine, its tebench --backend=tent
# --xport_type=shm) on this host. Outside CI, like run.sh: Mooncake's source
# is on no package registry.
#
#   test/interop/mooncake/tent.sh build SRC_DIR BUILD_DIR
#       builds Mooncake's transfer engine with TENT (Release, CPU only,
#       -DUSE_TENT=ON) and its tebench only. SRC_DIR is a checkout as in
#       run.sh (tested: commit 777cc778 with its submodules). yalantinglibs'
#       headers are installed into BUILD_DIR/deps, unless YLT_PREFIX names
#       such an install already (run.sh build's BUILD_DIR/deps):
#         cmake -S SRC/extern/yalantinglibs -B BUILD/ylt -DCMAKE_INSTALL_PREFIX=BUILD/deps \
#           -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF
#         cmake --install BUILD/ylt
#         cmake -S SRC/mooncake-transfer-engine -B BUILD/tent -DCMAKE_BUILD_TYPE=Release \
#           -DCMAKE_PREFIX_PATH=BUILD/deps -DUSE_TENT=ON -DBUILD_BENCHMARK=ON \
#           -DBUILD_UNIT_TESTS=OFF -DBUILD_EXAMPLES=OFF -DUSE_HTTP=ON -DUSE_TCP=ON \
#           -DPYTHON_EXECUTABLE=/usr/bin/python3 -DPython3_EXECUTABLE=/usr/bin/python3
#         nice -n 10 cmake --build BUILD/tent -j2 --target tebench
#       (about 30 min on 2 shared cores). The Debian packages are run.sh's;
#       TENT's optional liburing and hiredis are not needed.
#   test/interop/mooncake/tent.sh BUILD_DIR [REPS] [SECONDS]
#       the table (default 3 rounds of 3 s per cell). BUILD_DIR is the
#       directory above, or the tent build directory itself. With
#       TE_BASE=PATH (a te binary, say built from main before a change)
#       its te bench runs in the same rounds too, against the same te
#       serve (this tree's), as "te base", so a change's ratios stand
#       side by side.
#
# Both sides run as two processes, a target that registers the memory
# and an initiator that copies into it (TENT's shm transport, like te's,
# maps the target's memory and copies in the initiator): TENT's tebench
# target and initiator, te serve --protocol shm and te bench --protocol
# shm. Each cell (write and read; 4 KiB, 64 KiB and 1 MiB blocks) is a
# batch of 128 requests, one initiator thread; every round measures each
# cell once on both sides, in alternating order, so both see the same
# load. Both benches loop allocate a batch, submit, wait for all, free
# it, and count GB/s as 1e9 bytes per second of that loop (TENT after a
# 1 s warm-up). te bench also times a single-thread copy (Go's copy,
# which is runtime memmove) of the same blocks, taking turns with shm
# (te bench gets 2×SECONDS: shm and memcpy share it).
# The measurement holds /tmp/te-quiet.lock (flock), so two quiet
# measurements never overlap. Medians (min-max) in GB/s; the ratios are
# of the medians, with the range of the per-round ratios.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)

if [ "${1:-}" = build ]; then
	[ $# -eq 3 ] || { echo "usage: $0 build SRC_DIR BUILD_DIR" >&2; exit 2; }
	src=$(cd "$2" && pwd)
	mkdir -p "$3"
	b=$(cd "$3" && pwd)
	[ -f "$src/mooncake-transfer-engine/tent/CMakeLists.txt" ] || { echo "$src is not a Mooncake checkout with TENT" >&2; exit 2; }
	deps=${YLT_PREFIX:-}
	if [ -z "$deps" ]; then
		[ -f "$src/extern/yalantinglibs/CMakeLists.txt" ] || { echo "$src/extern/yalantinglibs is empty: git submodule update --init extern/yalantinglibs extern/pybind11" >&2; exit 2; }
		deps=$b/deps
		cmake -S "$src/extern/yalantinglibs" -B "$b/ylt" -DCMAKE_INSTALL_PREFIX="$deps" \
			-DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF
		cmake --install "$b/ylt"
	fi
	cmake -S "$src/mooncake-transfer-engine" -B "$b/tent" -DCMAKE_BUILD_TYPE=Release \
		-DCMAKE_PREFIX_PATH="$deps" -DUSE_TENT=ON -DBUILD_BENCHMARK=ON \
		-DBUILD_UNIT_TESTS=OFF -DBUILD_EXAMPLES=OFF -DUSE_HTTP=ON -DUSE_TCP=ON \
		-DPYTHON_EXECUTABLE=/usr/bin/python3 -DPython3_EXECUTABLE=/usr/bin/python3
	nice -n 10 cmake --build "$b/tent" -j2 --target tebench
	exit 0
fi

[ $# -ge 1 ] || { sed -n '2,25p' "$0" >&2; exit 2; }
b=$(cd "$1" && pwd)
reps=${2:-3}
secs=${3:-3}
tb=$b
[ -x "$tb/benchmark/tebench" ] || tb=$b/tent
tebench=$tb/benchmark/tebench
[ -x "$tebench" ] || { echo "no $tebench: run $0 build SRC_DIR BUILD_DIR first" >&2; exit 2; }
# tebench's RPATH points at an install tree; in the build tree asio is here.
export LD_LIBRARY_PATH=$tb/mooncake-common${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

work=$(mktemp -d /tmp/te-tent.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

(cd "$root" && go build -o "$work/te" ./cmd/te)
te=$work/te
tebase=${TE_BASE:-}
if [ -n "$tebase" ]; then
	[ -x "$tebase" ] || { echo "TE_BASE=$tebase is not an executable te" >&2; exit 2; }
fi
batch=128
blocks=(4096 65536 1048576)
buf=$((batch * 1048576))

# waitfor FILE PATTERN: the first match of PATTERN (sed -E, one group) in
# FILE, within 60 s.
waitfor() {
	local v
	for _ in $(seq 600); do
		v=$(sed -nE "s/$2/\\1/p" "$1" | head -1)
		[ -n "$v" ] && { echo "$v"; return 0; }
		sleep 0.1
	done
	echo "no match for $2 in $1:" >&2
	cat "$1" >&2
	return 1
}

exec 9>/tmp/te-quiet.lock
echo "waiting for /tmp/te-quiet.lock" >&2
flock 9

# Targets: one each, serving every cell (the memory is touched once,
# in the first round).
(cd "$work" && exec "$tebench" --backend=tent --xport_type=shm --total_buffer_size=$buf) >"$work/tent-target.log" 2>&1 &
pids+=($!)
(exec "$te" serve --protocol shm --buffer-size $buf) >"$work/te-target.log" 2>&1 &
pids+=($!)
tseg=$(waitfor "$work/tent-target.log" '.*--target_seg_name=([^ ]+).*')
seg=$(waitfor "$work/te-target.log" '^segment ([^ ]+)$')

tent() { # op block -> GB/s
	(cd "$work" && "$tebench" --backend=tent --xport_type=shm --target_seg_name="$tseg" \
		--total_buffer_size=$buf --op_type="$1" --start_block_size="$2" --max_block_size="$2" \
		--start_batch_size=$batch --max_batch_size=$batch --start_num_threads=1 --max_num_threads=1 \
		--duration="$secs") >"$work/tent.log" 2>&1 || { cat "$work/tent.log" >&2; return 1; }
	awk -v blk="$2" '$1 == blk && $2 == '$batch' { print $3; found = 1 } END { exit !found }' "$work/tent.log" ||
		{ echo "no result in TENT's output:" >&2; cat "$work/tent.log" >&2; return 1; }
}
tebench_te() { # op block [te] -> "shm_GB/s memcpy_GB/s"
	"${3:-$te}" bench --segment "$seg" --protocol shm --operation "$1" --block-size "$2" --batch-size $batch \
		--threads 1 --duration "$((2 * secs))s" --quiet >"$work/te.log" 2>&1 || { cat "$work/te.log" >&2; return 1; }
	local s m
	s=$(sed -nE 's/^result: .* over shm: ([0-9.]+) GB\/s.*/\1/p' "$work/te.log")
	m=$(sed -nE 's/^memcpy: .*: ([0-9.]+) GB\/s.*/\1/p' "$work/te.log")
	[ -n "$s" ] && [ -n "$m" ] || { echo "no result in te bench's output:" >&2; cat "$work/te.log" >&2; return 1; }
	echo "$s $m"
}

te_rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
mc_src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$tb/CMakeCache.txt" 2>/dev/null || true)
echo "te $te_rev; TENT $tebench (source ${mc_src:-unknown}); $(nproc) CPUs"
echo "start $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
res=$work/results
: >"$res"
for r in $(seq "$reps"); do
	for op in write read; do
		for blk in "${blocks[@]}"; do
			sb=0
			if [ $((r % 2)) -eq 1 ]; then
				t=$(tent $op $blk)
				sm=$(tebench_te $op $blk)
				[ -z "$tebase" ] || read -r sb _ <<<"$(tebench_te $op $blk "$tebase")"
			else
				[ -z "$tebase" ] || read -r sb _ <<<"$(tebench_te $op $blk "$tebase")"
				sm=$(tebench_te $op $blk)
				t=$(tent $op $blk)
			fi
			read -r s m <<<"$sm"
			echo "$op $blk $t $s $m $sb" >>"$res"
			printf 'round %d/%d  %-5s %7d B  TENT %6.2f  te %6.2f  memcpy %6.2f%s GB/s\n' "$r" "$reps" "$op" "$blk" "$t" "$s" "$m" \
				"$([ -z "$tebase" ] || printf '  te base %6.2f' "$sb")" >&2
		done
	done
done
echo "end $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
if [ -n "$tebase" ]; then
	echo "te base: $tebase"
	echo "| op | block | TENT shm | te shm | memcpy (1 thread) | te / TENT | te / memcpy | te base shm | te base / TENT |"
	echo "|---|---|---|---|---|---|---|---|---|"
else
	echo "| op | block | TENT shm | te shm | memcpy (1 thread) | te / TENT | te / memcpy |"
	echo "|---|---|---|---|---|---|---|"
fi
for op in write read; do
	for blk in "${blocks[@]}"; do
		awk -v op=$op -v blk=$blk -v base="$tebase" '
		function med(a, n,   i, j, t) {
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function cell(a, n,   lo, hi, i) {
			lo = hi = a[1]
			for (i = 2; i <= n; i++) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
			return sprintf("%.2f (%.2f–%.2f)", med(a, n), lo, hi)
		}
		$1 == op && $2 == blk { n++; t[n] = $3; s[n] = $4; m[n] = $5; rt[n] = $4 / $3; rm[n] = $4 / $5; sb[n] = $6; rb[n] = $6 / $3 }
		END {
			if (n == 0) exit 1
			name = blk >= 1048576 ? blk / 1048576 " MiB" : blk / 1024 " KiB"
			ct = cell(t, n); cs = cell(s, n); cm = cell(m, n); mt = med(t, n); ms = med(s, n); mm = med(m, n)
			lt = ht = rt[1]; lm = hm = rm[1]
			for (i = 2; i <= n; i++) {
				if (rt[i] < lt) lt = rt[i]; if (rt[i] > ht) ht = rt[i]
				if (rm[i] < lm) lm = rm[i]; if (rm[i] > hm) hm = rm[i]
			}
			printf "| %s | %s | %s | %s | %s | %.2f× (%.2f–%.2f) | %.2f× (%.2f–%.2f) |", op, name, ct, cs, cm, ms / mt, lt, ht, ms / mm, lm, hm
			if (base != "") {
				cb = cell(sb, n); mb = med(sb, n); lb = hb = rb[1]
				for (i = 2; i <= n; i++) { if (rb[i] < lb) lb = rb[i]; if (rb[i] > hb) hb = rb[i] }
				printf " %s | %.2f× (%.2f–%.2f) |", cb, mb / mt, lb, hb
			}
			printf "\n"
		}' "$res"
	done
done
