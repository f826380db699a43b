#!/usr/bin/env bash
# te bench throughput with --admin on (its /metrics scraped every SCRAPE
# seconds while it runs) against the same bench without, taking turns
# against one te serve --admin, scraped all along (off,on then on,off,
# ROUNDS times), over tcp on
# loopback. Prints each run's GB/s, the sums' on/off and the median of the
# rounds' on/off. A benchmark: it fails only when a tool fails.
#   env: TE (the te binary; default: built into a temporary directory),
#        ROUNDS (default 5), SECS (te bench --duration, default 2),
#        SCRAPE (seconds between scrapes, default 1; Prometheus's default is 15),
#        ARGS (more te bench flags, default "--block-size 64KiB --batch-size 128")
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-2}
SCRAPE=${SCRAPE:-1}
ARGS=${ARGS:---block-size 64KiB --batch-size 128}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
if [ -z "${TE:-}" ]; then
	TE=$W/te
	CGO_ENABLED=0 go build -o "$TE" ./cmd/te
fi
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
SA=127.0.0.1:$(port)
"$TE" serve --protocol tcp --buffer-size 64MiB --admin "$SA" > "$W/serve.out" 2> "$W/serve.err" &
for _ in $(seq 100); do grep -q '^segment ' "$W/serve.out" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment //p' "$W/serve.out")
[ -n "$SEG" ] || { cat "$W/serve.err"; exit 1; }

# One scraper for the whole run, started before the first bench: te serve's
# /metrics, and the bench's whenever one listens there (--admin on).
BA=127.0.0.1:$(port)
python3 -c '
import sys, time, urllib.request
every, urls = float(sys.argv[1]), sys.argv[2:]
while True:
    for u in urls:
        try: urllib.request.urlopen(u, timeout=5).read()
        except Exception: pass
    time.sleep(every)' "$SCRAPE" "http://$BA/metrics" "http://$SA/metrics" &
sleep 1

run() { # $1: off|on; prints GB/s
	local extra=()
	[ "$1" = off ] || extra=(--admin "$BA")
	# shellcheck disable=SC2086
	"$TE" bench --segment "$SEG" --protocol tcp --duration "$SECS" --json $ARGS "${extra[@]}" 2>/dev/null > "$W/bench.json"
	grep -o '"gb_per_s": *[0-9.e+-]*' "$W/bench.json" | head -1 | sed 's/.*: *//'
}

: > "$W/runs"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="off on"; else order="on off"; fi
	for m in $order; do
		g=$(run "$m")
		printf 'round %d admin %-3s %.3f GB/s\n' "$r" "$m" "$g"
		echo "$r $m $g" >> "$W/runs"
	done
done
# The sums, and the median of each round's on/off (robust to a machine
# whose load drifts between rounds).
python3 - "$W/runs" <<'PY'
import sys, statistics
runs = {}
for line in open(sys.argv[1]):
    r, m, g = line.split()
    runs.setdefault(r, {})[m] = float(g)
off = sum(v["off"] for v in runs.values())
on = sum(v["on"] for v in runs.values())
ratios = [v["on"] / v["off"] for v in runs.values()]
print("sum off %.3f GB/s, on %.3f GB/s: on/off %.3f; median of the rounds' on/off %.3f (%d rounds)"
      % (off, on, on / off, statistics.median(ratios), len(ratios)))
PY
