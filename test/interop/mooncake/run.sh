#!/bin/bash
# test/interop/mooncake/run.sh - te against the real Mooncake Transfer Engine
# (kvcache-ai/Mooncake, classic engine), over TCP on loopback, and over RDMA
# in the Soft-RoCE guest. Outside CI: Mooncake's source is on no package
# registry, so CI cannot build it.
#
#   test/interop/mooncake/run.sh build SRC_DIR BUILD_DIR
#       builds Mooncake's transfer engine only (Release, CPU only, TCP and
#       RDMA transports, HTTP and P2PHANDSHAKE metadata) and its
#       transfer_engine_bench (mccheck.cpp is compiled against it per run).
#   test/interop/mooncake/run.sh BUILD_DIR [REPS] [SECONDS]
#       the checks and the side-by-side table (default 3 reps of 5 s).
#   test/interop/mooncake/run.sh target BUILD_DIR [REPS] [SECONDS]
#       only the table's cells where Mooncake's bench initiates (against
#       Mooncake's target and te serve, default mode and pooled), with
#       te's target relative to Mooncake's: te's target, quickly. With
#       TE_BASE=PATH (a te binary, say built from main before a change)
#       its target runs in the same rounds too, as "te base", so a
#       change's ratios stand side by side. The targets' order in a
#       cell rotates each rep: give as many reps as targets (2, or 3
#       with TE_BASE) or a multiple, so that each has each place.
#   test/interop/mooncake/run.sh rdma BUILD_DIR [REPS] [SECONDS]
#       the same over RDMA, in test/softroce's guest (host A's rail 1
#       device to host B's): guest-rdma.sh runs there with Mooncake's bench, mccheck and
#       their shared libraries (the guest's own glibc and libibverbs with
#       its rxe provider; Debian 12 on both sides). SR_* knobs pass on to
#       test/softroce/run.sh (SR_KPKG, SR_MTU, SR_ACCEL...); the guest gets
#       SR_MEM=3072 unless set. Run against the build below on kernel 6.1
#       (docs/measurements.md has its table); te to te over the same wire in
#       CI's guest tier is mooncake/p2p's TestMooncakeWire and interop's
#       TestTeBenchMooncakeRDMA. Mooncake's ACK timeout is fixed at 14
#       (~67 ms), which on 6.1's rxe under TCG can trip rxe's retransmission
#       race (WRs completing with "remote invalid request") in Mooncake's
#       own QPs: a FAIL of a Mooncake initiator there says so in its log.
#
# Getting the source (tested: commit 777cc7782417b6e554cf7c2d53210d0d8f89f5cc,
# with its submodules at their pinned commits, yalantinglibs 7801bc9a and
# pybind11 58c382a8):
#   git clone https://github.com/kvcache-ai/Mooncake SRC_DIR
#   git -C SRC_DIR checkout 777cc7782417b6e554cf7c2d53210d0d8f89f5cc
#   git -C SRC_DIR submodule update --init extern/yalantinglibs extern/pybind11
# Debian 12 packages the build needs (root, once):
#   apt-get install -y --no-install-recommends cmake make g++ pkg-config \
#     libibverbs-dev libgoogle-glog-dev libgflags-dev libjsoncpp-dev \
#     libunwind-dev libnuma-dev libssl-dev libyaml-cpp-dev \
#     libcurl4-openssl-dev libasio-dev python3-dev
# `build` then runs, in BUILD_DIR:
#   cmake -S SRC/extern/yalantinglibs -B BUILD/ylt -DCMAKE_INSTALL_PREFIX=BUILD/deps \
#     -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF
#   cmake --install BUILD/ylt                      (headers only)
#   cmake -S SRC/mooncake-transfer-engine -B BUILD/mc -DCMAKE_BUILD_TYPE=Release \
#     -DCMAKE_PREFIX_PATH=BUILD/deps -DBUILD_UNIT_TESTS=OFF -DBUILD_BENCHMARK=OFF \
#     -DBUILD_EXAMPLES=ON -DUSE_HTTP=ON -DUSE_TCP=ON \
#     -DPYTHON_EXECUTABLE=/usr/bin/python3 -DPython3_EXECUTABLE=/usr/bin/python3
#   nice -n 10 cmake --build BUILD/mc -j2 --target transfer_engine_bench \
#     transfer_engine_bench_with_notify
#   (70 min here, on 2 cores shared with other work at load ~20). The
#   transfer engine's own CMakeLists is the entry point: the top-level one
#   needs mooncake-integration and the store, which the engine does not. A pyenv python3 on PATH breaks
#   pybind11's configure; hence the explicit /usr/bin/python3.
# mccheck.cpp is compiled with transfer_engine_bench's own compile and link
# lines from BUILD/mc (flags.make, link.txt), so it runs the same library.
#
# What the run shows, each line a PASS or FAIL (exit 1 on any FAIL):
#   - Mooncake's engine (mccheck) writes, reads back and compares 64 KiB and
#     1 MiB blocks against `te serve --mooncake` (P2PHANDSHAKE) and against
#     a te target published through `te metadata serve` (HTTP metadata);
#   - `te bench --mooncake --verify` does the same against Mooncake's
#     `transfer_engine_bench --mode=target`;
#   - Mooncake <-> Mooncake through `te metadata serve`: mccheck and the
#     bench against a bench target that found each other only there;
#   - notifications both ways: `te bench --mooncake --notify` against
#     Mooncake's transfer_engine_bench_with_notify target (its getNotifies
#     returns them), and that bench's initiator against `te serve --mooncake
#     --print-notifies`.
# Then the table: write and read, 64 KiB and 1 MiB, batch 128, 1 thread,
# SECONDS each, interleaved per cell and repeated REPS times (a fresh target
# per run): Mooncake bench -> Mooncake target (default mode, and with
# MC_TCP_ENABLE_CONNECTION_POOL=1 on both), Mooncake bench -> te serve (both
# modes), te bench -> Mooncake target, te bench -> te serve. Medians (min-max)
# in GB/s (1e9 B/s). A READ cell's target first takes a second of WRITEs
# to the blocks it serves (fill: Mooncake's bench target leaves its buffer
# untouched otherwise, and READs of untouched memory copy the zero page).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)

