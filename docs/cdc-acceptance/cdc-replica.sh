#!/bin/bash
set -u
out=/tmp/cdc-acc-replica; rm -rf $out; mkdir -p $out
redis-cli -p 25479 flushall >/dev/null
/tmp/cdc-kw run --config /tmp/cdc-replica.toml > $out/daemon.log 2>&1 & D=$!
sleep 2
/tmp/cdc-kwb load --config /tmp/cdc-replica.toml --duration 75s --workers 50 --zipf 1.1 --daemon 127.0.0.1:25471 > $out/load.txt 2>$out/load.err & L=$!
sleep 15
/tmp/cdc-kwb changes --config /tmp/cdc-replica.toml --daemon 127.0.0.1:25471 --rate 300 --duration 45s --settle 5s > $out/changes.txt 2>$out/changes.err
wait $L
curl -s 127.0.0.1:25471/metrics | grep -E "^keepwarm_changes_replay|^keepwarm_stream_apply_errors" > $out/metrics-end.txt
kill -TERM $D; wait $D; echo "daemon exit $?" >> $out/metrics-end.txt
