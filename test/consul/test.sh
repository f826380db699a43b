#!/usr/bin/env bash
# test.sh — the Consul test tier: installs the agent if missing (install.sh,
# idempotent; a cold build takes 10-20 min), then runs every test that needs a
# real agent. The tests start their own `consul agent -dev` on free ports, so
# nothing may already listen on 8500 and nothing needs to be started first.
# Under CI=true a missing binary fails the tests instead of skipping them.
#   bash test/consul/test.sh [extra go test flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash test/consul/install.sh
export PATH="/usr/local/bin:$PATH" CONSUL="${CONSUL:-consul}"
v=$(consul version); echo "${v%%$'\n'*}"
go test -race -count=1 "$@" ./segment/consul/... ./segment/storetest/... ./test/consul/...
go test -count=1 "$@" -run 'Segments|Consul' ./cmd/te
