#!/usr/bin/env python3
"""halite-bench clones --json: the fields issue 14 names, and the counts that
must hold whatever the timings: the service reads and decodes every locality
block once for any number of clones, N independent restores N times; the
service's N idle clones cost less memory than N copies; the hot set cuts the
faults before a clone's first response. No timing is asserted."""
import json
import sys


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def main():
    with open(sys.argv[1]) as f:
        d = json.load(f)
    counts = [int(c) for c in sys.argv[2].split(",")]
    for k in ("machine", "params", "results", "hotset", "goals"):
        if k not in d:
            fail(f"no '{k}'")
    res = {(r["mode"], r["clones"]): r for r in d["results"]}
    if len(res) != 2 * len(counts) or len(d["results"]) != len(res):
        fail(f"results: {sorted(res)}, want both modes for {counts}")
    fields = ("ready_p50_s", "ready_p95_s", "attach_p50_s", "attach_p95_s",
              "first_response_p50_s", "first_response_p95_s", "all_in_s",
              "bytes_read", "lb_decoded", "faults", "pss_bytes")
    for key, r in res.items():
        for f in fields:
            if not isinstance(r.get(f), (int, float)) or r[f] < 0:
                fail(f"{key}: {f} = {r.get(f)!r}")
        if not r["ready_p50_s"] <= r["ready_p95_s"]:
            fail(f"{key}: p50 above p95")
        if r["faults"] <= 0 or r["bytes_read"] <= 0:
            fail(f"{key}: no faults or nothing read")
    one = res[("independent", 1)]
    for n in counts:
        ind, svc = res[("independent", n)], res[("service", n)]
        # Each restore reads every LB once; the service once for all clones.
        if ind["lb_decoded"] != n * one["lb_decoded"]:
            fail(f"independent x{n}: {ind['lb_decoded']} LBs decoded, want {n} x {one['lb_decoded']}")
        if ind["bytes_read"] != n * one["bytes_read"]:
            fail(f"independent x{n}: {ind['bytes_read']} bytes read, want {n} x {one['bytes_read']}")
        if svc["lb_decoded"] != one["lb_decoded"] or svc["bytes_read"] != one["bytes_read"]:
            fail(f"service x{n}: {svc['lb_decoded']} LBs / {svc['bytes_read']} bytes, "
                 f"want one restore's {one['lb_decoded']} / {one['bytes_read']}")
        if n > 1 and not svc["pss_bytes"] < ind["pss_bytes"]:
            fail(f"x{n}: service memory {svc['pss_bytes']} not below independent {ind['pss_bytes']}")
    top = counts[-1]
    if res[("service", top)]["pss_bytes"] > 2 * res[("service", 1)]["pss_bytes"]:
        fail(f"service: {top} idle clones cost more than twice one")
    h = d["hotset"]
    if not (h["hot_blocks"] > 0 and h["premapped_blocks"] == h["hot_blocks"]):
        fail(f"hot set: {h}")
    if not 2 * h["faults_before_first_response_with"] <= h["faults_before_first_response_without"]:
        fail(f"hot set did not halve the faults: {h}")
    print(f"ok: {len(res)} results, hot set {h['faults_before_first_response_without']} -> "
          f"{h['faults_before_first_response_with']} faults")


main()
