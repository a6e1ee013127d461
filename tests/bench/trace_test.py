#!/usr/bin/env python3
# Real programs' traces in the benchmarks (issue 15), checked by count, not
# by timing:
# 1. halite-trace-lackey on a canned lackey log (lackey-small.txt): the exact
#    records (LRU collapsing, page-crossing accesses, region packing), the
#    header, --vcpu; a line that is not lackey's is refused (exit 2).
# 2. halite-bench micro --trace --quick --json on a generated 2-vCPU trace:
#    the guest sized from the trace, every run ok with memory exact (words
#    equal to the snapshot plus exactly the trace's writes), each
#    organisation's restore reading each of its LBs once, the trace's counts.
# 3. Traces micro must refuse with exit 2 and the reason: not fitting (an
#    address outside its vCPU's window, too few records), malformed (magic,
#    size, flags, version).
# 4. halite-cycle --trace on the same trace: snapshot at the exact midpoint,
#    the rest replayed read-only, memory equal to the snapshot page for page;
#    --restore-trace writes the engine's trace, a line per LB read.
#   trace_test.py HALITE_BENCH HALITE_TRACE_LACKEY HALITE_CYCLE TMPDIR
import json
import os
import struct
import subprocess
import sys

bench, conv, cycle, tmp = sys.argv[1:5]
here = os.path.dirname(os.path.abspath(__file__))
VBASE = 0x7f0000000000
GIB = 1 << 30


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def header(nvcpus, magic=b"HSYNTRC1", version=1, recsize=16, rsv=0):
    return magic + struct.pack("<IIIIQ", version, recsize, nvcpus, rsv, 0)


def write_trace(path, nvcpus, recs, **kw):
    with open(path, "wb") as f:
        f.write(header(nvcpus, **kw))
        for va, v, w in recs:
            f.write(struct.pack("<QII", va, v, w))


def read_trace(path):
    data = open(path, "rb").read()
    if data[:8] != b"HSYNTRC1" or (len(data) - 32) % 16:
        fail(f"{path}: not a trace")
    ver, rs, nv, r0, r1 = struct.unpack("<IIIIQ", data[8:32])
    recs = [struct.unpack("<QII", data[i:i + 16]) for i in range(32, len(data), 16)]
    return (ver, rs, nv, r0, r1), recs


