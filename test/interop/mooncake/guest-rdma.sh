#!/bin/sh
# guest-rdma.sh - the guest side of `run.sh rdma`: te against Mooncake's
# Transfer Engine over RDMA on the Soft-RoCE guest's two rails
# (test/softroce/ENV.md). run.sh copies it, with Mooncake's
# transfer_engine_bench, mccheck and their shared libraries, into the
# guest as /payload/run.sh; the guest runs it after its tests. busybox sh:
# no bash, no python.
#
# Host A's rail 1 device (SR_DEV0) is the initiator's, host B's (SR_DEV1)
# the target's, every process on 127.0.0.1 for its handshake socket
# (P2PHANDSHAKE). One rail: a Mooncake initiator picks the peer's device
# from the peer's priority matrix at random, not by its own rail, and the
# guest routes rail 1's devices only to each other (ENV.md). Each line a
# PASS or FAIL; exit 1 on any FAIL.
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib" GLOG_logtostderr=1
# Mooncake picks a GID by itself; the guest's RoCE v2 IPv4 GID is at this
# index on both devices.
export MC_GID_INDEX="$SR_GID0"
[ "$SR_GID0" = "$SR_GID1" ] || echo "WARNING: GID indexes differ ($SR_GID0, $SR_GID1); Mooncake takes one for all devices"
bench=$here/bin/transfer_engine_bench
mccheck=$here/bin/mccheck
reps=$(cat "$here/REPS")
secs=$(cat "$here/SECONDS")
A="$SR_DEV0"
B="$SR_DEV1"
w=$(mktemp -d /tmp/mcrdma.XXXXXX)
fails=0
pass() { echo "PASS $*"; }
fail() {
	echo "FAIL $*"
	fails=$((fails + 1))
}
# waitfor FILE REGEX: the first match of REGEX in FILE (30 s at most).
waitfor() {
	i=0
	while [ $i -lt 300 ]; do
		if m=$(grep -m1 -oE "$2" "$1" 2> /dev/null); then
			echo "$m"
			return 0
		fi
		sleep 0.1
		i=$((i + 1))
	done
	return 1
}
stop() {
	kill "$1" 2> /dev/null
	wait "$1" 2> /dev/null
}
# te_target LOG [ARGS]: te serve over Mooncake's RDMA wire on host B; sets tpid, tseg.
te_target() {
	log=$1
	shift
	te serve --mooncake --protocol rdma --devices "$B" --buffer-size 256MiB "$@" > "$log.out" 2> "$log" &
	tpid=$!
	tseg=$(waitfor "$log.out" '^segment .*' | cut -d' ' -f2) || {
		cat "$log"
		return 1
	}
}
# mc_target LOG: Mooncake's bench target on host B; sets tpid, tseg.
mc_target() {
	"$bench" --mode=target --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$B" \
		--local_server_name=127.0.0.1 --buffer_size=268435456 > "$1" 2>&1 &
	tpid=$!
	l=$(waitfor "$1" 'listening on [^ ]+:[0-9]+') || {
		tail -20 "$1"
		return 1
	}
	tseg=${l#listening on }
	sleep 1 # its buffers are registered after it listens
}
# mc_bench OP BLOCK SEG: Mooncake's initiator on host A; prints MB/s (0:
# failed). MB/s (1e6): Soft-RoCE under TCG moves tens of them.
mc_bench() {
	"$bench" --mode=initiator --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$A" \
		--local_server_name=127.0.0.1 --segment_id="$3" --operation="$1" --block_size="$2" --batch_size=32 \
		--threads=1 --duration="$secs" --buffer_size=268435456 --report_unit=MB --report_precision=2 > "$w/bench.log" 2>&1 || {
		tail -5 "$w/bench.log" >&2
		echo 0
		return
	}
	grep -oE 'throughput [0-9.]+ MB/s' "$w/bench.log" | tail -1 | awk '{print $2}' | grep . || echo 0
}
# te_bench OP BLOCK SEG: te's initiator over Mooncake's RDMA wire on host A; prints MB/s.
te_bench() {
	te bench --mooncake --metadata P2PHANDSHAKE --protocol rdma --devices "$A" --segment "$3" --operation "$1" \
		--block-size "$2" --batch-size 32 --threads 1 --duration "$secs" --report-unit MB --quiet > "$w/te.out" 2>&1 || {
		tail -5 "$w/te.out" >&2
		echo 0
		return
	}
	grep -oE '[0-9.]+ MB/s' "$w/te.out" | head -1 | awk '{print $1}' | grep . || echo 0
}

echo "== byte checks over RDMA ($A -> $B, kernel $(uname -r), RoCE MTU from veth MTU $SR_MTU)"
# 1. Mooncake's engine -> te serve --mooncake --protocol rdma.
if te_target "$w/te1.log"; then
	for c in "65536 64" "1048576 16"; do
		set -- $c
		if out=$("$mccheck" P2PHANDSHAKE 127.0.0.1 "$tseg" "$1" "$2" rdma "$A" 2> "$w/mccheck.log"); then
			pass "Mooncake engine -> te serve --mooncake --protocol rdma: $out"
		else
			fail "Mooncake engine -> te serve over rdma, $1 B: $(tail -3 "$w/mccheck.log")"
		fi
	done
	stop "$tpid"
