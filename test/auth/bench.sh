#!/usr/bin/env bash
# te bench with cluster authentication on and off, interleaved in one run
# (off, on, off, on, ...), so both see the same load; prints each round and
# the ratio of the means (on / off). The handshake is per connection, so
# the ratio should be 1 within noise.
#
#   bash test/auth/bench.sh [rounds] [te bench flags...]
#   ROUNDS=6 bash test/auth/bench.sh 6 --operation read --block-size 1MiB
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-6}
shift || true
make -s build
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 32 /dev/urandom | base64 >"$dir/secret"
chmod 600 "$dir/secret"
gbps() { sed -n 's/.*"gb_per_s": \([0-9.e+-]*\).*/\1/p' | head -1; }
off=() on=()
for i in $(seq "$rounds"); do
	a=$(./bin/te bench --json --quiet --duration 2 "$@" | gbps)
	b=$(./bin/te bench --json --quiet --duration 2 --auth-file "$dir/secret" "$@" | gbps)
	off+=("$a") on+=("$b")
	printf 'round %d: auth off %.3f GB/s, auth on %.3f GB/s\n' "$i" "$a" "$b"
done
printf '%s\n' "${off[@]}" >"$dir/off"
printf '%s\n' "${on[@]}" >"$dir/on"
awk 'NR==FNR {o+=$1; n++; next} {a+=$1} END {printf "mean: auth off %.3f GB/s, auth on %.3f GB/s, on/off %.3f (%d rounds)\n", o/n, a/n, (a/n)/(o/n), n}' "$dir/off" "$dir/on"
