#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""halite-inspect relayout, end to end.

Snapshots come from `import` (gen_image.py's deterministic images); learning
traces (docs/restore-trace.md, version 2) are written here from the file's
`map`, so the touches are exactly the ones a test plans. Checked:
  - every byte kept: `extract` of every region byte-identical to the
    source's, `verify` passes, each memory block's state, stored length and
    compressed flag unchanged (copied, not re-encoded), for all four codecs;
  - the merge: the exact order of a hand-made case (counts, median rank,
    vCPU vote, rounds, 'other' for a thread that is not a vCPU), and the
    same output map and LB table whatever the order of the traces;
  - the hot prefix where halite.relayout says: the first hot-lbs LBs hold
    exactly the hot blocks; the rest in the source's order; --hot-max;
  - refusals: another file's trace (uuid), a version 1 trace, a failed
    restore's, OUT an input, the usage errors; nothing written for any.

  - what import never writes carried over (inspect_mkfile's file): vCPU,
    virtual and physical streams, page-table roots, device state, save
    statistics, binary and list metadata.

  relayout.py HALITE_INSPECT GEN_IMAGE_PY INSPECT_MKFILE
Exit 0 pass, 1 fail.
"""
import atexit
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

HI, GEN, MKFILE = sys.argv[1], sys.argv[2], sys.argv[3]
T = tempfile.mkdtemp(prefix="hi-relayout.")
atexit.register(shutil.rmtree, T, True)  # on every exit, a failed check's too
STATS = ["ready_ns", "duration_ns", "mb_total", "mb_fault", "mb_pool", "mb_prefetch",
         "mb_zero", "faults", "faults_cached", "faults_zero", "faults_vcpu", "lb_total",
         "lb_demand", "lb_prefetch", "lb_retries", "bytes_read", "mb_staged",
         "mb_staged_accessed", "vm_access_pct", "fault_p50_ns", "fault_p99_ns", "done", "error"]
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg, file=sys.stderr)


def check(cond, msg):
    if not cond:
        fail(msg)
    return cond


def p(name):
    return os.path.join(T, name)


def run(*args):
    r = subprocess.run([HI] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stdout, r.stderr


def ok_json(*args):
    rc, out, err = run(*args)
    if rc != 0:
        raise SystemExit("FAIL: %s: exit %d: %s" % (" ".join(map(str, args)), rc, err))
    return json.loads(out)


def image(name, layout, pages, seed=1):
    subprocess.run([sys.executable, GEN, "--out", p(name), "--pages", str(pages), "--layout",
                    layout, "--seed", str(seed)], check=True)
    return p(name)


def mbs(f):
    return ok_json("map", "--json", f)["mbs"]


def lbs(f):
    return ok_json("blocks", "--json", f)["lbs"]


def info(f):
    return ok_json("info", "--json", f)


def trace(f, out, touches, version=2, done=True, uuid=None, error=-5):
    """A learning trace of f: touches is [(vcpu or '-', mb)], in touch order."""
    i = info(f)
    m = mbs(f)
    v = dict.fromkeys(STATS, "0")
    v.update(mb_total=i["mbs"]["count"], lb_total=i["lbs"]["count"],
             lb_prefetch=i["lbs"]["count"] if done else 0, vm_access_pct="-1.00",
             done=1 if done else 0, error=0 if done else error)
    L = ["halite-restore-trace %d" % version, "file-uuid " + (uuid or i["uuid"])]
    L += ["stat %s %s" % (n, v[n]) for n in STATS]
    if done:
        L += ["lb %d prefetch %d - 0 0" % (k, k) for k in range(i["lbs"]["count"])]
    if version == 2:
        L.append("learn 1000 1")
        for k, (vcpu, mb) in enumerate(touches):
            L.append("touch %d %s %d %s" % (100 * k, vcpu, mb, m[mb]["state"]))
    with open(out, "w") as fh:
        fh.write("".join(l + "\n" for l in L))
    return out


def relayout_meta(f):
    meta = info(f)["metadata"]
    return dict(kv.split("=") for kv in meta["halite.relayout"].split())


def check_same_bytes(src, out, regions, what):
    """extract, verify, and the map's per-block facts (not the places)."""
    rc, _, err = run("verify", out)
    check(rc == 0, "%s: verify %s: %s" % (what, out, err))
    for r in regions:
        a, b = p("a.img"), p("b.img")
        for f, img in ((src, a), (out, b)):
            rc, _, err = run("extract", "--region", r, "-o", img, f)
            check(rc == 0, "%s: extract %s of %s: %s" % (what, r, f, err))
        with open(a, "rb") as x, open(b, "rb") as y:
            check(x.read() == y.read(), "%s: region %s differs after relayout" % (what, r))
    ms, mo = mbs(src), mbs(out)
    keys = ("state", "length", "compressed", "bytes", "gpa", "region")
    check([[m.get(k) for k in keys] for m in ms] == [[m.get(k) for k in keys] for m in mo],
          "%s: a memory block's state, stored length or compressed flag changed" % what)
    si, oi = info(src), info(out)
    for k in ("codec", "codec_level", "page_size", "mb_pages", "mb_size", "lb_size", "regions"):
        check(si[k] == oi[k], "%s: %s not carried over: %s, %s" % (what, k, si[k], oi[k]))
    check(si["uuid"] != oi["uuid"], "%s: the output has the source's uuid" % what)


def check_hot_prefix(src, out, what):
    """The first hot-lbs LBs hold the hot blocks and nothing else; the rest keep src's order."""
    meta = relayout_meta(out)
    k, nhot = int(meta["hot-lbs"]), int(meta["hot-blocks"])
    check(meta["source-uuid"] == info(src)["uuid"], "%s: source-uuid" % what)
    mo = mbs(out)
    hot = [m["mb"] for m in mo if m["state"] == "stored" and m["lb"] < k]
    check(len(hot) == nhot, "%s: %d blocks in the first %d LBs, metadata says %d" %
          (what, len(hot), k, nhot))
    lo = lbs(out)
    check(len(lo) == int(info(out)["lbs"]["count"]), "%s: blocks" % what)
    check(all(l["stream"].startswith("vcpu") or l["stream"] == "other" for l in lo[:k]),
          "%s: a hot LB outside a vcpu/other stream" % what)
    # The cold blocks: in each stream, in the source's order (by LB, then place
    # in it). Across streams the LBs interleave as they fill, as in a save.
    place = lambda m: (m["lb"], m["lb_offset"])
    ms, ls, lo = mbs(src), lbs(src), lbs(out)
    for stream in set(l["stream"] for l in ls):
        cold_src = [m["mb"] for m in sorted((m for m in ms if m["state"] == "stored" and
                                             m["mb"] not in hot and
                                             ls[m["lb"]]["stream"] == stream), key=place)]
        cold_out = [m["mb"] for m in sorted((m for m in mo if m["state"] == "stored" and
                                             m["mb"] not in hot and
                                             lo[m["lb"]]["stream"] == stream), key=place)]
        check(cold_src == cold_out, "%s: stream %s: the blocks after the hot prefix left "
              "the save's order: %s, %s" % (what, stream, cold_src, cold_out))
    check(all(place(m)[0] >= k for m in mo if m["state"] == "stored" and m["mb"] not in hot),
          "%s: a cold block inside the hot prefix" % what)
    src_streams = {m["mb"]: ls[m["lb"]]["stream"] for m in ms if m["state"] == "stored"}
    check(all(lo[m["lb"]]["stream"] == src_streams[m["mb"]] for m in mo
              if m["state"] == "stored" and m["mb"] not in hot),
          "%s: a cold block left its stream" % what)
    return k, hot


def stored(f):
    return [m["mb"] for m in mbs(f) if m["state"] == "stored"]


# ---- every byte kept, all four codecs, two regions.
ra = image("ra.img", "rrttzzhhmmrrtt", 112, seed=3)
rb = image("rb.img", "mmttrrzz", 64, seed=4)
for codec in ("none", "lz4", "zlib", "zstd"):
    src = p("src-%s.hlt" % codec)
    ok_json("import", "--region", "a=" + ra, "--region", "b=" + rb, "-o", src, "--no-sync",
            "--codec", codec, "--order", "random", "--seed", "7", "--lb-size", "16K",
            "--meta", "owner=test", "--json")
    st = stored(src)
    # Two vCPUs and a non-vCPU thread, touching every third stored block.
    t1 = trace(src, p("t1-%s" % codec),
               [(("0", "1", "-")[k % 3], mb) for k, mb in enumerate(st[::3])])
    t2 = trace(src, p("t2-%s" % codec),
               [(("1", "0")[k % 2], mb) for k, mb in enumerate(reversed(st[::2]))])
    out = p("out-%s.hlt" % codec)
    d = ok_json("relayout", src, "--trace", t1, "--trace", t2, "-o", out, "--no-sync", "--json")
    check(list(d) == ["file", "output", "traces", "source_uuid", "uuid", "hot_max",
                      "touched_blocks", "hot_lbs", "hot_blocks", "hot_bytes", "cut_blocks",
                      "lb_count", "hot_streams", "mbs", "ok"], "JSON keys: %s" % list(d))
    touched = set(st[::3]) | set(st[::2])
    check(d["touched_blocks"] == len(touched) and d["hot_blocks"] == len(touched) and
          d["cut_blocks"] == 0 and d["hot_max"] is None, "%s: counts %s" % (codec, d))
    check(d["mbs"] == {k: info(src)["mbs"][k] for k in ("stored", "zero", "untouched")},
          "%s: mbs %s" % (codec, d["mbs"]))
    check(relayout_meta(out) == {"traces": "2", "hot-lbs": str(d["hot_lbs"]),
                                 "hot-blocks": str(d["hot_blocks"]),
                                 "source-uuid": d["source_uuid"]},
          "%s: metadata %s" % (codec, relayout_meta(out)))
    check(info(out)["metadata"]["owner"] == "test" and
          info(out)["metadata"]["import.seed"] == "7", "%s: metadata not carried" % codec)
    check(d["uuid"] == info(out)["uuid"], "%s: uuid" % codec)
    check_same_bytes(src, out, ("a", "b"), codec)
    k, hot = check_hot_prefix(src, out, codec)
    check(sorted(hot) == sorted(touched), "%s: hot set %s" % (codec, sorted(hot)))
    check(k == d["hot_lbs"] and k > 0, "%s: hot_lbs" % codec)
    # Relayouted again: its own record replaces the old one, the bytes still the same.
    out2 = p("out2-%s.hlt" % codec)
    t3 = trace(out, p("t3-%s" % codec), [("0", stored(out)[-1])])
    d2 = ok_json("relayout", out, "--trace", t3, "-o", out2, "--no-sync", "--json")
    check(relayout_meta(out2)["source-uuid"] == d["uuid"] and d2["hot_blocks"] == 1,
          "%s: relayout of a relayouted file: %s" % (codec, relayout_meta(out2)))
    check_same_bytes(src, out2, ("a", "b"), codec + " twice")
    # The source's trace does not apply to the output: another file's uuid.
    rc, o, e = run("relayout", out, "--trace", t1, "-o", p("x.hlt"), "--json")
    check(rc == 2 and "is not the uuid of" in e and t1 in e and
          json.loads(o)["exit"] == 2, "%s: a source trace on the output: %d %s" % (codec, rc, e))

# ---- a file with what import never writes: every section carried over.
subprocess.run([MKFILE, T], check=True)
src = p("multi.hlt")
t = trace(src, p("multi.trace"), [("1", 3), ("0", 12), ("1", 25), ("-", 32), ("0", 30),
                                   ("1", 34), ("0", 5)])
out = p("multi-out.hlt")
d = ok_json("relayout", src, "--trace", t, "-o", out, "--no-sync", "--json")
check(d["hot_blocks"] == 5 and d["hot_streams"] == [
    {"stream": "vcpu0", "lbs": 1, "blocks": 2}, {"stream": "vcpu1", "lbs": 1, "blocks": 2},
    {"stream": "other", "lbs": 1, "blocks": 1}], "multi: %s" % d)
si, oi = info(src), info(out)
for k in ("vcpus", "save_stats", "device_state_bytes"):
    check(si[k] == oi[k], "multi: %s not carried over: %s, %s" % (k, si[k], oi[k]))
check({k: v for k, v in oi["metadata"].items() if k != "halite.relayout"} == si["metadata"],
      "multi: metadata %s" % oi["metadata"])


def section(f, name):
    sec = [x for x in info(f)["sections"] if x["name"] == name][0]
    with open(f, "rb") as fh:
        fh.seek(sec["offset"])
        return fh.read(sec["length"])


check(section(src, "device-state") == section(out, "device-state"), "multi: device state")
check_same_bytes(src, out, ("ram", "rom"), "multi")
for r in ("ram", "rom"):
    run("extract", "--region", r, "-o", p("x.img"), out)
    with open(p("x.img"), "rb") as a, open(p(r + ".img"), "rb") as b:
        check(a.read() == b.read(), "multi: region %s is not the image" % r)
check_hot_prefix(src, out, "multi")

# ---- the merge, exactly: codec none, 8 KiB blocks, 16 KiB LBs: two blocks an LB.
img = image("m.img", "rr", 64, seed=9)
src = p("m.hlt")
ok_json("import", img, "--region", "ram", "-o", src, "--codec", "none", "--no-sync",
        "--lb-size", "16K", "--order", "physical", "--json")
# Blocks 0..31 stored. Three traces:
#   count 3: 10 (vcpu 0 in all; ranks 0, 4, 4: median 4), 11 (vcpu 0; ranks 1, 1, 1),
#            12 (vcpu 1, 1, 0: the vote says 1; ranks 2, 0, 2)
#   count 2: 20 (vcpu 0), 21 (vcpu 1), 22 ('-')
#   count 1: 5, 6, 7 (vcpu 0, ranks 5 in A, 6 in B, 3 in C), 8 (vcpu 1), 9 ('-')
A = [("0", 10), ("0", 11), ("1", 12), ("0", 20), ("1", 21), ("0", 5), ("-", 22)]
B = [("1", 12), ("0", 11), ("0", 20), ("-", 22), ("0", 10), ("1", 21), ("0", 6), ("1", 8)]
C = [("-", 9), ("0", 11), ("0", 12), ("0", 7), ("0", 10)]
traces = [trace(src, p("A"), A), trace(src, p("B"), B), trace(src, p("C"), C)]
# Count 3: vcpu0 [11 (median 1), 10 (median 4)], vcpu1 [12]: one round.
# Count 2: vcpu0 [20], vcpu1 [21], other [22].
# Count 1: vcpu0 [7 (rank 3), 5 (rank 5)], [6 (rank 6)]; vcpu1 [8]; other [9]:
#   round 1: {7, 5}, {8}, {9}; round 2: {6}.
want = [("vcpu0", [11, 10]), ("vcpu1", [12]),
        ("vcpu0", [20]), ("vcpu1", [21]), ("other", [22]),
        ("vcpu0", [7, 5]), ("vcpu1", [8]), ("other", [9]), ("vcpu0", [6])]
maps = set()
for perm in itertools.permutations(traces):
    out = p("m-out.hlt")
    args = ["relayout", src, "-o", out, "--no-sync", "--json"]
    for t in perm:
        args += ["--trace", t]
    d = ok_json(*args)
    mo, lo = mbs(out), lbs(out)
    got = [(lo[i]["stream"], [m["mb"] for m in sorted((m for m in mo if m.get("lb") == i),
                                                       key=lambda m: m["lb_offset"])])
           for i in range(d["hot_lbs"])]
    check(got == want, "merge order %s: got %s" % ([os.path.basename(t) for t in perm], got))
    check(d["hot_lbs"] == 9 and d["hot_blocks"] == 11 and d["touched_blocks"] == 11, "merge counts %s" % d)
    check(d["hot_streams"] == [{"stream": "vcpu0", "lbs": 4, "blocks": 6},
                               {"stream": "vcpu1", "lbs": 3, "blocks": 3},
                               {"stream": "other", "lbs": 2, "blocks": 2}],
          "hot_streams %s" % d["hot_streams"])
    check(relayout_meta(out)["hot-lbs"] == "9", "merge metadata")
    maps.add(json.dumps([mo, [(l["stream"], l["seq"], l["used"], l["mbs"]) for l in lo]]))
    check_hot_prefix(src, out, "merge")
check(len(maps) == 1, "the output depends on the order of the traces (%d maps)" % len(maps))
check_same_bytes(src, p("m-out.hlt"), ("ram",), "merge")

# --hot-max: 3 LBs of 16 KiB: the first three of the order above, the rest cut.
for size, k in (("48K", 3), ("63K", 3), ("16K", 1)):
    out = p("h.hlt")
    d = ok_json("relayout", src, "--trace", traces[0], "--trace", traces[1], "--trace",
                traces[2], "-o", out, "--hot-max", size, "--no-sync", "--json")
    nblocks = sum(len(b) for _, b in want[:k])
    check(d["hot_lbs"] == k and d["hot_blocks"] == nblocks and d["cut_blocks"] == 11 - nblocks
          and d["hot_max"] == int(size[:-1]) * 1024, "--hot-max %s: %s" % (size, d))
    kk, hot = check_hot_prefix(src, out, "--hot-max " + size)
    check(sorted(hot) == sorted(sum((b for _, b in want[:k]), [])), "--hot-max hot set")
    check_same_bytes(src, out, ("ram",), "--hot-max")

# A cancelled restore's trace (the VM stopped first) is taken, its touches as any.
cancelled = trace(src, p("cancelled"), [("1", 3), ("0", 2)], done=False, error=-125)
d = ok_json("relayout", src, "--trace", cancelled, "-o", p("c.hlt"), "--no-sync", "--json")
mo = mbs(p("c.hlt"))
check(d["hot_lbs"] == 2 and [m["lb"] for m in mo[2:4]] == [0, 1],
      "cancelled trace: %s" % d)

# Text output: a summary on stderr, nothing on stdout.
rc, o, e = run("relayout", src, "--trace", traces[0], "-o", p("txt.hlt"), "--no-sync")
check(rc == 0 and o == "" and "halite-inspect: relayout: %s: " % p("txt.hlt") in e and
      "hot prefix" in e, "text output: %d %r %r" % (rc, o, e))
# --progress=json: one object a line, the last one done.
rc, o, e = run("relayout", src, "--trace", traces[0], "-o", p("pg.hlt"), "--no-sync",
               "--progress=json")
lines = [json.loads(l) for l in e.splitlines() if l.startswith("{")]
check(rc == 0 and lines and lines[-1]["done"] is True and lines[-1]["op"] == "relayout",
      "--progress=json: %r" % e)

# ---- refusals: exit 2 (usage) or 1, one sentence, nothing written.
other = p("other.hlt")
ok_json("import", img, "--region", "ram", "-o", other, "--no-sync", "--json")
v1 = trace(src, p("v1"), [], version=1)
failed = trace(src, p("failed"), [("0", 1)], done=False)


def refused(code, words, *args):
    out = p("refused.hlt")
    if os.path.exists(out):
        os.unlink(out)
    rc, o, e = run("relayout", *args, "--json")
    what = " ".join(map(str, args))
    if not check(rc == code, "%s: exit %d, expected %d: %s" % (what, rc, code, e)):
        return
    check(e.startswith("halite-inspect: relayout: ") and e.count("\n") == 1,
          "%s: not one sentence: %r" % (what, e))
    for w in words:
        check(w in e, "%s: %r not in %r" % (what, w, e))
    d = json.loads(o)
    check(d["ok"] is False and d["exit"] == code and e.strip().endswith(d["error"]) and
          set(["file", "output", "uuid", "hot_lbs"]) <= set(d) and d["uuid"] is None and
          d["hot_lbs"] is None, "%s: JSON %s" % (what, d))
    # What was learnt before the failure: the traces once the options parsed.
    want = [a for i, a in enumerate(args) if i and args[i - 1] == "--trace"]
    check(d["traces"] in (None, want) and (d["traces"] is None) == (d["file"] is None),
          "%s: JSON traces %s" % (what, d["traces"]))
    return d
    check(not os.path.exists(out), "%s: wrote the output" % what)
    check(not [n for n in os.listdir(T) if n.startswith(".refused")],
          "%s: a temporary file left" % what)


R = p("refused.hlt")
d = refused(2, [traces[0], "is not the uuid of " + other], other, "--trace", traces[0], "-o", R)
check(d and d["traces"] == [traces[0]] and d["file"] == other and d["output"] == R,
      "another file's trace: JSON %s" % d)
refused(2, [p("o") + ":2: file-uuid", "is not the uuid of"], src, "--trace", traces[0], "--trace",
        trace(other, p("o"), [("0", 0)]), "-o", R)
refused(2, [v1, "version 1 trace records no touches", "--learn"], src, "--trace", v1, "-o", R)
refused(2, [failed, "failed"], src, "--trace", failed, "-o", R)
refused(2, ["the output %s is the same file as %s" % (src, src)], src, "--trace", traces[0],
        "-o", src)
refused(2, ["is the same file as %s (a trace)" % traces[0]], src, "--trace", traces[0], "-o",
        traces[0])
refused(2, ["given twice"], src, "--trace", traces[0], "--trace", traces[0], "-o", R)
refused(2, ["--hot-max 8192 is less than one locality block", "16384"], src, "--trace",
        traces[0], "-o", R, "--hot-max", "8K")
refused(2, ["--hot-max: a size"], src, "--trace", traces[0], "-o", R, "--hot-max", "1K")
refused(2, ["--hot-max: a size"], src, "--trace", traces[0], "-o", R, "--hot-max", "x")
refused(2, ["--trace TRACE is required"], src, "-o", R)
refused(2, ["-o OUT is required"], src, "--trace", traces[0])
refused(2, ["expected FILE"], "--trace", traces[0], "-o", R)
refused(2, ["unknown option '--frob'"], src, "--trace", traces[0], "-o", R, "--frob")
refused(1, ["nonexistent"], src, "--trace", p("nonexistent"), "-o", R)
refused(1, [p("nonexistent.hlt")], p("nonexistent.hlt"), "--trace", traces[0], "-o", R)
bad = p("bad.trace")
with open(traces[0]) as fh:
    L = fh.read().split("\n")
n = L.index("touch 0 0 10 stored")
L[n] = "touch 0 0 10 zero"
with open(bad, "w") as out:
    out.write("\n".join(L))
refused(1, ["%s:%d: memory block 10 is stored in %s, not zero" % (bad, n + 1, src)], src,
        "--trace", bad, "-o", R)

rc, o, e = run("relayout", "--help")
check(rc == 0 and o.startswith("Usage: halite-inspect relayout FILE --trace TRACE") and
      "halite.relayout" in o and "hot_streams" in o, "--help")
rc, o, e = run("relayout", "--version")
check(rc == 0 and o.startswith("halite-inspect "), "--version")
rc, o, e = run("help")
check(rc == 0 and "relayout" in o, "help lists relayout")

if failures:
    print("%d failure(s)" % failures, file=sys.stderr)
    sys.exit(1)
print("PASS")
