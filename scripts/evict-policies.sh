#!/bin/bash
# For each maxmemory-policy: a private redis-server on 29002 with maxmemory 16 MB; 20,000 cached values of 300 B
# with TTL 1h (meta off, as keepwarm writes them by default), plus the same with a meta hash each (meta on), an
# access set of 2,000 members (no TTL), then 40 MB of app keys without TTL written over it. Then: is the access
# set still there, how many values survived, how many meta hashes outlived their values.
P=29002
V=$(head -c 300 /dev/zero | tr '\0' v)
for meta in off on; do
for policy in allkeys-lru allkeys-lfu volatile-lru volatile-lfu volatile-ttl; do
  dir=$(mktemp -d)
  redis-server --port $P --bind 127.0.0.1 --save '' --appendonly no --dir $dir --maxmemory 16mb --maxmemory-policy $policy --daemonize yes --logfile $dir/log >/dev/null
  sleep 0.5
  # values (and meta hashes), pipelined
  { for i in $(seq 1 20000); do
      echo "SET val:$i $V PX 3600000"
      [ $meta = on ] && echo "HSET meta:val:$i written_ms 1764500000000 delta_ms 3" && echo "PEXPIRE meta:val:$i 3600000"
    done
    for i in $(seq 1 2000); do echo "ZADD keepwarm:access:val $i $i"; done
  } | redis-cli -p $P --pipe >/dev/null
  # reads of the hot values (the first 2,000 ids), as apps do, so LRU/LFU see them as hot
  for r in 1 2 3; do for i in $(seq 1 2000); do echo "GET val:$i"; done; done | redis-cli -p $P --pipe >/dev/null
  before=$(redis-cli -p $P dbsize)
  # 40 MB of app data without TTL
  redis-benchmark -p $P -q -t set -d 300 -n 130000 -r 130000 -P 64 >/dev/null 2>&1
  access=$(redis-cli -p $P exists keepwarm:access:val)
  vals=$(redis-cli -p $P eval "return #redis.call('keys','val:*')" 0)
  hot=$(redis-cli -p $P eval "local n=0 for i=1,2000 do n=n+redis.call('exists','val:'..i) end return n" 0)
  metas=$(redis-cli -p $P eval "local n=0 for _,k in ipairs(redis.call('keys','meta:val:*')) do if redis.call('exists',string.sub(k,6))==0 then n=n+1 end end return n" 0)
  evicted=$(redis-cli -p $P info stats | grep evicted_keys | tr -d '\r' | cut -d: -f2)
  oom=$(redis-cli -p $P info stats | grep -c rejected)
  appkeys=$(redis-cli -p $P eval "return #redis.call('keys','key:*')" 0)
  echo "meta=$meta policy=$policy keys_before=$before access_set_kept=$access values_kept=$vals/20000 hot_values_kept=$hot/2000 orphaned_meta=$metas evicted=$evicted app_keys_stored=$appkeys/~130000"
  redis-cli -p $P shutdown nosave >/dev/null 2>&1
  rm -rf $dir
done
done