if [ "${1:-}" = build ]; then
	[ $# -eq 3 ] || { echo "usage: $0 build SRC_DIR BUILD_DIR" >&2; exit 2; }
	src=$(cd "$2" && pwd)
	mkdir -p "$3"
	b=$(cd "$3" && pwd)
	[ -f "$src/mooncake-transfer-engine/CMakeLists.txt" ] || { echo "$src is not a Mooncake checkout" >&2; exit 2; }
	[ -f "$src/extern/yalantinglibs/CMakeLists.txt" ] || { echo "$src/extern/yalantinglibs is empty: git submodule update --init extern/yalantinglibs extern/pybind11" >&2; exit 2; }
	cmake -S "$src/extern/yalantinglibs" -B "$b/ylt" -DCMAKE_INSTALL_PREFIX="$b/deps" \
		-DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF
	cmake --install "$b/ylt"
	cmake -S "$src/mooncake-transfer-engine" -B "$b/mc" -DCMAKE_BUILD_TYPE=Release \
		-DCMAKE_PREFIX_PATH="$b/deps" -DBUILD_UNIT_TESTS=OFF -DBUILD_BENCHMARK=OFF \
		-DBUILD_EXAMPLES=ON -DUSE_HTTP=ON -DUSE_TCP=ON \
		-DPYTHON_EXECUTABLE=/usr/bin/python3 -DPython3_EXECUTABLE=/usr/bin/python3
	nice -n 10 cmake --build "$b/mc" -j2 --target transfer_engine_bench transfer_engine_bench_with_notify
	exit 0
fi

[ $# -ge 1 ] || { sed -n '2,34p' "$0" >&2; exit 2; }
mode=tcp
if [ "$1" = rdma ] || [ "$1" = target ]; then
	mode=$1
	shift
	[ $# -ge 1 ] || { echo "usage: $0 $mode BUILD_DIR [REPS] [SECONDS]" >&2; exit 2; }
fi
b=$(cd "$1" && pwd)
reps=${2:-3}
secs=${3:-5}
mc=$b/mc
[ -d "$mc" ] || mc=$b # a bare transfer-engine build directory
bench=$mc/example/transfer_engine_bench
[ -x "$bench" ] || { echo "no $bench: run $0 build SRC_DIR BUILD_DIR first" >&2; exit 2; }

work=$(mktemp -d /tmp/te-mooncake.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# mccheck, with the bench's compile and link lines (run from the bench's
# directory, where link.txt's relative paths hold).
bd=$mc/example/CMakeFiles/transfer_engine_bench.dir
mccheck=$work/mccheck
[ "$mode" = target ] || (
	set -e
	cd "$mc/example"
	defs=$(sed -n 's/^CXX_DEFINES = //p' "$bd/flags.make")
	incs=$(sed -n 's/^CXX_INCLUDES = //p' "$bd/flags.make")
	flags=$(sed -n 's/^CXX_FLAGS = //p' "$bd/flags.make")
	eval "c++ $defs $incs $flags -c '$here/mccheck.cpp' -o '$work/mccheck.o'"
	link=$(cat "$bd/link.txt")
	case "$link" in *"CMakeFiles/transfer_engine_bench.dir/transfer_engine_bench.cpp.o"*"-o transfer_engine_bench "*) ;;
	*) echo "unexpected link line in $bd/link.txt: $link"; exit 1;;
	esac
	link=${link//CMakeFiles\/transfer_engine_bench.dir\/transfer_engine_bench.cpp.o/$work/mccheck.o}
	link=${link//-o transfer_engine_bench /-o $mccheck }
	eval "$link"
) >"$work/mccheck-build.log" 2>&1 || { cat "$work/mccheck-build.log"; echo "building mccheck failed" >&2; exit 1; }

if [ "$mode" = rdma ]; then
	# The guest payload: the two binaries, their shared libraries but
	# those the guest has (its loader, libc, libm, rdma-core's with its rxe
	# provider, libnl); glibc's compatibility stubs (libpthread, libdl,
	# librt) go along, since the guest's closure needs none of them,
	# the script, the run's knobs. test/softroce/run.sh builds te into the
	# guest itself.
	p=$work/payload
	mkdir -p "$p/bin" "$p/lib"
	bins=("$bench" "$mccheck")
	nb=$mc/example/transfer_engine_bench_with_notify
	[ -x "$nb" ] && bins+=("$nb")
	cp "${bins[@]}" "$p/bin/"
	ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r l; do
		case "$(basename "$l")" in
		ld-linux*|libc.so*|libm.so*|libibverbs.so*|librdmacm.so*|libnl-3.so*|libnl-route-3.so*) ;;
		*) cp -L "$l" "$p/lib/" ;;
		esac
	done
	if ldd "${bins[@]}" | grep -q 'not found'; then
		ldd "${bins[@]}" | grep 'not found' >&2
		echo "unresolved libraries" >&2
		exit 1
	fi
	cp "$here/guest-rdma.sh" "$p/run.sh"
	chmod 755 "$p/run.sh"
	echo "$reps" > "$p/REPS"
	echo "$secs" > "$p/SECONDS"
	echo "payload: $(du -sh "$p" | cut -f1) in $(ls "$p/lib" | wc -l) libraries" >&2
	SR_PAYLOAD=$p SR_MEM=${SR_MEM:-3072} SR_TIMEOUT=${SR_TIMEOUT:-$((600 + reps * 16 * (secs + 15)))} \
		bash "$root/test/softroce/run.sh" | tee "$work/guest.log"
	grep -q '^all checks passed' "$work/guest.log"
	exit $?
fi

# te, built from this tree.
(cd "$root" && CGO_ENABLED=0 go build -o "$work/te" ./cmd/te)
te=$work/te
tebase=${TE_BASE:-}
if [ -n "$tebase" ]; then
	[ "$mode" = target ] || { echo "TE_BASE is for $0 target" >&2; exit 2; }
	[ -x "$tebase" ] || { echo "TE_BASE=$tebase is not an executable te" >&2; exit 2; }
fi
export GLOG_logtostderr=1

fails=0
pass() { echo "PASS $*"; }
fail() {
	echo "FAIL $*"
	fails=$((fails + 1))
}

# med: the median (min-max) of the numbers on stdin.
med() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%s (%s-%s)", m, a[1], a[NR]}'; }

# waitfor FILE REGEX: the first match of REGEX in FILE (10 s at most).
waitfor() {
	local i m
	for i in $(seq 100); do
		if m=$(grep -m1 -oE "$2" "$1" 2>/dev/null); then
			echo "$m"
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# stop PID: SIGTERM, then wait.
stop() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# te_target LOG [ARGS]: starts te serve --mooncake; sets tpid and tseg.
te_target() {
	local log=$1
	shift
	"$te" serve --mooncake --buffer-size 256MiB "$@" >"$log.out" 2>"$log" &
	tpid=$!
	pids+=("$tpid")
	tseg=$(waitfor "$log.out" '^segment .*' | cut -d' ' -f2) || { cat "$log" >&2; return 1; }
}

# mc_target LOG [ENV...]: starts Mooncake's bench target (P2PHANDSHAKE
# unless MC_META is set); sets tpid and tseg.
mc_target() {
	local log=$1
	shift
	env "$@" "$bench" --mode=target --metadata_server="${MC_META:-P2PHANDSHAKE}" --protocol=tcp \
		--local_server_name="${MC_NAME:-127.0.0.1}" --buffer_size=268435456 >"$log" 2>&1 &
	tpid=$!
	pids+=("$tpid")
	local l
	l=$(waitfor "$log" 'listening on [^ ]+:[0-9]+') || { cat "$log" >&2; return 1; }
	if [ -n "${MC_META:-}" ]; then
		tseg=$MC_NAME
	else
		tseg=${l#listening on }
	fi
	sleep 1 # its buffers are registered after it listens
}

# mc_bench OP BLOCK SEG [ENV...]: Mooncake's initiator; prints GB/s.
mc_bench() {
	local op=$1 block=$2 seg=$3
	shift 3
	env "$@" "$bench" --mode=initiator --metadata_server="${MC_META:-P2PHANDSHAKE}" --protocol=tcp \
		--local_server_name=127.0.0.1 --segment_id="$seg" --operation="$op" --block_size="$block" \
		--batch_size=128 --threads=1 --duration="$secs" --buffer_size=268435456 --report_unit=GB \
		--report_precision=3 >"$work/bench.log" 2>&1 || { tail -5 "$work/bench.log" >&2; echo 0; return; }
	grep -oE 'throughput [0-9.]+ GB/s' "$work/bench.log" | tail -1 | awk '{print $2}' | grep . || echo 0
}

# fill OP BLOCK SEG [ENV...]: before a READ cell, Mooncake's initiator
# WRITEs the blocks the cell reads for a second, so that every target
# serves memory that holds data. Mooncake's bench target never touches its
# buffer: READs of it would copy the kernel's shared zero page (a 1 MiB
# READ cell took 32752 page faults there, 128 MiB in 4 KiB pages, and its
# kernel copies ran several times faster than from real memory), which no
# target holding a KV cache gets.
fill() {
	[ "$1" = read ] || return 0
	local op=$1 block=$2 seg=$3
	shift 3
	secs=1 mc_bench write "$block" "$seg" "$@" >/dev/null
}

# te_bench OP BLOCK SEG: te's initiator over Mooncake's wire; prints GB/s.
te_bench() {
	"$te" bench --mooncake --metadata "${TE_META:-P2PHANDSHAKE}" --segment "$3" --operation "$1" \
		--block-size "$2" --batch-size 128 --threads 1 --duration "$secs" --json --quiet >"$work/te.json" 2>"$work/te.log" ||
		{ tail -5 "$work/te.log" >&2; echo 0; return; }
	python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"][0]; print("%.3f" % r["gb_per_s"])' "$work/te.json"
}

if [ "$mode" = target ]; then
	echo "== Mooncake's initiator against Mooncake's target and te serve: TCP on loopback, batch 128, 1 thread, ${secs} s, $reps reps (load $(cut -d' ' -f1-3 /proc/loadavg))"
	declare -A res
	pool=MC_TCP_ENABLE_CONNECTION_POOL=1
	# The targets take a cell in turns, in an order that rotates by one
	# place each rep: a target's place moves its result (the third of
	# three ran 5-15% faster, docs/measurements.md), so with as many reps
	# as targets each has each place once.
	who=(mc te)
	[ -z "$tebase" ] || who+=(base)
	for rep in $(seq "$reps"); do
		order=()
		for i in "${!who[@]}"; do order+=("${who[$(((i + rep - 1) % ${#who[@]}))]}"); done
		for op in write read; do
			for block in 65536 1048576; do
				for p in "" "$pool"; do
					k="$op $block${p:+ pool}"
					for w in "${order[@]}"; do
						case $w in
						mc) mc_target "$work/t.log" $p ;;
						te) te_target "$work/t.log" ;;
						base) te=$tebase te_target "$work/t.log" ;;
						esac
						fill $op $block "$tseg" $p
						res["$k|$w"]+=" $(mc_bench $op $block "$tseg" $p)"
						stop "$tpid"
					done
				done
			done
		done
		echo "rep $rep done (order: ${order[*]})" >&2
	done
	echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
	med1() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
	ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0) printf "%.2f", b / a; else print "-"}'; }
	if [ -n "$tebase" ]; then
		echo "te base: $tebase"
		echo "| op | block | mode | Mooncake -> Mooncake | Mooncake -> te base | Mooncake -> te | te base / Mooncake | te / Mooncake |"
		echo "|---|---|---|---|---|---|---|---|"
	else
		echo "| op | block | mode | Mooncake -> Mooncake | Mooncake -> te | te / Mooncake |"
		echo "|---|---|---|---|---|---|"
	fi
	for op in write read; do
		for block in 65536 1048576; do
			for m in default pool; do
				k="$op $block"
				[ $m = default ] || k+=" pool"
				a=$(echo "${res[$k|mc]}" | med1)
				b=$(echo "${res[$k|te]}" | med1)
				row="| $op | $([ $block = 65536 ] && echo 64 KiB || echo 1 MiB) | $m | $(echo "${res[$k|mc]}" | med) |"
				if [ -n "$tebase" ]; then
					row+=" $(echo "${res[$k|base]}" | med) | $(echo "${res[$k|te]}" | med) | $(ratio "$a" "$(echo "${res[$k|base]}" | med1)") | $(ratio "$a" "$b") |"
				else
					row+=" $(echo "${res[$k|te]}" | med) | $(ratio "$a" "$b") |"
				fi
				echo "$row"
				case " ${res[$k|mc]} ${res[$k|te]} ${res[$k|base]:-} " in *" 0 "*) fail "a run failed: $k";; esac
			done
		done
	done
	[ "$fails" -eq 0 ]
	exit $?
