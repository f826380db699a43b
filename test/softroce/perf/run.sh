#!/bin/sh
# Guest payload of test/softroce/bench.sh: runs `te perf` and rdma-core's perftest
# on the same devices in the same guest, interleaved, and prints both numbers and
# their ratio. Benchmark output, not a pass/fail test: it fails only when a tool fails.
#   env: SR_* from the harness (ENV.md); BENCH_N iterations (default 1000),
#        BENCH_RUNS interleaved repetitions (default 3; medians are reported),
#        BENCH_ONLY a shell pattern: only the rows whose name matches (default all)
N=${BENCH_N:-1000}
RUNS=${BENCH_RUNS:-3}
ONLY=${BENCH_ONLY:-*} # shell pattern on the row names, e.g. 'write_lat*'
PORT=18900
FAILF=/tmp/bench.fails # the helpers run in $(...) subshells: count failures in a file
: > $FAILF
OUT=${SR_OUT:-/tmp}/bench.txt
: > "$OUT"

median() { sort -n | awk '{v[NR]=$1} END{if (NR==0) print "nan"; else print v[int((NR+1)/2)]}'; }

# perftest SRVDEV SRVGID CLIDEV CLIGID TOOL ARGS... -> prints the client's result line
perftest() {
	sd=$1 sg=$2 cd=$3 cg=$4 tool=$5
	shift 5
	for try in 1 2 3; do
		PORT=$((PORT + 1))
		timeout 120 $tool -d $sd -x $sg -F -p $PORT "$@" > /tmp/pt-srv.log 2>&1 &
		sp=$!
		sleep 0.5
		timeout 120 $tool -d $cd -x $cg -F -p $PORT "$@" 127.0.0.1 > /tmp/pt-cli.log 2>&1
		rc=$?
		wait $sp
		# under TCG perftest's CPU-MHz calibration sometimes fails; it then reports 0 or inf
		grep -q 'Correlation coefficient' /tmp/pt-cli.log || break
	done
	[ $rc = 0 ] || { echo "perftest $tool failed (rc $rc):" >&2; cat /tmp/pt-cli.log /tmp/pt-srv.log >&2; echo x >> $FAILF; return 1; }
	awk '$1 ~ /^[0-9]+$/ && NF >= 5 {print; exit}' /tmp/pt-cli.log
}

# teperf SRVDEV CLIDEV ARGS... -> prints the client's JSON line
teperf() {
	sd=$1 cd=$2
	shift 2
	PORT=$((PORT + 1))
	timeout 120 ${TE:-te} perf -d $sd -p $PORT -timeout 100s 2> /tmp/te-srv.log &
	sp=$!
	timeout 120 ${TE:-te} perf -d $cd -p $PORT -json -timeout 100s "$@" 127.0.0.1 > /tmp/te-cli.log 2>&1
	rc=$?
	wait $sp
	[ $rc = 0 ] || { echo "te perf failed (rc $rc):" >&2; cat /tmp/te-cli.log /tmp/te-srv.log >&2; echo x >> $FAILF; return 1; }
	cat /tmp/te-cli.log
}

json() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p" | head -1; }

