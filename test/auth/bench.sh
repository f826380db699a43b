#!/usr/bin/env bash
# Cluster authentication on vs off, interleaved in one run, two ways:
#
# 1. go test -bench BenchmarkAuth ./tcp (-count $COUNT, default 10): one
#    process, a target and initiator pair with and one without the secret,
#    batch for batch in turn (WRITE 128 × 64 KiB); the median of the
#    runs' on/off and the ratio of the means.
# 2. te bench with and without --auth-file (in-process target), [rounds]
#    rounds (default 6; 0 skips), each running both in alternating order
#    (off-on, on-off, ...) to cancel drift; every round and the ratios of
#    the means of GB/s and of GB per CPU-second (user+sys of the process,
#    which other load on the machine disturbs far less than wall time).
#
# The handshake is per connection, so on/off should be 1 within noise.
#
#   bash test/auth/bench.sh [rounds] [te bench flags...]
#   bash test/auth/bench.sh 10 --operation read --block-size 1MiB
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-6}
shift || true
go test -run '^$' -bench '^BenchmarkAuth$' -count "${COUNT:-10}" -benchtime 1s ./tcp | grep '^Benchmark' |
	awk '{for (i = 1; i < NF; i++) { if ($(i+1) == "off-GB/s") o = $i; if ($(i+1) == "on-GB/s") a = $i; if ($(i+1) == "on/off") r = $i }; print o, a, r}' |
	sort -k3 -g | awk '{o += $1; a += $2; r[NR] = $3; printf "go bench run: auth off %.3f GB/s, auth on %.3f GB/s, on/off %.3f\n", $1, $2, $3}
		END {printf "go bench: mean auth off %.3f GB/s, on %.3f GB/s, on/off of the means %.3f, median on/off %.3f (%d runs)\n", o/NR, a/NR, a/o, (NR%2) ? r[(NR+1)/2] : (r[NR/2]+r[NR/2+1])/2, NR}'
[ "$rounds" -gt 0 ] || exit 0
make -s build
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 32 /dev/urandom | base64 >"$dir/secret"
chmod 600 "$dir/secret"
# bench [flags]: prints GB/s and GB per CPU-second of the te bench process
# (user+sys, setup included): the second depends far less on other load.
bench() {
	/usr/bin/time -o "$dir/time" -f '%U %S' ./bin/te bench --json --quiet --duration 2 --buffer-size 16MiB "$@" >"$dir/out"
	local gbps bytes
	gbps=$(sed -n 's/.*"gb_per_s": \([0-9.e+-]*\).*/\1/p' "$dir/out" | head -1)
	bytes=$(grep -m1 '"bytes"' "$dir/out" | tr -dc 0-9)
	awk -v g="$gbps" -v b="$bytes" '{print g, b/($1+$2)/1e9}' "$dir/time"
}
: >"$dir/rounds"
for i in $(seq "$rounds"); do
	if [ $((i % 2)) -eq 1 ]; then
		a=$(bench "$@")
		b=$(bench --auth-file "$dir/secret" "$@")
	else
		b=$(bench --auth-file "$dir/secret" "$@")
		a=$(bench "$@")
	fi
	echo "$a $b" >>"$dir/rounds"
	awk -v i="$i" '{printf "round %d: auth off %.3f GB/s %.3f GB/cpu-s, auth on %.3f GB/s %.3f GB/cpu-s\n", i, $1, $2, $3, $4}' <<<"$a $b"
done
awk '{o+=$1; oc+=$2; a+=$3; ac+=$4} END {
	printf "te bench: mean auth off %.3f GB/s %.3f GB/cpu-s, auth on %.3f GB/s %.3f GB/cpu-s; on/off %.3f (GB/s), %.3f (GB/cpu-s) (%d rounds)\n", o/NR, oc/NR, a/NR, ac/NR, a/o, ac/oc, NR
}' "$dir/rounds"