fi

echo "== byte checks"
# 1. Mooncake's engine -> te serve --mooncake (P2PHANDSHAKE).
te_target "$work/te1.log"
for size in 65536 1048576; do
	if out=$("$mccheck" P2PHANDSHAKE 127.0.0.1 "$tseg" $size 64 tcp 2>"$work/mccheck.log"); then
		pass "Mooncake engine -> te serve --mooncake (P2PHANDSHAKE): $out"
	else
		fail "Mooncake engine -> te serve --mooncake, $size B: $(tail -3 "$work/mccheck.log")"
	fi
done
stop "$tpid"

# 2. te bench --mooncake --verify -> Mooncake's bench target.
mc_target "$work/mc1.log"
for op in write read; do
	for size in 64KiB 1MiB; do
		if "$te" bench --mooncake --metadata P2PHANDSHAKE --segment "$tseg" --operation $op --block-size $size \
			--batch-size 64 --duration 1 --verify --quiet >"$work/v.out" 2>&1 && grep -q 'verify: true' "$work/v.out"; then
			pass "te bench --mooncake --verify -> Mooncake target: $op $size ($(grep -oE '[0-9.]+ GB/s' "$work/v.out" | head -1))"
		else
			fail "te bench -> Mooncake target, $op $size: $(tail -3 "$work/v.out")"
		fi
	done
