#!/bin/sh
# Guest part of test/softroce/bench.sh (perf/run.sh calls it at its end): the engine
# over RDMA, `te bench --protocol rdma` (batches of 128, one thread) against a
# `te serve` in another process, host A's devices -> host B's, next to perftest's
# ib_write_bw / ib_read_bw on the same devices, interleaved run by run. "2 rails":
# te stripes one batch over both rails; perftest runs one pair per rail at once and
# the two BWs are summed. Prints BENCH lines (median of BENCH_RUNS) and appends them
# to $BENCH_OUT. Benchmark output: it fails only when a tool fails (each failure adds
# a line to $BENCH_FAILF; exit status = failures).
#   env: SR_* (ENV.md); BENCH_RUNS (default 3); BENCH_TE_SECS (te bench --duration,
#        default 2); BENCH_BYTES (bytes per perftest run, default 32 MiB);
#        BENCH_ONLY (a shell pattern on the row names, as in perf/run.sh; default all);
#        BENCH_ROWS (rows to run as op:block:rails, default all, e.g. "write:64KiB:1");
#        BENCH_TE_ARGS (more te bench flags, e.g. "--threads 2")
RUNS=${BENCH_RUNS:-3}
SECS=${BENCH_TE_SECS:-2}
BYTES=${BENCH_BYTES:-33554432}
OUT=${BENCH_OUT:-${SR_OUT:-/tmp}/bench.txt}
FAILF=${BENCH_FAILF:-/tmp/engine.fails}
[ -f "$FAILF" ] || : > "$FAILF"
NF0=$(wc -l < "$FAILF")
W=/tmp/engine-bench
rm -rf $W && mkdir -p $W
echo 19400 > $W/port # the helpers run in $(...) subshells: the next free port lives in a file
nextport() {
	PORT=$(($(cat $W/port) + 1))
	echo $PORT > $W/port
}

median() { sort -n | awk '{v[NR]=$1} END{if (NR==0) print "nan"; else print v[int((NR+1)/2)]}'; }
fail() {
	echo "engine bench: $*" >&2
	echo x >> "$FAILF"
}

ONLY=${BENCH_ONLY:-*}
ROWS=
for op in write read; do
	for blk in 64KiB 1MiB; do
		for rails in 1 2; do
			case " ${BENCH_ROWS:-$op:$blk:$rails} " in *" $op:$blk:$rails "*) ;; *) continue ;; esac
			# shellcheck disable=SC2254
			case "engine $op $blk ${rails}rail" in $ONLY) ROWS="$ROWS $op:$blk:$rails" ;; esac
		done
	done
done
[ -n "$ROWS" ] || exit 0

# te serve on host B's rails, for the whole run; its first stdout line names the segment
te serve --protocol rdma --devices "$SR_DEV1,$SR_DEV3" --buffer-size 128MiB > $W/serve.out 2> $W/serve.err &
SERVE=$!
SEG=
for _ in $(seq 1 300); do
	SEG=$(sed -n 's/^segment //p' $W/serve.out)
	[ -n "$SEG" ] && break
	kill -0 $SERVE 2> /dev/null || break
	sleep 0.1
done
if [ -z "$SEG" ]; then
	fail "te serve gave no segment line"
	cat $W/serve.out $W/serve.err >&2
	kill $SERVE 2> /dev/null
	exit 1
fi

# rxe's retransmission counters, summed over the four rail devices:
# completer_retry_err (requester retransmission rounds: after an ACK timeout, or at
# once after a sequence NAK), rcvd_seq_err (sequence NAKs received),
# out_of_seq_request and duplicate_request (what the responders saw)
CTRS="completer_retry_err rcvd_seq_err out_of_seq_request duplicate_request"
ctrs() {
	for c in $CTRS; do
		v=0
		for d in $SR_DEV0 $SR_DEV1 $SR_DEV2 $SR_DEV3; do
			v=$((v + $(cat /sys/class/infiniband/$d/ports/1/hw_counters/$c 2> /dev/null || echo 0)))
		done
		printf '%s ' $v
	done
	echo
}
# ctrdelta BEFORE AFTER FILE: appends AFTER-BEFORE to FILE
ctrdelta() { echo "$1" "$2" | awk '{n=NF/2; for (i=1; i<=n; i++) printf "%d ", $(i+n)-$i; print ""}' >> $3; }
# ctrsum FILE: the counters summed over the runs
ctrsum() { awk '{for (i=1; i<=NF; i++) s[i]+=$i} END{printf "retries %d seq-NAKs %d out-of-seq %d dup %d", s[1], s[2], s[3], s[4]}' $1; }

# tebench OP BLOCK DEVS -> "MiB/s rail-bytes..." of one te bench run
tebench() {
	timeout 120 te bench --segment "$SEG" --protocol rdma --devices "$3" --operation $1 --block-size $2 \
		--batch-size 128 --buffer-size 128MiB --duration ${SECS}s --report-unit MiB --json --quiet ${BENCH_TE_ARGS:-} > $W/te.json 2> $W/te.err || {
		fail "te bench $* failed (rc $?):"
		cat $W/te.json $W/te.err >&2
		return 1
	}
	# te/v1 report: the result's gb_per_s (1e9 B/s) comes before "rails";
	# each rail has its own "bytes"; the flags object has neither. The rate
	# goes out in MiB/s, perftest's unit.
	awk -F'[:,]' '/"results"/{res=1} res && /"rails"/{r=1} res && !r && /"gb_per_s"/{rate=$2*1e9/1048576} r && /"bytes"/{b=b " " $2+0} END{printf "%.2f%s\n", rate+0, b}' $W/te.json
}

