#!/usr/bin/env python3
# report.py T0.json T1.json SECONDS [FINAL.json]: per-second rates of the daemons' sums over the window.
import json, sys
a, b, secs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
def tot(s, k, ports=None):
    return sum(d.get(k, 0) for p, d in s["daemons"].items() if (ports is None or p in ports) and "error" not in d)
live = [p for p, d in b["daemons"].items() if "error" not in d]
# for a daemon killed inside the window, its counters from t0 to its death are lost: count only daemons alive at both ends
ports = [p for p in live if "error" not in a["daemons"].get(p, {"error": 1})]
r = lambda k: (tot(b, k, ports) - tot(a, k, ports)) / secs
rows = tot(b, "origin_rows", ports) - tot(a, "origin_rows", ports)
ok = tot(b, "refresh_ok", ports) - tot(a, "refresh_ok", ports)
print(f"daemons alive at both ends: {len(ports)} of {len(b['daemons'])}")
print(f"daemon redis commands/s {r('redis_commands'):.1f}  origin queries/s {r('origin_queries'):.2f}  origin rows/s {r('origin_rows'):.2f}  ok refreshes/s {r('refresh_ok'):.2f}  fresh/s {r('refresh_fresh'):.2f}  locked/s {r('refresh_locked'):.2f}")
print(f"rows per ok refresh (rebuilds per written value, daemon side) {rows/ok if ok else float('nan'):.3f}")
print(f"redis calls/s, all clients (INFO commandstats, scripts' inner calls included) {(b['redis_calls']-a['redis_calls'])/secs:.0f}")
byc = {}
for p in ports:
    for c, v in b["daemons"][p].get("by_command", {}).items():
        byc[c] = byc.get(c, 0) + v - a["daemons"][p].get("by_command", {}).get(c, 0)
print("daemon commands/s by command: " + ", ".join(f"{c} {v/secs:.1f}" for c, v in sorted(byc.items(), key=lambda x: -x[1])))
for p in sorted(b["daemons"]):
    d = b["daemons"][p]
    print(f"  daemon :{p}: " + ("gone (" + d["error"][:40] + ")" if "error" in d else f"hot {d.get('hot',0):.0f} owned {d.get('owned',0):.0f} members {d.get('members',0):.0f} hot_expired {d.get('hot_expired',0):.0f} late_notice {d.get('late_notice',0):.0f}"))
