#!/usr/bin/env python3
# scrape.py OUT PORT... : sums selected counters from each daemon's /metrics into OUT (json), plus INFO commandstats.
import json, sys, urllib.request, subprocess, re
out, ports = sys.argv[1], sys.argv[2:]
res = {"daemons": {}}
for p in ports:
    try:
        txt = urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=5).read().decode()
    except Exception as e:
        res["daemons"][p] = {"error": str(e)}
        continue
    open(out + "." + p + ".prom", "w").write(txt)
    d = {}
    for line in txt.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r'^(\w+)(\{[^}]*\})? (\S+)$', line)
        if not m:
            continue
        name, labels, v = m.group(1), m.group(2) or "", float(m.group(3))
        key = None
        if name == "keepwarm_redis_commands_total": key = "redis_commands"
        elif name == "keepwarm_warmer_origin_queries_total": key = "origin_queries"
        elif name == "keepwarm_warmer_origin_rows_total": key = "origin_rows"
        elif name == "keepwarm_warmer_refreshes_total" and 'result="ok"' in labels: key = "refresh_ok"
        elif name == "keepwarm_warmer_refreshes_total" and 'result="fresh"' in labels: key = "refresh_fresh"
        elif name == "keepwarm_warmer_refreshes_total" and 'result="locked"' in labels: key = "refresh_locked"
        elif name == "keepwarm_warmer_hot_expired_total": key = "hot_expired"
        elif name == "keepwarm_warmer_hot_late_notice_total": key = "late_notice"
        elif name == "keepwarm_warmer_keys_owned": key = "owned"
        elif name == "keepwarm_warmer_keys_hot": key = "hot"
        elif name == "keepwarm_warmer_fleet_members" and 'state="live"' in labels: key = "members"
        if key:
            d[key] = d.get(key, 0) + v
        if name == "keepwarm_redis_commands_total":
            c = re.search(r'command="([^"]+)"', labels).group(1)
            d.setdefault("by_command", {})[c] = d.get("by_command", {}).get(c, 0) + v
    res["daemons"][p] = d
info = subprocess.run(["redis-cli", "-p", "28000", "info", "commandstats"], capture_output=True, text=True).stdout
res["redis_calls"] = sum(int(m) for m in re.findall(r'calls=(\d+)', info))
json.dump(res, open(out, "w"))
