#!/usr/bin/env python3
# Checks the JSON halite-bench printed (contract.sh) against issue 5's
# machine-readable contract and against itself: field names and types,
# every name once per condition, and counts that must hold whatever the
# timings (a completed restore reads each locality block once; the reads a
# fault waited for are a part of all reads; content exact). Timings are only
# checked to be numbers.
import json
import sys

NAMES = ["random", "physical", "locality", "halite", "eager", "4k-on-demand", "mmap-private",
         "working-set"]
ORGS = NAMES[:4]
LB = 65536


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def num(v, what, null_ok=False):
    if v is None and null_ok:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        fail(f"{what}: {v!r} is not a number")


micro = json.load(open(sys.argv[1]))
fault = json.load(open(sys.argv[2]))

for k in ("machine", "params", "results", "baseline_s", "files"):
    if k not in micro:
        fail(f"micro: no '{k}'")
num(micro["baseline_s"], "baseline_s")
conds = {}
for r in micro["results"]:
    for k in ("name", "kind", "restore_overhead_s", "first_access_s", "storage_reads",
              "bytes_read", "vm_access_pct", "vm_access_lbs", "read_latency_us", "cache",
              "demand_reads",
              "demand_faults", "ok"):
        if k not in r:
            fail(f"micro result {r.get('name')}: no '{k}'")
    what = f"{r['name']} {r['cache']} {r['read_latency_us']} us"
    if r["name"] not in NAMES:
        fail(f"{what}: unknown name")
    if r["kind"] != ("organisation" if r["name"] in ORGS else "peer"):
        fail(f"{what}: kind {r['kind']}")
    if r["ok"] is not True:
        fail(f"{what}: not ok: {r.get('error')}")
    if r.get("content") not in (None, "exact"):
        fail(f"{what}: content {r['content']}")
    num(r["restore_overhead_s"], what + " restore_overhead_s")
    num(r["first_access_s"], what + " first_access_s")
    for k in ("storage_reads", "demand_reads", "bytes_read", "demand_faults"):
        if not isinstance(r[k], int) or r[k] < 0:
            fail(f"{what}: {k} {r[k]!r}")
    if r["demand_reads"] > r["storage_reads"]:
        fail(f"{what}: {r['demand_reads']} demand reads of {r['storage_reads']}")
    if r["name"] in ORGS:
        lbs = micro["files"][r["name"]]["lbs"]
        # A completed restore reads every LB exactly once (no retries here).
        if r["storage_reads"] != lbs or r["bytes_read"] != lbs * LB:
            fail(f"{what}: {r['storage_reads']} reads, {r['bytes_read']} bytes; file has "
                 f"{lbs} LBs")
        # Of the LBs its TRACK_ACCESS run read on demand: none (all prefetched
        # first, as under load they may be), no percentage.
        if not isinstance(r["vm_access_lbs"], int) or r["vm_access_lbs"] < 0:
            fail(f"{what}: vm_access_lbs {r['vm_access_lbs']!r}")
        elif r["vm_access_lbs"] == 0:
            if r["vm_access_pct"] is not None:
                fail(f"{what}: vm_access_pct {r['vm_access_pct']} of no demand-read LB")
        else:
            num(r["vm_access_pct"], what + " vm_access_pct")
            if not 0 <= r["vm_access_pct"] <= 100:
                fail(f"{what}: vm_access_pct {r['vm_access_pct']}")
    elif r["vm_access_pct"] is not None or r["vm_access_lbs"] is not None:
        fail(f"{what}: a peer with vm_access_pct {r['vm_access_pct']}")
    if r["name"] == "eager" and (r["demand_reads"] or r["demand_faults"]):
        fail(f"{what}: eager with demand reads or faults")
    if r["name"] == "4k-on-demand" and (r["storage_reads"] != r["demand_faults"] or
                                        r["bytes_read"] != 4096 * r["storage_reads"]):
        fail(f"{what}: 4 KiB per fault does not add up")
    conds.setdefault((r["cache"], r["read_latency_us"]), []).append(r["name"])
want = {(c, l) for c in ("warm", "cold") for l in (0, 100)}
if set(conds) != want:
    fail(f"conditions {sorted(conds)}, want {sorted(want)}")
for c, names in conds.items():
    if sorted(names) != sorted(NAMES):
        fail(f"condition {c}: names {names}")
for r in micro.get("vm_access_runs", []):
    e = r.get("engine") or fail(f"vm access run {r['name']}: no engine stats")
    if e["demand_reads"] + e["prefetch_reads"] != e["lbs"]:
        fail(f"vm access run {r['name']}: demand + prefetch reads != LBs")
    if e["mb_fault"] + e["mb_pool"] + e["mb_prefetch"] + e["mb_zero"] != \
            micro["save"]["mb_total"]:
        fail(f"vm access run {r['name']}: installs do not add up to the blocks")

conds = fault.get("conditions") or fail("fault: no conditions")
if sorted(c["cache"] for c in conds) != ["cold", "warm"]:
    fail(f"fault: caches {[c['cache'] for c in conds]}")
for c in conds:
    for k in ("engine_fault_p50_us", "lb_read_p50_us", "decompress_p50_us", "limit_us",
              "ratio"):
        num(c.get(k), f"fault {c['cache']}: {k}")
    if abs(c["ratio"] - c["engine_fault_p50_us"] / c["limit_us"]) > 0.01 * c["ratio"]:
        fail(f"fault {c['cache']}: ratio is not engine p50 / limit")
    if c["within_1_5x"] != (c["ratio"] <= 1.5):
        fail(f"fault {c['cache']}: within_1_5x disagrees with the ratio")
print(f"micro: {len(micro['results'])} results over {len(want)} conditions, counts consistent; "
      f"fault: {len(conds)} conditions")