# ptbw TOOL SIZE ITERS "SRV:CLI:SGID:CGID ..." -> "MB/s n agg": the summed BW average
# (perftest's MB/sec, 2^20 bytes) of n perftest pairs, one per rail, run at once, and
# their aggregate: all bytes over the slower pair's time (bytes / its BW average).
# The sum overstates what the pairs moved together when one pair finishes first
# (the other then runs alone for the rest of its bytes); te's rate is its bytes
# over its whole run.
ptbw() {
	tool=$1 size=$2 iters=$3 pairs=$4
	for try in 1 2 3; do
		rm -f $W/pt-*
		i=0
		for p in $pairs; do
			i=$((i + 1))
			nextport
			set -- $(echo $p | tr : ' ')
			timeout 120 $tool -d $1 -x $3 -F -p $PORT -s $size -n $iters > $W/pt-srv$i.log 2>&1 &
			echo $! >> $W/pt-pids
			echo "$2 $4 $PORT" > $W/pt-cli$i.args
		done
		sleep 0.5
		j=0
		while [ $j -lt $i ]; do
			j=$((j + 1))
			set -- $(cat $W/pt-cli$j.args)
			timeout 120 $tool -d $1 -x $2 -F -p $3 -s $size -n $iters 127.0.0.1 > $W/pt-cli$j.log 2>&1 &
			echo $! >> $W/pt-pids
		done
		rc=0
		for pid in $(cat $W/pt-pids); do wait $pid || rc=$?; done
		# under TCG perftest's CPU-MHz calibration sometimes fails; it then reports 0 or inf
		cat $W/pt-cli*.log | grep -q 'Correlation coefficient' || break
	done
	if [ $rc != 0 ]; then
		fail "perftest $tool failed (rc $rc):"
		cat $W/pt-cli*.log $W/pt-srv*.log >&2
		return 1
	fi
	cat $W/pt-cli*.log | awk '$1 ~ /^[0-9]+$/ && NF >= 5 {s += $4; n++; b += $1 * $2; t = $1 * $2 / 1048576 / ($4 > 0 ? $4 : 1); if (t > tm) tm = t} END{printf "%s %d %.2f\n", s, n, (tm > 0 ? b / 1048576 / tm : 0)}'
}

# row NAME OP BLOCK ITERS RAILS
row() {
	name=$1 op=$2 blk=$3 iters=$4 rails=$5
	size=$(echo $blk | sed 's/KiB/*1024/; s/MiB/*1048576/' | awk -F'*' '{print $1 * $2}')
	devs=$SR_DEV0 pairs="$SR_DEV1:$SR_DEV0:$SR_GID1:$SR_GID0"
	if [ $rails = 2 ]; then
		devs="$SR_DEV0,$SR_DEV2" pairs="$pairs $SR_DEV3:$SR_DEV2:$SR_GID3:$SR_GID2"
	fi
	: > $W/te.v; : > $W/pt.v; : > $W/pt.a; : > $W/te.r; : > $W/te.c; : > $W/pt.c
	for r in $(seq 1 $RUNS); do
		c0=$(ctrs)
		t=$(tebench $op $blk $devs) && {
			echo "$t" | awk '{print $1}' >> $W/te.v
			echo "$t" | awk '{$1=""; print}' >> $W/te.r
		}
		c1=$(ctrs)
		p=$(ptbw ib_${op}_bw $size $iters "$pairs") && {
			set -- $p
			if [ "$2" = $rails ]; then echo $1 >> $W/pt.v; echo $3 >> $W/pt.a; else fail "perftest $name: $2 result lines for $rails rails"; fi
		}
		ctrdelta "$c0" "$c1" $W/te.c
		ctrdelta "$c1" "$(ctrs)" $W/pt.c
	done
	tv=$(median < $W/te.v) pv=$(median < $W/pt.v)
	line=$(awk -v n="$name" -v t="$tv" -v p="$pv" -v r="$RUNS" 'BEGIN{printf "%-28s BW MiB/s (median of %d)   te %9.2f   perftest %9.2f   te/perftest %.2f", n, r, t, p, (p>0 ? t/p : 0)}')
	echo "BENCH $line"
	echo "$line" >> "$OUT"
	echo "   te:       $(tr '\n' ' ' < $W/te.v)" >> "$OUT"
	echo "   perftest: $(tr '\n' ' ' < $W/pt.v)" >> "$OUT"
	if [ $rails != 1 ]; then
		pa=$(median < $W/pt.a)
		echo "   perftest aggregate (all bytes / the slower pair's time): $(tr '\n' ' ' < $W/pt.a); median $pa, te/aggregate $(awk -v t="$tv" -v p="$pa" 'BEGIN{printf "%.2f", (p>0 ? t/p : 0)}')" >> "$OUT"
	fi
	[ $rails = 1 ] || echo "   te bytes per rail, per run: $(tr '\n' '/' < $W/te.r)" >> "$OUT"
	echo "   rxe, all runs: te $(ctrsum $W/te.c); perftest $(ctrsum $W/pt.c)" >> "$OUT"
}

echo "te bench --protocol rdma ${BENCH_TE_ARGS:+$BENCH_TE_ARGS }(te serve on $SR_DEV1,$SR_DEV3, batch 128, ${SECS}s) vs perftest ($BYTES bytes per run): $RUNS interleaved runs each"
for r in $ROWS; do
	set -- $(echo $r | tr : ' ')
	iters=$((BYTES / $(echo $2 | sed 's/KiB/*1024/; s/MiB/*1048576/' | awk -F'*' '{print $1 * $2}')))
	row "engine $1 $2 ${3}rail" $1 $2 $iters $3
done
kill $SERVE 2> /dev/null
wait $SERVE 2> /dev/null
exit $(($(wc -l < "$FAILF") - NF0))