done
stop "$tpid"

# 3. HTTP metadata: te metadata serve, with Mooncake and te on both ends.
"$te" metadata serve --listen 127.0.0.1:0 >"$work/meta.out" 2>"$work/meta.log" &
mpid=$!
pids+=("$mpid")
meta=$(waitfor "$work/meta.out" 'http://[0-9.:]+/[a-z]*') || {
	cat "$work/meta.log" >&2
	exit 1
}
MC_META=$meta MC_NAME=mc_target mc_target "$work/mc2.log" MC_TCP_BIND_ADDRESS=127.0.0.1
for size in 65536 1048576; do
	if out=$(MC_TCP_BIND_ADDRESS=127.0.0.1 "$mccheck" "$meta" mc_check "$tseg" $size 64 tcp 2>"$work/mccheck.log"); then
		pass "Mooncake engine -> Mooncake target via te metadata serve ($meta): $out"
	else
		fail "Mooncake -> Mooncake via te metadata serve, $size B: $(tail -3 "$work/mccheck.log")"
	fi
done
r=$(MC_META=$meta MC_TCP_BIND_ADDRESS=127.0.0.1 mc_bench write 65536 "$tseg")
if [ "$r" != 0 ] && [ -n "$r" ]; then
	pass "Mooncake bench -> Mooncake bench target via te metadata serve: write 64 KiB $r GB/s"
