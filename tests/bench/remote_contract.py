#!/usr/bin/env python3
"""bench/remote.py --quick against a real store (run_with_store.sh starts
it): every peer of issue 26 at every RTT, and the counts that must hold
whatever the timings. The engine's own count of store requests equals the
proxy's; a second restore on the same host sends none for LBs (every LB a
cache hit); the physical-chunk peer has 4 MiB LBs, one GET each; the
page-granular peer makes one GET of 4 KiB per fetched page, and every page
it fetched equals the image's; the summary's goal ratios are the medians'
quotients. No timing is asserted.

  remote_contract.py SOURCE_DIR BUILD_DIR"""
import json
import os
import subprocess
import sys

PEERS = ("lazy", "physical", "pages", "cache_fill", "cached", "eager")
ENGINE = ("lazy", "physical", "cache_fill", "cached")
PAGE = 4096


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def num(r, k, what):
    v = r.get(k)
    check(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
          f"{what}: {k} = {v!r}")
    return v


def check_engine(r, what):
    es = r["engine_store"]
    check(es is not None, f"{what}: no engine_store")
    check(r["lb_demand"] + r["lb_prefetch"] == r["lb_total"],
          f"{what}: {r['lb_demand']} demand + {r['lb_prefetch']} prefetched LBs, "
          f"not {r['lb_total']}")
    # The proxy saw exactly the requests the engine says it sent.
    check(es["requests"] == r["store_requests"],
          f"{what}: the engine counted {es['requests']} requests, the proxy {r['store_requests']}")
    check(es["lb_requests"] == es["requests"] - es["open_requests"],
          f"{what}: lb_requests {es['lb_requests']} is not requests - open_requests")
    check(es["open_requests"] <= es["requests_before_first"] <= es["requests"],
          f"{what}: requests before the first access {es['requests_before_first']} "
          f"outside [{es['open_requests']}, {es['requests']}]")
    check(r["requests_before_first"] == es["requests_before_first"],
          f"{what}: requests_before_first is not the engine's")
    check(es["retries"] == 0, f"{what}: {es['retries']} retries against a local store")


def check_rtt(d, rtt, local):
    rs = {r["peer"]: r for r in d["results"] if r["rtt_ms"] == rtt}
    check(sorted(rs) == sorted(PEERS), f"RTT {rtt}: peers {sorted(rs)}, want {sorted(PEERS)}")
    for p, r in rs.items():
        what = f"{p} at {rtt} ms"
        check(r["digest_ok"] is True, f"{what}: memory differs")
        for k in ("first_access_s", "all_first_access_s", "store_requests", "store_bytes",
                  "requests_before_first", "bytes_before_first"):
            num(r, k, what)
        check(r["first_access_s"] <= r["all_first_access_s"], f"{what}: first after all-first")
        check(r["store_requests"] > 0, f"{what}: no store request")
        if p != "pages":
            check(r["mem_xxh3"] == local["mem_xxh3"], f"{what}: digest {r['mem_xxh3']}")
            num(r, "done_s", what)
            check(r["lb_total"] == (d["physical"]["lb_count"] if p == "physical"
                                    else local["lb_total"]), f"{what}: lb_total {r['lb_total']}")
        if p in ENGINE:
            check_engine(r, what)
    lazy, phys, fill, cached = rs["lazy"], rs["physical"], rs["cache_fill"], rs["cached"]
    check(lazy["engine_store"]["cache"] is None, "lazy: a cache counted without one")
    # A second restore on the same host: only the open goes to the store.
    cf, cc = fill["engine_store"]["cache"], cached["engine_store"]["cache"]
    check(cf["hits"] == 0 and cf["misses"] == cf["puts"] == fill["lb_total"],
          f"cache_fill at {rtt} ms: cache {cf}, {fill['lb_total']} LBs")
    check(cached["store_lb_requests"] == 0 and cached["engine_store"]["lb_requests"] == 0,
          f"cached at {rtt} ms: {cached['store_lb_requests']} LB requests, want 0")
    check(cc["hits"] == cached["lb_total"] and cc["misses"] == 0 and cc["puts"] == 0,
          f"cached at {rtt} ms: cache {cc}, {cached['lb_total']} LBs")
    check(cached["store_requests"] == cached["engine_store"]["open_requests"],
          f"cached at {rtt} ms: {cached['store_requests']} requests, not the open's")
    check(cached["cache_hits"] == cached["lb_total"], "cached: cache_hits at the top")
    # The physical-chunk peer: 4 MiB LBs, each one GET (no LB is split or joined).
    check(phys["engine_store"]["lb_requests"] == phys["lb_total"],
          f"physical at {rtt} ms: {phys['engine_store']['lb_requests']} GETs for "
          f"{phys['lb_total']} LBs")
    # The page-granular peer: one 4 KiB GET per fetched page, each page checked.
    pg = rs["pages"]
    es = pg["engine_store"]
    check(pg["done_s"] is None and pg["mem_xxh3"] is None, "pages: all-in or a digest")
    check(pg["pages_fetched"] > 0 and pg["pages_checked"] == pg["pages_fetched"] and
          pg["pages_differ"] == 0, f"pages at {rtt} ms: {pg['pages_fetched']} fetched, "
          f"{pg['pages_checked']} checked, {pg['pages_differ']} differ")
    check(pg["faults"] >= pg["pages_fetched"], "pages: fewer faults than pages")
    check(es["requests"] == pg["pages_fetched"] == pg["store_requests"] and
          es["bytes"] == PAGE * pg["pages_fetched"],
          f"pages at {rtt} ms: {es['requests']} GETs / {es['bytes']} bytes for "
          f"{pg['pages_fetched']} pages, the proxy {pg['store_requests']}")
    check(0 < pg["requests_before_first"] <= pg["pages_fetched"],
          f"pages: {pg['requests_before_first']} GETs before the first access")
    # Eager: everything was pulled before the restore began.
    eg = rs["eager"]
    check(eg["requests_before_first"] == eg["store_requests"] and
          eg["store_bytes"] >= d["file_bytes"], f"eager at {rtt} ms: {eg['store_requests']} "
          f"requests, {eg['store_bytes']} bytes of {d['file_bytes']}")


