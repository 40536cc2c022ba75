#!/bin/bash
# run.sh NAME N [kill]: N keepwarm daemons (a fleet) + 3 load generators on the private Redis :28000 and the
# throwaway Chinook database; metrics scraped at 30 s and 90 s of a 100 s load; with "kill", daemon N is killed
# with SIGKILL at 50 s.
set -u
NAME=$1; N=$2; KILL=${3:-}
cd "${FLEET_DIR:-/tmp/fleet}"  # holds keepwarm, kwb, fleet.toml, scrape.py and report.py (docs/benchmarks.md §8)
OUT=$PWD/out/$NAME; rm -rf $OUT; mkdir -p $OUT
redis-cli -p 28000 flushall >/dev/null
redis-cli -p 28000 config resetstat >/dev/null
PIDS=(); PORTS=()
for i in $(seq 1 $N); do
  port=$((9600+i))
  KEEPWARM_DAEMON_LISTEN=127.0.0.1:$port KEEPWARM_FLEET_REPLICA_ID=r$i ./keepwarm run --config ${CFG:-fleet.toml} >$OUT/daemon$i.log 2>&1 &
  PIDS+=($!); PORTS+=($port)
done
for p in "${PORTS[@]}"; do
  for t in $(seq 1 100); do curl -sf http://127.0.0.1:$p/readyz >/dev/null && break; sleep 0.2; done
done
LPIDS=()
for j in 1 2 3; do
  ./kwb load --config ${CFG:-fleet.toml} --duration 100s --warmup 30s --workers 17 --seed $j --daemon 127.0.0.1:9601 >$OUT/load$j.txt 2>$OUT/load$j.err &
  LPIDS+=($!)
done
sleep 30; ./scrape.py $OUT/t0.json "${PORTS[@]}"; date -u +%T > $OUT/t0.time
if [ -n "$KILL" ]; then
  sleep 20; ./scrape.py $OUT/prekill.json "${PORTS[@]}"; kill -9 ${PIDS[$((N-1))]}; date -u +%T.%N > $OUT/kill.time
  sleep 40
else
  sleep 60
fi
./scrape.py $OUT/t1.json "${PORTS[@]}"; date -u +%T > $OUT/t1.time
wait "${LPIDS[@]}"
sleep 2; ./scrape.py $OUT/final.json "${PORTS[@]}"
for pid in "${PIDS[@]}"; do kill -TERM $pid 2>/dev/null; done
wait "${PIDS[@]}" 2>/dev/null
./report.py $OUT/t0.json $OUT/t1.json 60 > $OUT/report.txt
cat $OUT/report.txt