# --- 1. the converter ---
lk = os.path.join(here, "lackey-small.txt")
out = os.path.join(tmp, "small.trace")
p = subprocess.run([conv, "--window", "2", "--gap", "16", "--align", "16", out, lk],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail(f"halite-trace-lackey exited {p.returncode}: {p.stderr}")
hdr, recs = read_trace(out)
if hdr != (1, 16, 1, 0, 0):
    fail(f"converter header {hdr}")
# Pages 0x4001-0x4003 are one region at offset 0, page 0x1ffefff another at 64 KiB.
R2 = VBASE + 0x10000
want = [(VBASE + 0x000, 0, 0),      # I 04001000: first touch
        (R2 + 0x000, 0, 1),         # S 1ffefff000: first touch, a write
        (VBASE + 0x1ff8, 0, 0),     # I 04002ffe,4: page 0x4002 (address 8-byte aligned) ...
        (VBASE + 0x2000, 0, 0),     # ... and page 0x4003, which it crosses into
        (VBASE + 0x010, 0, 1),      # M 04001010: 0x4001 fell out of the 2-page window
        (R2 + 0x020, 0, 0),         # L 1ffefff020: fell out too
        (VBASE + 0x2000, 0, 0),     # L 04003000: fell out
        (R2 + 0x020, 0, 1)]         # S 1ffefff020: back in the window, not written since
if recs != want:
    fail("converter records:\n  got  %s\n  want %s" % (
        [(hex(a), v, w) for a, v, w in recs], [(hex(a), v, w) for a, v, w in want]))
if "17 lines, 11 accesses, 8 records kept" not in p.stderr or \
        "4 pages in 2 regions, packed into 68 KiB" not in p.stderr:
    fail(f"converter summary: {p.stderr}")
# The default window (64) keeps only first touches and first writes here, and
# the default packing is dense: 0x4001-0x4003 at pages 0-2, 0x1ffefff at page 3.
p = subprocess.run([conv, "--vcpu", "2", out, lk], capture_output=True, text=True)
hdr, recs = read_trace(out)
w2 = [(VBASE + 2 * GIB + 0x000, 2, 0), (VBASE + 2 * GIB + 0x3000, 2, 1),
      (VBASE + 2 * GIB + 0x1ff8, 2, 0), (VBASE + 2 * GIB + 0x2000, 2, 0),
      (VBASE + 2 * GIB + 0x010, 2, 1)]
if p.returncode != 0 or hdr[2] != 3 or recs != w2 or "packed into 16 KiB" not in p.stderr:
    fail(f"converter --vcpu 2: exit {p.returncode}, header {hdr}, records "
         f"{[(hex(a), v, w) for a, v, w in recs]}")
bad = os.path.join(tmp, "bad-lackey.txt")
open(bad, "w").write("I  04001000,3\nhello world\n")
p = subprocess.run([conv, out, bad], capture_output=True, text=True)
if p.returncode != 2 or "line 2 is not a lackey --trace-mem line" not in p.stderr:
    fail(f"converter on a bad line: exit {p.returncode}, {p.stderr!r}")
print("converter: exact records, --vcpu, bad line refused")

# --- 2. micro on a generated trace ---
# vCPU 0 walks pages 0..63 in order, word by word, every third access writing;
# vCPU 1 jumps over pages 0..149 (an LCG), every fifth access writing.
N = 3000
r0 = [(VBASE + (i % 64) * 4096 + (i // 64) * 8 % 4096, 0, int(i % 3 == 0)) for i in range(N)]
x = 12345
r1 = []
for i in range(N):
    x = (x * 1103515245 + 12345) % (1 << 31)
    r1.append((VBASE + GIB + (x >> 8) % 150 * 4096 + (x % 512) * 8, 1, int(i % 5 == 0)))
recs = []
for c in range(0, N, 256):  # interleaved in chunks, as a recorder writes them
    recs += r0[c:c + 256] + r1[c:c + 256]
tr = os.path.join(tmp, "gen.trace")
write_trace(tr, 2, recs)
map_units = max(max((va - VBASE) // 4096 for va, _, _ in r0) + 1,
                max((va - VBASE - GIB) // 4096 for va, _, _ in r1) + 1)
p = subprocess.run([bench, "micro", "--trace", tr, "--quick", "--json", "--dir", tmp,
                    "--baseline-runs", "1"], capture_output=True, text=True)
if p.returncode == 77:
    print("skipped: " + p.stderr.strip().splitlines()[-1])
    sys.exit(77)
if p.returncode != 0:
    fail(f"micro --trace exited {p.returncode}:\n{p.stderr}")
d = json.loads(p.stdout)
pa = d["params"]
if pa["pattern"] != "trace" or pa["vcpus"] != 2:
    fail(f"params {pa}")
if pa["trace"]["records"] != 2 * N or pa["trace"]["records_per_vcpu"] != [N, N]:
    fail(f"trace counts {pa['trace']}")
if pa["trace"]["writes_per_vcpu"] != [sum(w for _, _, w in r0), sum(w for _, _, w in r1)]:
    fail(f"trace writes {pa['trace']['writes_per_vcpu']}")
if pa["map_bytes_per_vcpu"] != map_units * 4096 or pa["mem_bytes"] != 16 << 20:
    fail(f"sizing: map {pa['map_bytes_per_vcpu']} (want {map_units * 4096}), "
         f"mem {pa['mem_bytes']} (want 16 MiB)")
if pa["snapshot_positions"] != [N // 2, N // 2]:
    fail(f"snapshot positions {pa['snapshot_positions']}: not exactly at the midpoint")
if d["save"]["content"] != "exact":
    fail("the saved file does not hold the snapshot")
names = set()
for r in d["results"] + d["vm_access_runs"]:
    what = f"{r['name']} {r['cache']} {r['read_latency_us']} us"
    if r["ok"] is not True or r["failed_translations"] != 0:
        fail(f"{what}: not ok: {r['error']}")
    if r["content"] not in (None, "exact"):
        fail(f"{what}: content {r['content']}")
    if r["content"] == "exact":
        names.add(r["name"])
    if r["kind"] == "organisation" and r["storage_reads"] != d["files"][r["name"]]["lbs"]:
        fail(f"{what}: {r['storage_reads']} reads of {d['files'][r['name']]['lbs']} LBs")
if len(names) != 8:
    fail(f"memory compared for {sorted(names)} only")
checked = {r["name"]: r["pages_checked"] for r in d["results"] if r["content"] == "exact"}
# 4k-on-demand and working-set compare the same set: the pages touched after the snapshot.
if checked["4k-on-demand"] != checked["working-set"] or checked["eager"] != 16 << 8:
    fail(f"pages checked {checked}")
if len(d["vm_access_runs"]) != 4:
    fail("no VM access runs")
print(f"micro --trace: 2 vCPUs x {N} records, memory exact for all 8, "
      f"pages checked {checked}")

# --- 3. refused traces ---
def refused(name, want, **kw):
    path = os.path.join(tmp, name + ".trace")
    if "data" in kw:
        open(path, "wb").write(kw["data"])
    else:
        write_trace(path, kw.get("nvcpus", 1), kw["recs"], **kw.get("hdr", {}))
    p = subprocess.run([bench, "micro", "--trace", path, "--quick", "--json", "--dir", tmp],
                       capture_output=True, text=True)
    if p.returncode != 2 or want not in p.stderr:
        fail(f"{name}: exit {p.returncode} (want 2), stderr {p.stderr!r} (want {want!r})")
    # --json: the one object on a failure too (docs/cli.md)
    try:
        obj = json.loads(p.stdout)
    except ValueError:
        fail(f"{name}: stdout is not one JSON object: {p.stdout!r}")
    if obj.get("ok") is not False or obj.get("exit") != 2 or want not in obj.get("error", ""):
        fail(f"{name}: JSON {obj}")


ok2 = [(VBASE, 0, 0), (VBASE + 4096, 0, 1)]
refused("outside", "does not fit: record 1 of vCPU 0 is at 0x7f0040000000, outside its window",
        recs=[(VBASE, 0, 0), (VBASE + GIB, 0, 0)])
refused("other-window", "does not fit: record 0 of vCPU 1 is at 0x7f0000000000",
        nvcpus=2, recs=[(VBASE, 1, 0)] + ok2)
refused("short", "does not fit: vCPU 1 has 1 records, at least 2", nvcpus=2,
        recs=ok2 + [(VBASE + GIB, 1, 0)])
refused("magic", "is not an access trace (no HSYNTRC1 magic)", recs=ok2,
        hdr={"magic": b"HSYNTRC2"})
refused("version", "is version 2 with 16-byte records", recs=ok2, hdr={"version": 2})
refused("reserved", "has reserved header bytes 20..31 set", recs=ok2, hdr={"rsv": 1})
refused("size", "is not a regular file of a 32-byte header and 16-byte records (size 40)",
        data=header(1) + b"\0" * 8)
refused("flags", "record 1 has reserved flag bits set", recs=[(VBASE, 0, 0), (VBASE, 0, 2)])
refused("vcpu", "record 0 has a vCPU beyond the header's count", recs=[(VBASE, 1, 0)] + ok2)
refused("nvcpus", "is for 17 vCPUs; 1 to 16", nvcpus=17, recs=ok2)
p = subprocess.run([bench, "micro", "--trace", tr, "--vcpus", "2"], capture_output=True, text=True)
if p.returncode != 2 or "the trace decides" not in p.stderr:
    fail(f"--trace with --vcpus: exit {p.returncode}, {p.stderr!r}")
print("refused: not fitting, malformed, conflicting options (exit 2)")

# --- 4. halite-cycle --trace ---
rt = os.path.join(tmp, "restore.rtrace")
p = subprocess.run([cycle, "--trace", tr, "--json", "--dir", tmp, "--restore-trace", rt],
                   capture_output=True, text=True)
if p.returncode != 0:
    fail(f"halite-cycle --trace exited {p.returncode}:\n{p.stderr}")
d = json.loads(p.stdout)
# --restore-trace: the engine's trace (docs/restore-trace.md), one line per LB it read.
lines = open(rt).read().splitlines()
lbs = [ln for ln in lines if ln.startswith("lb ")]
if lines[0] != "halite-restore-trace 1" or len(lbs) != d["restore"]["lb_total"]:
    fail(f"--restore-trace: {lines[:1]}, {len(lbs)} lb lines, lb_total {d['restore'].get('lb_total')}")
g = d["guest"]
if g["pattern"] != "trace" or g["vcpus"] != 2 or g["mem_bytes"] != 16 << 20 or \
        g["trace"]["snapshot_positions"] != [N // 2, N // 2]:
    fail(f"halite-cycle --trace guest {g}")
if d["ok"] is not True or d["content"] != {"pages": 4096, "pages_wrong": 0, "exact": True}:
    fail(f"halite-cycle --trace: ok {d['ok']}, content {d['content']}")
p = subprocess.run([cycle, "--trace", os.path.join(tmp, "outside.trace")], capture_output=True,
                   text=True)
if p.returncode != 2 or "does not fit" not in p.stderr:
    fail(f"halite-cycle on a trace that does not fit: exit {p.returncode}, {p.stderr!r}")
print("halite-cycle --trace: midpoint, 4096 pages exact; a trace that does not fit refused")