def check_summary(d):
    rows = {s["rtt_ms"]: s for s in d["summary"]}
    check(sorted(rows) == sorted(d["rtts_ms"]), f"summary RTTs {sorted(rows)}")
    for rtt, s in rows.items():
        for p in ("local",) + PEERS:
            for k in ("first_access_s", "store_requests", "requests_before_first"):
                check(f"{p}_{k}" in s, f"summary at {rtt} ms: no {p}_{k}")
        for k, a, b in (("lazy_first_vs_local", "lazy_first_access_s", "local_first_access_s"),
                        ("lazy_first_vs_eager", "lazy_first_access_s", "eager_first_access_s"),
                        ("physical_first_vs_lazy", "physical_first_access_s",
                         "lazy_first_access_s"),
                        ("lazy_requests_before_first_vs_physical",
                         "lazy_requests_before_first", "physical_requests_before_first")):
            check(abs(s[k] - s[a] / s[b]) < 1e-9, f"summary at {rtt} ms: {k} {s[k]}")
        g = s["goals"]
        for k in ("first_within_2x_local", "first_at_most_third_of_eager",
                  "fewer_requests_before_first_than_physical",
                  "first_1_5x_faster_than_physical"):
            check(isinstance(g.get(k), bool), f"summary at {rtt} ms: goal {k} = {g.get(k)!r}")
        check(g["cached_no_lb_requests"] is True, f"summary at {rtt} ms: cached LB requests")
        check(s["cached_store_lb_requests"] == 0, f"summary at {rtt} ms: cached LB requests")


def main():
    src, build = sys.argv[1], sys.argv[2]
    p = subprocess.run([sys.executable, os.path.join(src, "bench", "remote.py"), "--quick",
                        "--build", build, "--pages-window", "500"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    sys.stderr.write(p.stderr[-3000:])
    if p.returncode == 77:
        print("SKIP: " + p.stderr.strip()[-300:], file=sys.stderr)
        return 77
    try:
        d = json.loads(p.stdout)
    except ValueError:
        fail(f"exit {p.returncode}, no JSON: {p.stdout[-300:]!r}")
    check(p.returncode == 0 and "error" not in d, f"exit {p.returncode}: {d.get('error')}")
    check(d["bench"] == "remote" and d["runs"] == 1 and d["rtts_ms"] == [0, 20],
          f"bench {d['bench']}, runs {d['runs']}, RTTs {d['rtts_ms']}")
    ph = d["physical"]
    check(ph["physical_lb_size"] == 4 << 20 and ph["compressed"] is True and ph["lb_count"] > 0,
          f"physical: {ph}")
    locals_ = [r for r in d["results"] if r["peer"] == "local"]
    check(len(locals_) == 1 and locals_[0]["store_requests"] == 0 and
          locals_[0]["engine_store"] is None, f"local: {locals_}")
    for rtt in d["rtts_ms"]:
        check_rtt(d, rtt, locals_[0])
    check_summary(d)
    print(f"remote contract: ok ({len(d['results'])} restores, {d['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
