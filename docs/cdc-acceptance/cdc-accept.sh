#!/bin/bash
# Acceptance run of change-driven refresh (issue 15), on a private PostgreSQL (25432) and redis-server (25479).
# usage: cdc-accept.sh clean|faults
set -u
mode=$1; out=/tmp/cdc-acc-$mode; rm -rf $out; mkdir -p $out; CFG=${CFG:-/tmp/cdc.toml}; SETTLE=${SETTLE:-5s}
PGBIN=$(cat /tmp/cdcpg/bin)
redis-cli -p 25479 flushall >/dev/null
start_daemon() { /tmp/cdc-kw run --config $CFG >>$out/daemon.log 2>&1 & echo $! > $out/daemon.pid; }
start_daemon
sleep 2
/tmp/cdc-kwb load --config $CFG --duration 2m35s --workers 50 --zipf 1.1 --daemon 127.0.0.1:25471 > $out/load.txt 2>$out/load.err &
LOAD=$!
sleep 15
/tmp/cdc-kwb changes --config $CFG --daemon 127.0.0.1:25471 --rate 1000 --duration 2m --settle $SETTLE \
  --svg $out/latency.svg --json $out/changes.json > $out/changes.txt 2>$out/changes.err &
CH=$!
if [ "$mode" = faults ]; then
  sleep 40; echo "$(date +%T.%N) kill -9 daemon" >> $out/events
  kill -9 $(cat $out/daemon.pid); wait $(cat $out/daemon.pid) 2>/dev/null; start_daemon; echo "$(date +%T.%N) daemon restarted" >> $out/events
  sleep 40; echo "$(date +%T.%N) restart postgres" >> $out/events
  runuser -u postgres -- $PGBIN/pg_ctl -D /tmp/cdcpg/data -m fast -w restart -l /tmp/cdcpg/postgres.log -o "-c listen_addresses=127.0.0.1 -p 25432 -c unix_socket_directories=/tmp/cdcpg -c max_connections=200 -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" >> $out/events 2>&1
  echo "$(date +%T.%N) postgres up" >> $out/events
fi
wait $CH; wait $LOAD
curl -s 127.0.0.1:25471/metrics | grep -E "^keepwarm_(warmer_hot_expired|warmer_refresh_errors|changes_|stream_)" > $out/metrics-end.txt
kill -TERM $(cat $out/daemon.pid); wait $(cat $out/daemon.pid) 2>/dev/null; echo "daemon exit $?" >> $out/events
uptime >> $out/events