# bench NAME SRVDEV SRVGID CLIDEV CLIGID bw|lat TOOL TE-ARGS -- PERFTEST-ARGS
bench() {
	name=$1 sd=$2 sg=$3 cd=$4 cg=$5 kind=$6 tool=$7
	shift 7
	case $name in $ONLY) ;; *) return 0 ;; esac
	targs= pargs=
	while [ $# -gt 0 ] && [ "$1" != -- ]; do targs="$targs $1"; shift; done
	shift
	pargs="$*"
	: > /tmp/te.v; : > /tmp/pt.v; : > /tmp/te.a; : > /tmp/pt.a; : > /tmp/te.9; : > /tmp/pt.9; : > /tmp/te.p
	for r in $(seq 1 $RUNS); do
		# shellcheck disable=SC2086
		t=$(teperf $sd $cd $targs) && if [ $kind = bw ]; then
			echo "$t" | json mb_per_s >> /tmp/te.v
		else
			echo "$t" | json t_typical_us >> /tmp/te.v
			echo "$t" | json t_avg_us >> /tmp/te.a
			echo "$t" | json t_p99_us >> /tmp/te.9
			echo "$t" | json preempt_per_s >> /tmp/te.p
		fi
		# shellcheck disable=SC2086
		p=$(perftest $sd $sg $cd $cg $tool $pargs) && if [ $kind = bw ]; then
			echo "$p" | awk '{print $4}' >> /tmp/pt.v
		else
			echo "$p" | awk '{print $5}' >> /tmp/pt.v
			echo "$p" | awk '{print $6}' >> /tmp/pt.a
			echo "$p" | awk '{print $8}' >> /tmp/pt.9
		fi
	done
	tv=$(median < /tmp/te.v) pv=$(median < /tmp/pt.v)
	if [ $kind = bw ]; then
		line=$(awk -v n="$name" -v t="$tv" -v p="$pv" -v r="$RUNS" 'BEGIN{printf "%-28s BW MB/s (median of %d)   te %9.2f   perftest %9.2f   te/perftest %.2f", n, r, t, p, (p>0 ? t/p : 0)}')
	else
		ta=$(median < /tmp/te.a) pa=$(median < /tmp/pt.a) t9=$(median < /tmp/te.9) p9=$(median < /tmp/pt.9) tp=$(median < /tmp/te.p)
		line=$(awk -v n="$name" -v t="$tv" -v p="$pv" -v ta="$ta" -v pa="$pa" -v t9="$t9" -v p9="$p9" -v tp="$tp" -v r="$RUNS" 'BEGIN{printf "%-28s typical us (median of %d) te %9.2f   perftest %9.2f   te/perftest %.2f   (avg: te %.2f perftest %.2f; p99: te %.2f perftest %.2f te/perftest %.2f; te threads preempted %.0f/s)", n, r, t, p, (p>0 ? t/p : 0), ta, pa, t9, p9, (p9>0 ? t9/p9 : 0), tp}')
	fi
	echo "BENCH $line"
	echo "$line" >> "$OUT"
	echo "   te:       $(tr '\n' ' ' < /tmp/te.v)" >> "$OUT"
	echo "   perftest: $(tr '\n' ' ' < /tmp/pt.v)" >> "$OUT"
	if [ $kind = lat ]; then
		echo "   p99 te:       $(tr '\n' ' ' < /tmp/te.9)" >> "$OUT"
		echo "   p99 perftest: $(tr '\n' ' ' < /tmp/pt.9)" >> "$OUT"
	fi
}

echo "te perf vs perftest: $N iterations, $RUNS interleaved runs each, kernel $SR_KVER, veth MTU $SR_MTU"
bench "write_bw 64KiB rail1" $SR_DEV1 $SR_GID1 $SR_DEV0 $SR_GID0 bw ib_write_bw -n $N -s 65536 -- -n $N -s 65536
bench "write_lat 8B rail1" $SR_DEV1 $SR_GID1 $SR_DEV0 $SR_GID0 lat ib_write_lat -lat -n $N -s 8 -- -n $N -s 8
# diagnostic (bench.sh builds it): te whose Go runtime wakes its sysmon thread at 5 Hz, not 100 Hz
if [ -x /payload/te-sysmon5hz ]; then
	TE=/payload/te-sysmon5hz bench "write_lat 8B rail1 sysmon-5Hz" $SR_DEV1 $SR_GID1 $SR_DEV0 $SR_GID0 lat ib_write_lat -lat -n $N -s 8 -- -n $N -s 8
fi
bench "read_bw 64KiB rail2" $SR_DEV3 $SR_GID3 $SR_DEV2 $SR_GID2 bw ib_read_bw -op read -n $N -s 65536 -- -n $N -s 65536
bench "send_bw 64KiB rail2" $SR_DEV3 $SR_GID3 $SR_DEV2 $SR_GID2 bw ib_send_bw -op send -n $N -s 65536 -- -n $N -s 65536
# te's default on rxe sleeps on completion events; this row busy-polls like perftest
bench "send_bw 64KiB rail2 te-poll" $SR_DEV3 $SR_GID3 $SR_DEV2 $SR_GID2 bw ib_send_bw -op send -cq poll -n $N -s 65536 -- -n $N -s 65536
bench "write_bw 64KiB loopback" $SR_DEVLO $SR_GIDLO $SR_DEVLO $SR_GIDLO bw ib_write_bw -n $N -s 65536 -- -n $N -s 65536
BENCH_RUNS=$RUNS BENCH_ONLY=$ONLY BENCH_OUT=$OUT BENCH_FAILF=$FAILF sh ./engine.sh # te bench --protocol rdma rows
echo "---- summary (also in $OUT)"
cat "$OUT"
FAILS=$(wc -l < $FAILF)
[ "$FAILS" = 0 ] || echo "$FAILS tool runs failed (see above)"
exit $FAILS
