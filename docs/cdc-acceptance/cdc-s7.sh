#!/bin/bash
# docs/benchmarks.md §7 on the services `make services` starts (redis 16379, PostgreSQL 15432, demo data from
# `make demo-data`): the daemon on config.toml, the 50-worker read load, and 1,000 track updates/s for 2 minutes,
# timed from COMMIT to the new value in Redis by the reader (keepwarm-bench changes), then every cached key of the
# fed keyspaces compared with the origin.
# usage: docs/cdc-acceptance/cdc-s7.sh off|on   (PostgreSQL's synchronous_commit during the run)
#        RATE=5 DURATION=30s LOAD=0 docs/cdc-acceptance/cdc-s7.sh on   (a trickle of updates, no read load)
set -eu
sc=$1; rate=${RATE:-1000}; dur=${DURATION:-2m}; withload=${LOAD:-1}; out=${OUT:-/tmp/cdc-s7-$sc}; rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../.."
go build -o "$out/kw" ./cmd/keepwarm && go build -o "$out/kwb" ./cmd/keepwarm-bench
psql() { command psql -X -q -v ON_ERROR_STOP=1 "postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable" -c "$1"; }
psql "ALTER SYSTEM SET synchronous_commit = '$sc'" && psql "SELECT pg_reload_conf()" >/dev/null
trap 'psql "ALTER SYSTEM RESET synchronous_commit" ; psql "SELECT pg_reload_conf()" >/dev/null; kill $(jobs -p) 2>/dev/null || true' EXIT
redis-cli -p 16379 flushdb >/dev/null
"$out/kw" run --config config.toml >"$out/daemon.log" 2>&1 &
daemon=$!
sleep 3
load=
if [ "$withload" = 1 ]; then
  "$out/kwb" load --config config.toml --duration 2m35s --workers 50 --zipf 1.1 --daemon 127.0.0.1:9471 >"$out/load.txt" 2>"$out/load.err" &
  load=$!
  sleep 15
fi
"$out/kwb" changes --config config.toml --daemon 127.0.0.1:9471 --rate "$rate" --duration "$dur" --settle 5s \
  --svg "$out/latency.svg" --json "$out/changes.json" | tee "$out/changes.txt"
[ -z "$load" ] || wait $load
curl -s 127.0.0.1:9471/metrics | grep -E "^keepwarm_(warmer_hot_expired|changes_commit|stream_resyncs|stream_transactions)" >"$out/metrics-end.txt" || true
kill -TERM $daemon; wait $daemon || true
uptime | tee -a "$out/changes.txt"
