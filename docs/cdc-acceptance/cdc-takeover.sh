#!/bin/bash
# Two daemons on one slot: kill -9 the streaming one and time the standby's takeover (lease + streaming).
set -u
out=/tmp/cdc-acc-takeover; mkdir -p $out; : > $out/events
P='postgres://keepwarm@127.0.0.1:25432/chinook?sslmode=disable'
KEEPWARM_DAEMON_LISTEN=127.0.0.1:25471 /tmp/cdc-kw run --config /tmp/cdc.toml > $out/a.log 2>&1 & A=$!
sleep 3
KEEPWARM_DAEMON_LISTEN=127.0.0.1:25472 /tmp/cdc-kw run --config /tmp/cdc.toml > $out/b.log 2>&1 & B=$!
state() { curl -s --max-time 1 127.0.0.1:$1/debug/stream | sed -n 's/.*"lease":{[^}]*"state":"\([a-z]*\)".*"stream":{[^}]*"state":"\([a-z]*\)".*/\1 \2/p'; }
for i in $(seq 50); do [ "$(state 25472)" = "standby stopped" ] && break; sleep 0.2; done
echo "a: $(state 25471); b: $(state 25472)" >> $out/events
/tmp/cdc-kwb changes --config /tmp/cdc.toml --rate 200 --duration 25s --settle 3s --daemon '' > $out/changes.txt 2>$out/changes.err & CH=$!
sleep 8
t0=$(date +%s.%N); kill -9 $A; echo "$(date +%T.%N) kill -9 a (pid $A)" >> $out/events
while [ "$(state 25472)" != "holder streaming" ]; do sleep 0.05; done
t1=$(date +%s.%N); echo "$(date +%T.%N) b: holder streaming" >> $out/events
python3 -c "print('takeover: %.2f s after kill -9' % ($t1 - $t0))" >> $out/events
wait $CH
curl -s 127.0.0.1:25472/metrics | grep -E "^keepwarm_stream_(lease|resyncs|reconnects)" >> $out/events
kill -TERM $B; wait $B; echo "b exit $?" >> $out/events
