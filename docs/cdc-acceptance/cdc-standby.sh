#!/bin/bash
# docs/benchmarks.md §7 with a synchronous standby that answers: the same run as cdc-s7.sh (the daemon on
# config.toml, the 50-worker read load, 1,000 track updates/s for 2 minutes timed from COMMIT to the new value in
# Redis, every cached key compared with the origin at the end), while the shared PostgreSQL of `make services`
# (15432) has a physical standby (pg_basebackup, port 25433) named in synchronous_standby_names, with
# synchronous_commit = on: every commit waits for the standby's confirmation before it is visible. Everything is
# put back at the end (the setting reset, the standby stopped and removed, its slot dropped).
# usage: docs/cdc-acceptance/cdc-standby.sh      (OUT=/tmp/dir to keep the output elsewhere)
set -eu
out=${OUT:-/tmp/cdc-standby}; rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../.."
bin=$(dirname "$(readlink -f "$(command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -1)")")
asuser=(); [ "$(id -u)" -eq 0 ] && asuser=(runuser -u postgres --)
sbdir=$(mktemp -d /tmp/keepwarm-standby.XXXXXX); [ "$(id -u)" -eq 0 ] && chown postgres "$sbdir"; chmod 700 "$sbdir"
psql() { command psql -X -q -v ON_ERROR_STOP=1 "postgres://keepwarm@127.0.0.1:15432/chinook?sslmode=disable" -c "$1"; }
cleanup() {
  psql "ALTER SYSTEM RESET synchronous_standby_names" || true
  psql "ALTER SYSTEM RESET synchronous_commit" || true
  psql "SELECT pg_reload_conf()" >/dev/null || true
  kill $(jobs -p) 2>/dev/null || true
  "${asuser[@]}" "$bin/pg_ctl" -D "$sbdir/data" -m fast -w stop >/dev/null 2>&1 || true
  psql "SELECT pg_drop_replication_slot('kwbench_standby') FROM pg_replication_slots WHERE slot_name = 'kwbench_standby'" >/dev/null || true
  rm -rf "$sbdir"
}
trap cleanup EXIT
"${asuser[@]}" "$bin/pg_basebackup" -h 127.0.0.1 -p 15432 -U keepwarm -D "$sbdir/data" -X stream -C -S kwbench_standby \
  -d "host=127.0.0.1 port=15432 user=keepwarm application_name=kwbench_standby" -R
# A hot standby needs at least the primary's max_connections, max_wal_senders and max_replication_slots, which
# scripts/services passes on the command line (not in postgresql.conf, which the backup copies).
"${asuser[@]}" "$bin/pg_ctl" -D "$sbdir/data" -l "$sbdir/standby.log" -w \
  -o "-c port=25433 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$sbdir -c hot_standby=on -c max_connections=200 -c max_wal_senders=20 -c max_replication_slots=20 -c wal_level=logical -c fsync=off" \
  start >/dev/null || { cp "$sbdir/standby.log" "$out/" 2>/dev/null; exit 1; }
psql "ALTER SYSTEM SET synchronous_standby_names = 'kwbench_standby'"
psql "ALTER SYSTEM SET synchronous_commit = 'on'"
psql "SELECT pg_reload_conf()" >/dev/null
sleep 1
command psql -X -Atq "postgres://keepwarm@127.0.0.1:15432/postgres?sslmode=disable" \
  -c "select application_name, state, sync_state from pg_stat_replication where application_name = 'kwbench_standby'" | tee "$out/standby.txt"
grep -q '|sync$' "$out/standby.txt" || { echo "the standby is not synchronous" >&2; exit 1; }
go build -o "$out/kw" ./cmd/keepwarm && go build -o "$out/kwb" ./cmd/keepwarm-bench
redis-cli -p 16379 flushdb >/dev/null
"$out/kw" run --config config.toml >"$out/daemon.log" 2>&1 &
daemon=$!
sleep 3
"$out/kwb" load --config config.toml --duration 2m35s --workers 50 --zipf 1.1 --daemon 127.0.0.1:9471 >"$out/load.txt" 2>"$out/load.err" &
load=$!
sleep 15
"$out/kwb" changes --config config.toml --daemon 127.0.0.1:9471 --rate 1000 --duration 2m --settle 5s \
  --svg "$out/latency.svg" --json "$out/changes.json" | tee "$out/changes.txt"
wait $load
command psql -X -Atq "postgres://keepwarm@127.0.0.1:15432/postgres?sslmode=disable" \
  -c "select application_name, sync_state, replay_lag from pg_stat_replication where application_name = 'kwbench_standby'" | tee -a "$out/standby.txt"
curl -s 127.0.0.1:9471/metrics | grep -E "^keepwarm_(warmer_hot_expired|changes_(commit|visib|late|stale)|stream_resyncs|stream_transactions)" >"$out/metrics-end.txt" || true
kill -TERM $daemon; wait $daemon || true
uptime | tee -a "$out/changes.txt"