else
	fail "Mooncake bench -> Mooncake target via te metadata serve"
fi
stop "$tpid"
te_target "$work/te2.log" --metadata "$meta" --name te_target --listen 127.0.0.1:0
for size in 65536 1048576; do
	if out=$(MC_TCP_BIND_ADDRESS=127.0.0.1 "$mccheck" "$meta" mc_check te_target $size 64 tcp 2>"$work/mccheck.log"); then
		pass "Mooncake engine -> te serve --mooncake via te metadata serve: $out"
	else
		fail "Mooncake engine -> te serve via te metadata serve, $size B: $(tail -3 "$work/mccheck.log")"
	fi
done
stop "$tpid"

# 4. Notifications, both ways, with Mooncake's transfer_engine_bench_with_notify.
nb=$mc/example/transfer_engine_bench_with_notify
if [ -x "$nb" ]; then
	"$nb" --mode=target --metadata_server=P2PHANDSHAKE --protocol=tcp --local_server_name=127.0.0.1 \
		--buffer_size=268435456 >"$work/nt.log" 2>&1 &
	tpid=$!
	pids+=("$tpid")
	l=$(waitfor "$work/nt.log" 'listening on [^ ]+:[0-9]+') && sleep 1
	"$te" bench --mooncake --metadata P2PHANDSHAKE --segment "${l#listening on }" --operation write --block-size 64KiB \
		--batch-size 16 --duration 1 --notify --quiet >"$work/nb.out" 2>&1 || true
	sleep 2
	stop "$tpid"
	n=$(grep -a -c '\] te-bench' "$work/nt.log" || true)
	if [ "${n:-0}" -gt 0 ]; then
		pass "te bench --mooncake --notify -> Mooncake's target: its getNotifies returned $n notes"
	else
		fail "te bench --notify -> Mooncake: no note arrived: $(tail -3 "$work/nb.out")"
	fi
	te_target "$work/te3.log" --print-notifies
	# Its initiator has been seen not to exit after --duration: bounded.
	timeout 30 "$nb" --mode=initiator --metadata_server=P2PHANDSHAKE --protocol=tcp --local_server_name=127.0.0.1 \
		--segment_id="$tseg" --operation=write --block_size=65536 --batch_size=16 --threads=1 --duration=1 \
		--buffer_size=268435456 >"$work/ni.log" 2>&1 || true
	sleep 1
	stop "$tpid"
	n=$(grep -c '^notify from mooncake@127.0.0.1 .* name "agent1" .* msg "notification' "$work/te3.log.out" || true)
	if [ "${n:-0}" -gt 0 ]; then
		pass "Mooncake's initiator (submitTransferWithNotify) -> te serve --mooncake --print-notifies: $n notes"
	else
		fail "Mooncake notify -> te serve: none printed: $(tail -3 "$work/ni.log")"
	fi