else
	fail "te serve --mooncake --protocol rdma did not start"
fi
# 2. te bench --mooncake --protocol rdma --verify -> Mooncake's bench target.
if mc_target "$w/mc1.log"; then
	for op in write read; do
		for size in 64KiB 1MiB; do
			if te bench --mooncake --metadata P2PHANDSHAKE --protocol rdma --devices "$A" --segment "$tseg" --operation $op \
				--block-size $size --batch-size 16 --duration 2 --verify --report-unit MB --quiet > "$w/v.out" 2>&1 && grep -q 'verify: true' "$w/v.out"; then
				pass "te bench --mooncake --protocol rdma --verify -> Mooncake target: $op $size ($(grep -oE '[0-9.]+ MB/s' "$w/v.out" | head -1))"
			else
				fail "te bench -> Mooncake target over rdma, $op $size: $(tail -3 "$w/v.out")"
			fi
		done
	done
	stop "$tpid"
else
	fail "Mooncake's bench target over rdma did not start"
fi

# 3. Notifications both ways, with Mooncake's transfer_engine_bench_with_notify
# (when run.sh found it): they travel on the handshake socket after the data.
nb=$here/bin/transfer_engine_bench_with_notify
if [ -x "$nb" ]; then
	"$nb" --mode=target --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$B" --local_server_name=127.0.0.1 \
		--buffer_size=268435456 > "$w/nt.log" 2>&1 &
	tpid=$!
	if l=$(waitfor "$w/nt.log" 'listening on [^ ]+:[0-9]+'); then
		sleep 1
		te bench --mooncake --metadata P2PHANDSHAKE --protocol rdma --devices "$A" --segment "${l#listening on }" \
			--operation write --block-size 64KiB --batch-size 16 --duration 1 --notify --quiet > "$w/nb.out" 2>&1
		sleep 2
	fi
	stop "$tpid"
	n=$(grep -a -c '\] te-bench' "$w/nt.log")
	if [ "${n:-0}" -gt 0 ]; then
		pass "te bench --mooncake --protocol rdma --notify -> Mooncake's target: its getNotifies returned $n notes"
	else
		fail "te bench --notify over rdma -> Mooncake: no note arrived: $(tail -3 "$w/nb.out")"
	fi
	if te_target "$w/te3.log" --print-notifies; then
		timeout 60 "$nb" --mode=initiator --metadata_server=P2PHANDSHAKE --protocol=rdma --device_name="$A" \
			--local_server_name=127.0.0.1 --segment_id="$tseg" --operation=write --block_size=65536 --batch_size=16 \
			--threads=1 --duration=1 --buffer_size=268435456 > "$w/ni.log" 2>&1
		sleep 1
		stop "$tpid"
	fi
	n=$(grep -c '^notify from mooncake@127.0.0.1 .* name "agent1" .* msg "notification' "$w/te3.log.out")
	if [ "${n:-0}" -gt 0 ]; then
		pass "Mooncake's initiator (submitTransferWithNotify) over rdma -> te serve --mooncake --print-notifies: $n notes"
	else
		fail "Mooncake notify over rdma -> te serve: none printed: $(tail -3 "$w/ni.log")"
	fi
else
	echo "SKIP notifications: no transfer_engine_bench_with_notify in the build"
fi

echo "== side by side: RDMA over rail 1 ($A -> $B), batch 32, 1 thread, ${secs} s, $reps reps, MB/s (1e6 B/s): median (min-max)"
: > "$w/res"
rep=1
while [ $rep -le "$reps" ]; do
	for op in write read; do
		for block in 65536 1048576; do
			mc_target "$w/t.log" && echo "$op $block mc-mc $(mc_bench $op $block "$tseg")" >> "$w/res"
			stop "$tpid"
			te_target "$w/t.log" && echo "$op $block mc-te $(mc_bench $op $block "$tseg")" >> "$w/res"
			stop "$tpid"
			mc_target "$w/t.log" && echo "$op $block te-mc $(te_bench $op $block "$tseg")" >> "$w/res"
			stop "$tpid"
			te_target "$w/t.log" && echo "$op $block te-te $(te_bench $op $block "$tseg")" >> "$w/res"
			stop "$tpid"
		done
	done
	rep=$((rep + 1))
done
echo "| op | block | Mooncake -> Mooncake | Mooncake -> te | te -> Mooncake | te -> te |"
echo "|---|---|---|---|---|---|"
for op in write read; do
	for block in 65536 1048576; do
		row="| $op | $block |"
		for c in mc-mc mc-te te-mc te-te; do
			v=$(awk -v o=$op -v b=$block -v c=$c '$1==o && $2==b && $3==c {print $4}' "$w/res" | sort -g |
				awk '{a[NR]=$1} END {if (NR==0) print "-"; else printf "%s (%s-%s)", a[int((NR+1)/2)], a[1], a[NR]}')
			row="$row $v |"
			case " $(awk -v o=$op -v b=$block -v c=$c '$1==o && $2==b && $3==c {printf " %s", $4}' "$w/res") " in
			*" 0 "*) fail "a $c run failed: $op $block" ;;
			esac
		done
		echo "$row"
	done
done
rm -rf "$w"
[ "$fails" -eq 0 ] && echo "all checks passed" || echo "$fails checks FAILED"
[ "$fails" -eq 0 ]