else
	echo "SKIP notifications: no $nb (build it: cmake --build BUILD/mc --target transfer_engine_bench_with_notify)"
fi

echo "== side by side: TCP on loopback, batch 128, 1 thread, ${secs} s, $reps reps (load $(cut -d' ' -f1-3 /proc/loadavg))"
declare -A res
pool=MC_TCP_ENABLE_CONNECTION_POOL=1
for rep in $(seq "$reps"); do
	for op in write read; do
		for block in 65536 1048576; do
			k="$op $block"
			mc_target "$work/t.log"
			fill $op $block "$tseg"
			res["$k|mc-mc"]+=" $(mc_bench $op $block "$tseg")"
			stop "$tpid"
			mc_target "$work/t.log" $pool
			fill $op $block "$tseg" $pool
			res["$k|mc-mc pool"]+=" $(mc_bench $op $block "$tseg" $pool)"
			stop "$tpid"
			te_target "$work/t.log"
			fill $op $block "$tseg"
			res["$k|mc-te"]+=" $(mc_bench $op $block "$tseg")"
			stop "$tpid"
			te_target "$work/t.log"
			fill $op $block "$tseg" $pool
			res["$k|mc-te pool"]+=" $(mc_bench $op $block "$tseg" $pool)"
			stop "$tpid"
			mc_target "$work/t.log"
			fill $op $block "$tseg"
			res["$k|te-mc"]+=" $(te_bench $op $block "$tseg")"
			stop "$tpid"
			te_target "$work/t.log"
			fill $op $block "$tseg"
			res["$k|te-te"]+=" $(te_bench $op $block "$tseg")"
			stop "$tpid"
			echo "rep $rep $k done" >&2
		done
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| op | block | Mooncake -> Mooncake | Mooncake -> Mooncake, pool | Mooncake -> te | Mooncake -> te, pool | te -> Mooncake | te -> te |"
echo "|---|---|---|---|---|---|---|---|"
for op in write read; do
	for block in 65536 1048576; do
		k="$op $block"
		row="| $op | $([ $block = 65536 ] && echo 64 KiB || echo 1 MiB) |"
		for c in "mc-mc" "mc-mc pool" "mc-te" "mc-te pool" "te-mc" "te-te"; do
			row+=" $(echo "${res[$k|$c]:-}" | med) |"
		done
		echo "$row"
		for c in "mc-mc" "mc-mc pool" "mc-te" "mc-te pool" "te-mc" "te-te"; do
			case " ${res[$k|$c]:-} " in *" 0 "*) fail "a $c run failed: $op $block";; esac
		done
	done
done
[ "$fails" -eq 0 ] && echo "all checks passed" || echo "$fails checks FAILED"
[ "$fails" -eq 0 ]
