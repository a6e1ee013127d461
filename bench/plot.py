#!/usr/bin/env python3
"""Draw issue 5's figures and tables from the JSON that bench/run.sh saved.

    bench/plot.py DIR

Reads, in DIR (each one optional; what is missing is left out and said so):
  micro.json           halite-bench micro --json
  compress-P.json      halite-bench micro --json --only locality,halite --compress P
  trace-NAME.json      halite-bench micro --json --trace NAME.trace (a real program)
  fio.json             bench/fio.sh
  fault.json           halite-bench fault --json (its format is not fixed: shown as found)
  qemu-learn.json      bench/qemu.py --learn --json (issue 17's goals in summary.md)
  runs.tsv             written by bench/run.sh: file, exit code, seconds, command

Writes, in DIR:
  fig2-overhead.svg    the paper's Figure 2: restore overhead per organisation and
                       peer, grouped by storage condition (log y axis)
  table1.md            the paper's Table 1: reads and VM access % per organisation
  fig2-trace-NAME.svg  Figure 2 on each real program's trace
  table-traces.md      Table 1 on every workload side by side, synthetic and traces,
                       with issue 15's goal checked per trace
  fig4-compress.svg    the paper's Figure 4: locality (uncompressed) against halite
                       (compressed) across compressibility
  summary.md           machine, parameters, commands, results, fio, the fault check,
                       and issue 5's claims checked against the numbers

Python 3 standard library only; the SVG is written by hand. Any number in the
JSON may be null or missing: it is shown as "-" and left out of the figures.
"""
import glob
import json
import math
import os
import sys
import time
from xml.sax.saxutils import escape

ORGS = ["random", "physical", "locality", "halite"]
PEERS = ["eager", "4k-on-demand", "mmap-private", "working-set"]
NAMES = ORGS + PEERS
COLOURS = {
    "random": "#9c9c9c",
    "physical": "#76b7b2",
    "locality": "#4e79a7",
    "halite": "#e15759",
    "eager": "#f28e2b",
    "4k-on-demand": "#edc948",
    "mmap-private": "#b07aa1",
    "working-set": "#59a14f",
}
# The paper's Table 1 (uncompressed, ESXi, 1 GiB guest): disk accesses, VM access %.
PAPER_TABLE1 = {"random": (22975, 19), "physical": (14501, 36), "locality": (6908, 83)}
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


# --- reading -----------------------------------------------------------------

def load_json(path, notes):
    """The JSON object in @path, or None (and a note) if it is missing or unreadable."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        notes.append(f"{os.path.basename(path)}: cannot read: {e}")
        return None
    if not text.strip():
        notes.append(f"{os.path.basename(path)}: empty (the run printed no JSON)")
        return None
    try:
        # Tools may print a line or two before the object.
        return json.loads(text[text.index("{"):])
    except ValueError as e:
        notes.append(f"{os.path.basename(path)}: not JSON ({e})")
        return None


def load_runs(path):
    """runs.tsv rows: dicts with file, rc, seconds, command."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t", 3)
            if len(parts) < 4:
                continue
            rc = int(parts[1]) if parts[1].lstrip("-").isdigit() else None
            secs = num(parts[2])
            rows.append({"file": parts[0], "rc": rc, "seconds": secs, "command": parts[3]})
    return rows


def num(v):
    """@v as a finite float, or None."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def get(d, *keys):
    """d[k1][k2]... or None if any step is missing."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


# --- formatting ----------------------------------------------------------------

def sig(v, digits=3):
    """@v with @digits significant digits, no exponent."""
    if v == 0:
        return "0"
    mag = int(math.floor(math.log10(abs(v))))
    dec = max(0, digits - 1 - mag)
    return f"{v:.{dec}f}"


def fmt_s(v, digits=3):
    """Seconds, in the unit that reads best: 8.46 s, 121 ms, 950 µs."""
    v = num(v)
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1 or a == 0:
        return f"{sig(v, digits)} s"
    if a >= 1e-3:
        return f"{sig(v * 1e3, digits)} ms"
    return f"{sig(v * 1e6, digits)} µs"


def fmt_tick(v):
    """An axis tick in seconds: 10 ms, 1 s, 200 µs."""
    a = abs(v)
    if a >= 1 or a == 0:
        return f"{float(f'{v:.6g}'):g} s"
    if a >= 1e-3:
        return f"{float(f'{v * 1e3:.6g}'):g} ms"
    return f"{float(f'{v * 1e6:.6g}'):g} µs"


def fmt_us(v):
    v = num(v)
    if v is None:
        return "-"
    return fmt_s(v / 1e6)


def fmt_lat(us):
    """A storage latency in µs as a condition label: +0, +100 µs, +1 ms, +5 ms."""
    us = num(us)
    if us is None:
        return "?"
    if us == 0:
        return "+0 µs"
    if us >= 1000:
        return f"+{us / 1000:g} ms"
    return f"+{int(us)} µs"


def fmt_int(v):
    v = num(v)
    if v is None:
        return "-"
    return f"{int(round(v)):,}"


def fmt_mib(v):
    v = num(v)
    if v is None:
        return "-"
    return f"{v / 2**20:,.1f}"


def fmt_pct(v):
    v = num(v)
    if v is None:
        return "-"
    return f"{v:.1f}%"


def fmt_x(v, digits=2):
    v = num(v)
    if v is None:
        return "-"
    return f"{sig(v, digits)}x" if abs(v) < 100 else f"{v:,.0f}x"


def md_table(header, rows, align=None):
    align = align or ["l"] + ["r"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


# --- SVG -------------------------------------------------------------------------

class Svg:
    def __init__(self, width, height):
        self.w, self.h = width, height
        self.items = []

    def add(self, s):
        self.items.append(s)

    def rect(self, x, y, w, h, fill, stroke="none", extra=""):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" '
                 f'height="{max(h, 0):.1f}" fill="{fill}" stroke="{stroke}"{extra}/>')

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}" stroke-width="{width}"{d}/>')

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill="#222",
             rotate=None, baseline=None):
        t = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        b = f' dominant-baseline="{baseline}"' if baseline else ""
        w = f' font-weight="{weight}"' if weight != "normal" else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'fill="{fill}"{w}{b}{t}>{escape(s)}</text>')

    def write(self, path):
        with open(path, "w") as f:
            f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" '
                    f'height="{self.h}" viewBox="0 0 {self.w} {self.h}" '
                    f'font-family="{FONT}">\n')
            f.write(f'<rect x="0" y="0" width="{self.w}" height="{self.h}" fill="#fff"/>\n')
            for it in self.items:
                f.write(it + "\n")
            f.write("</svg>\n")


class LogAxis:
    """A log10 y axis from the decade at or below @lo up to @hi times @pad (room for
    the labels above the bars); gridlines at decades, lighter ones between."""

    def __init__(self, lo, hi, top, bottom, pad=1.0):
        self.l0 = math.floor(math.log10(lo))
        self.l1 = max(math.log10(hi * pad), self.l0 + 1)
        self.top, self.bottom = top, bottom

    @property
    def floor(self):
        return 10.0 ** self.l0

    def y(self, v):
        f = (math.log10(v) - self.l0) / (self.l1 - self.l0)
        return self.bottom - f * (self.bottom - self.top)

    def draw(self, svg, x0, x1, label):
        few = self.l1 - self.l0 <= 2.5
        for d in range(self.l0, math.floor(self.l1) + 1):
            v = 10.0 ** d
            y = self.y(v)
            svg.line(x0, y, x1, y, "#cfcfcf", 1)
            svg.line(x0 - 5, y, x0, y, "#000", 1)
            svg.text(x0 - 8, y + 4, fmt_tick(v), 11, "end")
            for k in range(2, 10):
                if math.log10(k * v) > self.l1 + 1e-9:
                    break
                ym = self.y(k * v)
                svg.line(x0, ym, x1, ym, "#efefef", 1)
                svg.line(x0 - 3, ym, x0, ym, "#000", 1)
                if few and k in (2, 5):
                    svg.text(x0 - 8, ym + 4, fmt_tick(k * v), 10, "end", fill="#666")
        svg.line(x0, self.top, x0, self.bottom, "#000", 1)
        mid = (self.top + self.bottom) / 2
        svg.text(x0 - 62, mid, label, 12, "middle", rotate=-90)


class LinAxis:
    """A linear y axis from 0 to a round number at or above @hi."""

    def __init__(self, hi, top, bottom):
        hi = hi if hi > 0 else 1.0
        raw = hi / 5
        mag = 10 ** math.floor(math.log10(raw))
        step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
        self.step = step
        self.max = step * math.ceil(hi / step)
        self.top, self.bottom = top, bottom
        self.floor = 0.0

    def y(self, v):
        return self.bottom - (v / self.max) * (self.bottom - self.top)

    def draw(self, svg, x0, x1, label):
        v = 0.0
        while v <= self.max + self.step / 2:
            y = self.y(v)
            svg.line(x0, y, x1, y, "#cfcfcf" if v else "#000", 1)
            svg.line(x0 - 5, y, x0, y, "#000", 1)
            svg.text(x0 - 8, y + 4, fmt_tick(v), 11, "end")
            v += self.step
        svg.line(x0, self.top, x0, self.bottom, "#000", 1)
        mid = (self.top + self.bottom) / 2
        svg.text(x0 - 62, mid, label, 12, "middle", rotate=-90)


def guest_line(m):
    p = m.get("params") or {}
    parts = []
    if p.get("pattern") == "trace":
        parts.append("trace " + os.path.basename(str(get(p, "trace", "path") or "?")) +
                     f" ({fmt_int(get(p, 'trace', 'records'))} records)")
    mem = num(p.get("mem_bytes"))
    if mem:
        parts.append(f"{mem / 2**20:.0f} MiB guest")
    if p.get("vcpus"):
        parts.append(f"{p['vcpus']} vCPUs")
    ws = num(p.get("ws_bytes_per_vcpu"))
    if ws:
        parts.append(f"{ws / 2**20:.0f} MiB working set per vCPU")
    if p.get("compress_pct") is not None:
        parts.append(f"data compressing to ~{p['compress_pct']}%")
    if p.get("codec"):
        parts.append(str(p["codec"]))
    if p.get("quick"):
        parts.append("--quick")
    return ", ".join(parts)


# --- Figure 2 --------------------------------------------------------------------

def conditions(m):
    """Storage conditions in the order the bench ran them: [(cache, latency_us)]."""
    seen = []
    for r in m.get("results") or []:
        c = (r.get("cache"), r.get("read_latency_us"))
        if c not in seen:
            seen.append(c)
    order = {"warm": 0, "cold": 1}
    return sorted(seen, key=lambda c: (order.get(c[0], 2), num(c[1]) or 0))


def result(m, name, cache, lat):
    for r in m.get("results") or []:
        if r.get("name") == name and r.get("cache") == cache and \
                num(r.get("read_latency_us")) == num(lat):
            return r
    return None


def present_names(m):
    have = {r.get("name") for r in m.get("results") or []}
    return [n for n in NAMES if n in have] + sorted(n for n in have if n not in NAMES and n)


def fig2(m, path):
    conds = conditions(m)
    names = present_names(m)
    if not conds or not names:
        return False
    vals = [num(r.get("restore_overhead_s")) for r in m.get("results") or []]
    pos = [v for v in vals if v is not None and v > 0]
    base = num(m.get("baseline_s"))
    lo = min(pos) if pos else 1e-3
    hi = max(pos) if pos else 1.0
    if base and base > 0:
        hi = max(hi, base)

    bw = 15
    gw = len(names) * bw
    left, right, top = 90, 30, 120
    ph = 380
    width = max(left + len(conds) * (gw + 30) + right, 900)
    gap = (width - left - right) / len(conds) - gw
    height = top + ph + 110
    svg = Svg(width, height)
    # Room above the tallest bar for its label, about 45 px.
    decades = max(math.log10(hi) - math.floor(math.log10(lo)), 1)
    ax = LogAxis(lo, hi, top, top + ph, 10 ** (45 * decades / (ph - 45)))
    x0, x1 = left, width - right
    svg.text(width / 2, 24, "Restore overhead by block organisation and peer "
             "(the paper's Figure 2)", 16, "middle", "bold")
    svg.text(width / 2, 43, guest_line(m) + "; lower is better", 12, "middle", fill="#555")

    # Legend: two rows, organisations then peers.
    ly = 66
    for row, (title, group) in enumerate((("organisations of one file:", ORGS),
                                          ("peers:", PEERS))):
        y = ly + row * 20
        x = left
        svg.text(x, y + 10, title, 12, weight="bold")
        x += 175
        for n in group:
            if n not in names:
                continue
            svg.rect(x, y, 12, 12, COLOURS.get(n, "#777"))
            svg.text(x + 17, y + 10, n, 12)
            x += 30 + 7.2 * len(n)
        if row == 0 and base and base > 0:
            x += 10
            svg.line(x, y + 6, x + 24, y + 6, "#444", 1, "6 4")
            svg.text(x + 30, y + 10, f"baseline run, no restore ({fmt_s(base)})", 12)

    ax.draw(svg, x0, x1, "restore overhead (run with restore − baseline), log scale")
    if base and base > 0:
        yb = ax.y(base)
        svg.line(x0, yb, x1, yb, "#444", 1, "6 4")

    bottom = top + ph
    svg.line(x0, bottom, x1, bottom, "#000", 1)
    caches = []
    for gi, (cache, lat) in enumerate(conds):
        gx = left + gap / 2 + gi * (gw + gap)
        for ni, n in enumerate(names):
            r = result(m, n, cache, lat)
            x = gx + ni * bw
            v = num(r.get("restore_overhead_s")) if r else None
            failed = r is not None and (r.get("ok") is False or r.get("error"))
            colour = COLOURS.get(n, "#777")
            if v is None:
                svg.text(x + bw / 2 + 4, bottom - 4, "n/a", 9, "start", fill="#888",
                         rotate=-90)
                continue
            if v <= 0:
                svg.text(x + bw / 2 + 4, bottom - 4, f"≤ 0 ({fmt_s(v)})", 9, "start",
                         fill="#888", rotate=-90)
                continue
            y = ax.y(v)
            stroke = ' stroke="#c00" stroke-width="2" stroke-dasharray="3 2"' if failed else ""
            svg.add(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bw - 2}" '
                    f'height="{bottom - y:.1f}" fill="{colour}"{stroke}>'
                    f'<title>{escape(f"{n}, {cache}, {fmt_lat(lat)}: {fmt_s(v)}")}'
                    f'</title></rect>')
            label = fmt_s(v) + (" (failed)" if failed else "")
            svg.text(x + bw / 2 + 3.5, y - 4, label, 9, "start", fill="#333", rotate=-90)
        cx = gx + gw / 2
        svg.text(cx, bottom + 18, fmt_lat(lat), 12, "middle")
        if not caches or caches[-1][0] != cache:
            caches.append([cache, gx, gx + gw])
        else:
            caches[-1][2] = gx + gw
    svg.text((x0 + x1) / 2, bottom + 36, "latency added to every read", 11, "middle",
             fill="#555")
    for cache, a, b in caches:
        y = bottom + 56
        svg.line(a, y, b, y, "#555", 1)
        svg.line(a, y - 4, a, y, "#555", 1)
        svg.line(b, y - 4, b, y, "#555", 1)
        what = "page cache warm" if cache == "warm" else \
            "page cache cold (O_DIRECT)" if cache == "cold" else f"cache {cache}"
        svg.text((a + b) / 2, y + 16, what, 12, "middle", "bold")
    svg.text(left, height - 12, "Every bar restores the same snapshot. ≤ 0: no slower "
             "than the baseline (noise). Red dashed outline: the run failed.", 10,
             fill="#666")
    svg.write(path)
    return True


# --- Table 1 ---------------------------------------------------------------------

def track_of(m, name):
    for r in m.get("vm_access_runs") or []:
        if r.get("name") == name:
            return r
    return None


def demand_of(r):
    """An organisation run's LB reads a fault waited for."""
    if r is None:
        return None
    v = num(get(r, "engine", "demand_reads"))
    return v if v is not None else num(r.get("demand_reads"))


def table1(m):
    lines = ["# Table 1: reads and VM access % per block organisation", ""]
    tracks = m.get("vm_access_runs") or []
    run = get(m, "params", "vm_access_run") or {}
    lines.append(f"Guest: {guest_line(m)}.")
    lines.append("")
    if tracks:
        lines.append(
            f"From the VM access runs (one restore per organisation with access tracking, "
            f"{run.get('cache', '?')} cache, {fmt_lat(run.get('read_latency_us'))} per read; "
            "`vm_access_runs` in micro.json). *LB reads on demand*: locality blocks a fault "
            "waited for (the paper's \"disk accesses\"); *total LB reads*: demand + prefetch "
            "(a completed restore reads every LB once); *VM access %*: of the memory blocks "
            "that came with a demand read besides the faulting one, the share the guest then "
            "touched. The paper's numbers (1 GiB guest, ESXi, 10 runs) for reference.")
        lines.append("")
        rows = []
        for n in ORGS:
            r = track_of(m, n)
            if r is None:
                continue
            paper = PAPER_TABLE1.get(n)
            eng = r.get("engine") or {}
            rows.append([
                n, fmt_int(demand_of(r)),
                fmt_int(eng.get("prefetch_reads")),
                fmt_int(r.get("storage_reads") if r.get("storage_reads") is not None
                        else eng.get("lbs")),
                fmt_int(get(m, "files", n, "lbs")),
                fmt_mib(r.get("bytes_read")),
                fmt_int(r.get("demand_faults")),
                fmt_pct(r.get("vm_access_pct")),
                f"{paper[0]:,} / {paper[1]}%" if paper else "-",
            ])
        lines.append(md_table(["organisation", "LB reads on demand", "prefetch reads",
                               "total LB reads", "LBs in file", "MiB read", "faults",
                               "VM access %", "paper: disk accesses / VM access %"], rows))
    else:
        lines.append("No VM access runs in micro.json (run without `--no-track` to get them).")
    conds = conditions(m)
    if conds and any(r.get("kind") == "organisation" for r in m.get("results") or []):
        lines += ["", "## Reads in the timed runs, per storage condition", "",
                  "From `results` (demand reads: LB reads a fault waited for; the rest were "
                  "prefetched). VM access % is the organisation's, from the run above.", ""]
        rows = []
        for cache, lat in conds:
            for n in ORGS:
                r = result(m, n, cache, lat)
                if r is None:
                    continue
                rows.append([f"{cache}, {fmt_lat(lat)}", n, fmt_int(r.get("demand_reads")),
                             fmt_int(r.get("storage_reads")), fmt_mib(r.get("bytes_read")),
                             fmt_int(r.get("demand_faults")), fmt_pct(r.get("vm_access_pct"))])
        lines.append(md_table(["condition", "organisation", "LB reads on demand",
                               "total LB reads", "MiB read", "demand faults", "VM access %"],
                              rows, ["l", "l", "r", "r", "r", "r", "r"]))
    return "\n".join(lines) + "\n"


# --- Real programs' traces (issue 15) ----------------------------------------------

# Issue 15's goal, per trace: the paper's locality VM access % and half the physical
# organisation's demand reads.
GOAL_VM_PCT = 83.0
GOAL_DEMAND_RATIO = 0.5


def trace_runs(dirname, notes):
    """[(name, micro JSON)] of DIR/trace-NAME.json, by name."""
    out = []
    for path in sorted(glob.glob(os.path.join(dirname, "trace-*.json"))):
        m = load_json(path, notes)
        if m is not None:
            out.append((os.path.basename(path)[len("trace-"):-len(".json")], m))
    return out


def trace_goal(m):
    """(vm_ok, ratio_ok, locality VM %, locality demand / physical demand); None: unknown."""
    loc, phy = track_of(m, "locality"), track_of(m, "physical")
    vm = num(loc.get("vm_access_pct")) if loc else None
    dl, dp = demand_of(loc), demand_of(phy)
    ratio = dl / dp if dl is not None and dp else None
    return (None if vm is None else vm >= GOAL_VM_PCT,
            None if ratio is None else ratio <= GOAL_DEMAND_RATIO, vm, ratio)


def traces_table(m, traces):
    L = ["# Table 1 on real programs' traces", "",
         "Per workload, from its VM access runs (one restore per organisation with access "
         "tracking; `vm_access_runs`): LB reads a fault waited for (the paper's \"disk "
         "accesses\") and VM access %. *synthetic*: micro.json (seq, the paper's "
         "microbenchmark); the others: `halite-bench micro --trace` on the program's trace "
         "(bench/traces/, docs/trace-format.md). Goal (issue 15): locality VM access "
         f"≥ {GOAL_VM_PCT:g}% and locality demand reads ≤ {GOAL_DEMAND_RATIO:g}x physical's.",
         ""]
    rows = []
    for name, w in ([("synthetic", m)] if m else []) + list(traces):
        cells = [name, fmt_int(get(w, "params", "trace", "records")),
                 fmt_mib(get(w, "params", "map_bytes_per_vcpu"))]
        for n in ORGS:
            r = track_of(w, n)
            cells.append(f"{fmt_int(demand_of(r))} / {fmt_pct(r.get('vm_access_pct'))}"
                         if r else "-")
        vm_ok, ratio_ok, vm, ratio = trace_goal(w)
        cells.append(fmt_x(ratio, 2))
        cells.append("-" if vm_ok is None or ratio_ok is None else
                     "met" if vm_ok and ratio_ok else
                     "NOT met: " + ", ".join(w for w, ok in (("VM access", vm_ok),
                                                             ("demand reads", ratio_ok))
                                             if not ok))
        rows.append(cells)
    L.append(md_table(["workload", "records", "MiB mapped / vCPU"] +
                      [f"{n}: demand reads / VM %" for n in ORGS] +
                      ["locality / physical demand", "goal"], rows,
                      ["l", "r", "r", "r", "r", "r", "r", "r", "l"]))
    return "\n".join(L) + "\n"


# --- Issue 15's goals, from this run's JSON ---------------------------------------

def yes_no(ok):
    return "-" if ok is None else "met" if ok else "**NOT met**"


def issue15_goals(dirname, traces, notes):
    """Issue 15's goals against this run's save.json, trace-*.json, qemu.json and
    open.json: a markdown section, or "" when none of them is here."""
    save = load_json(os.path.join(dirname, "save.json"), notes) \
        if os.path.exists(os.path.join(dirname, "save.json")) else None
    qemu = load_json(os.path.join(dirname, "qemu.json"), notes) \
        if os.path.exists(os.path.join(dirname, "qemu.json")) else None
    opn = load_json(os.path.join(dirname, "open.json"), notes) \
        if os.path.exists(os.path.join(dirname, "open.json")) else None
    rows = []
    if save:
        res = {r.get("name"): r for r in save.get("results") or []}
        h, c = res.get("halite"), res.get("cow-wp-physical")
        if h and c:
            hp, cp = num(h.get("fault_p99_us")), num(c.get("fault_p99_us"))
            rows.append(["fault service p99 during a save <= the copy-on-write peer's "
                         "(halite-bench-save)",
                         f"halite {sig(hp)} us (max {sig(num(h.get('fault_max_us')))}), "
                         f"cow-wp-physical {sig(cp)} us (max "
                         f"{sig(num(c.get('fault_max_us')))})",
                         yes_no(None if hp is None or cp is None else hp <= cp)])
    for name, tm in traces:
        vm_ok, ratio_ok, vm, ratio = trace_goal(tm)
        rows.append([f"trace {name}: locality VM access >= {GOAL_VM_PCT:g}%, demand reads "
                     f"<= {GOAL_DEMAND_RATIO:g}x physical's",
                     f"{fmt_pct(vm)}, {fmt_x(ratio, 2)}",
                     yes_no(None if vm_ok is None or ratio_ok is None else vm_ok and ratio_ok)])
    for cache, cs in sorted(((qemu or {}).get("summary") or {}).items()):
        hal, eag = cs.get("halite") or {}, cs.get("qemu-eager") or {}
        goals = cs.get("goals") or {}

        def ms(v):
            v = num(v)
            return "-" if v is None else f"{v * 1e3:.1f} ms"
        rows.append([f"QEMU guest, {cache}: first HTTP answer (held connection) <= 1/3 of "
                     "eager's",
                     f"halite {fmt_s(hal.get('first_http_s_median'))}, eager "
                     f"{fmt_s(eag.get('first_http_s_median'))}",
                     yes_no(goals.get("first_http_third_of_eager"))])
        rows.append([f"QEMU guest, {cache}: mean latency of 1000 requests <= eager's",
                     f"halite {ms(hal.get('requests_mean_s_median'))}, eager "
                     f"{ms(eag.get('requests_mean_s_median'))}",
                     yes_no(goals.get("requests_mean_le_eager"))])
        rows.append([f"QEMU guest, {cache}: max latency of 1000 requests <= eager's",
                     f"halite {ms(hal.get('requests_max_s_median'))}, eager "
                     f"{ms(eag.get('requests_max_s_median'))}",
                     yes_no(goals.get("requests_max_le_eager"))])
    if opn:
        by = {}
        for r in opn.get("results") or []:
            by.setdefault(r.get("gib"), {})[r.get("format")] = num(r.get("open_to_running_ms"))
        if by:
            top = max(by)
            new, old = by[top].get("1.1"), by[top].get("1.0")
            rows.append([f"open to guest running <= 5 ms (largest size here: {top} GiB)",
                         f"format 1.1 {sig(new)} ms, 1.0 {sig(old)} ms; 1.1 by size: " +
                         ", ".join(f"{g} GiB {sig(by[g].get('1.1'))}" for g in sorted(by)),
                         yes_no(None if new is None else new <= 5.0)])
    if not rows:
        return ""
    return ("\n## Issue 15's goals in this run\n\nEach row from this run's JSON (save.json, "
            "trace-*.json, qemu.json, open.json); timings on a shared or small machine are "
            "noisy, so read a row as this run's outcome.\n\n" +
            md_table(["goal", "this run", ""], rows, ["l", "l", "l"]) + "\n")


def issue17_goals(dirname, notes):
    """Issue 17's goals against this run's qemu-learn.json (bench/qemu.py --learn):
    the relayouted file against the original, per added read latency; a
    markdown section, or "" when it is not here."""
    path = os.path.join(dirname, "qemu-learn.json")
    if not os.path.exists(path):
        return ""
    q = load_json(path, notes)
    if not q:
        return ""
    rows = []
    lr = get(q, "learn", "relayout") or {}

    def count(v):
        v = num(v)
        return "-" if v is None else f"{v:g}"

    for cache, cs in sorted((q.get("summary") or {}).items()):
        for lat, row in sorted((cs.get("learn") or {}).items(),
                               key=lambda kv: num(kv[0].split("_")[1][:-2]) or 0):
            a, b, g = row.get("original") or {}, row.get("relayout") or {}, row.get("goals") or {}
            what = f"QEMU guest, {cache}, {lat.split('_')[1]} per read"
            c = row.get("relayout_nohot") or {}
            rows.append([f"{what}: relayouted layout's VM access >= 83% (--hot-prefix 0)",
                         f"{fmt_pct(num(c.get('vm_access_pct_median')))} (original "
                         f"{fmt_pct(num(a.get('vm_access_pct_median')))}; with the hot "
                         f"prefix read first {fmt_pct(num(b.get('vm_access_pct_median')))})",
                         yes_no(g.get("vm_access_ge_83"))])
            rows.append([f"{what}: demand reads <= 1/3 of the original file's",
                         f"{count(b.get('lb_demand_median'))} against "
                         f"{count(a.get('lb_demand_median'))} ("
                         f"{count(b.get('lb_hot_median'))} hot LBs read first)",
                         yes_no(g.get("demand_le_third"))])
            rows.append([f"{what}: first answer <= 1/2 of the original file's"
                         + (" (the goal is at 1 ms)" if not lat.startswith("latency_1000us")
                            else ""),
                         f"{fmt_s(b.get('first_http_s_median'))} against "
                         f"{fmt_s(a.get('first_http_s_median'))}",
                         yes_no(g.get("first_http_le_half"))])
    if not rows:
        return ""
    return ("\n## Issue 17's goals in this run\n\nbench/qemu.py --learn: one learning "
            f"restore, the file relayouted from it (hot prefix {lr.get('hot_lbs', '-')} LBs, "
            f"{lr.get('hot_blocks', '-')} blocks), then restores of both files with "
            "--track-access (medians). Timings on a shared machine are noisy.\n\n" +
            md_table(["goal", "this run", ""], rows, ["l", "l", "l"]) + "\n")


# --- Figure 4 --------------------------------------------------------------------

def compress_points(dirname, notes):
    """[(pct, locality result, halite result, run)] from compress-*.json, by pct."""
    pts = []
    for path in sorted(glob.glob(os.path.join(dirname, "compress-*.json"))):
        c = load_json(path, notes)
        if c is None:
            continue
        pct = num(get(c, "params", "compress_pct"))
        if pct is None:
            stem = os.path.basename(path)[len("compress-"):-len(".json")]
            pct = num(stem)
        if pct is None:
            continue
        res = c.get("results") or []
        loc = next((r for r in res if r.get("name") == "locality"), None)
        hal = next((r for r in res if r.get("name") == "halite"), None)
        pts.append((pct, loc, hal, c))
    pts.sort(key=lambda p: p[0])
    return pts


def stored_pct(c):
    """The saved file's stored bytes as a percentage of raw, or None."""
    raw, stored = num(get(c, "save", "raw_bytes")), num(get(c, "save", "stored_bytes"))
    return 100.0 * stored / raw if raw and stored else None


def improvement(loc, hal):
    a = num(loc.get("restore_overhead_s")) if loc else None
    b = num(hal.get("restore_overhead_s")) if hal else None
    if a is None or b is None or a <= 0:
        return None
    return 1 - b / a


def fig4(pts, path):
    if not pts:
        return False
    series = [("locality", "locality blocks, uncompressed", 1),
              ("halite", "halite: compressed (+ zero elision, guest-virtual order)", 2)]
    vals = []
    for _, loc, hal, _ in pts:
        for r in (loc, hal):
            v = num(r.get("restore_overhead_s")) if r else None
            if v is not None:
                vals.append(v)
    pos = [v for v in vals if v > 0]
    use_log = bool(pos) and max(pos) / min(pos) > 20
    left, right, top, ph = 90, 40, 100, 340
    width, height = 760, top + ph + 136
    svg = Svg(width, height)
    x0, x1 = left, width - right
    bottom = top + ph
    if use_log:
        ax = LogAxis(min(pos), max(pos), top, bottom)
        ylabel = "restore overhead, log scale"
    else:
        ax = LinAxis(max(vals) if vals else 1.0, top, bottom)
        ylabel = "restore overhead"
    first = pts[0][3]
    cache = get(first, "params", "caches") or []
    lats = get(first, "params", "read_latencies_us") or []
    cond = f"{', '.join(cache)} cache, {', '.join(fmt_lat(x) for x in lats)} per read"
    svg.text(width / 2, 24, "Compressed against uncompressed across compressibility "
             "(the paper's Figure 4)", 16, "middle", "bold")
    p = dict(first.get("params") or {})
    p.pop("compress_pct", None)
    svg.text(width / 2, 43, f"{guest_line({'params': p})}; {cond}; lower is better", 12,
             "middle", fill="#555")
    ax.draw(svg, x0, x1, ylabel)

    def xp(pct):
        return x0 + 20 + (pct / 100.0) * (x1 - x0 - 40)

    svg.line(x0, bottom, x1, bottom, "#000", 1)
    for pct in range(0, 101, 10):
        x = xp(pct)
        svg.line(x, bottom, x, bottom + 5, "#000", 1)
        svg.text(x, bottom + 19, f"{pct}%", 11, "middle")
    svg.text(x0 - 8, bottom + 38, "gain:", 11, "end", "bold", fill="#e15759")
    for pct, loc, hal, _ in pts:
        imp = improvement(loc, hal)
        svg.text(xp(pct), bottom + 38, f"{imp * 100:.0f}%" if imp is not None else "-", 11,
                 "middle", "bold", fill="#e15759")
    svg.text(x0 - 8, bottom + 54, "stored:", 11, "end", fill="#555")
    for pct, _, _, c in pts:
        st = stored_pct(c)
        svg.text(xp(pct), bottom + 54, f"{st:.0f}%" if st is not None else "-", 11,
                 "middle", fill="#555")
    svg.text((x0 + x1) / 2, bottom + 78, "data compresses to (% of its size; smaller is more "
             "compressible)", 12, "middle")

    # Legend.
    lx, ly = left + 10, 62
    for key, label, marker in series:
        svg.line(lx, ly + 6, lx + 26, ly + 6, COLOURS[key], 2.5)
        draw_marker(svg, lx + 13, ly + 6, marker, COLOURS[key])
        svg.text(lx + 34, ly + 10, label, 12)
        lx += 50 + 6.6 * len(label)

    def value(r):
        return num(r.get("restore_overhead_s")) if r else None

    for key, _, marker in series:
        xy = []
        for pct, loc, hal, _ in pts:
            r, other = (loc, hal) if key == "locality" else (hal, loc)
            v = value(r)
            if v is None or (use_log and v <= 0):
                continue
            # The higher of the two points at this x is labelled above, the other below.
            o = value(other)
            above = o is None or v > o or (v == o and key == "locality")
            xy.append((xp(pct), ax.y(max(v, ax.floor)), v, above))
        if len(xy) > 1:
            d = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in xy)
            svg.add(f'<polyline points="{d}" fill="none" stroke="{COLOURS[key]}" '
                    f'stroke-width="2.5"/>')
        for x, y, v, above in xy:
            draw_marker(svg, x, y, marker, COLOURS[key])
            svg.text(x, y + (-10 if above else 18), fmt_s(v), 10, "middle", fill="#333")
    svg.text(left, height - 24, "Gain: 1 − halite's overhead / locality's at that "
             "compressibility (the paper: 89% at 10% down to 26% at 90%, zlib).", 10,
             fill="#666")
    svg.text(left, height - 10, "Stored: the saved file's stored bytes over raw bytes (what "
             "the codec managed). Each point: its own save and baseline.", 10, fill="#666")
    svg.write(path)
    return True


def draw_marker(svg, x, y, kind, colour):
    if kind == 1:
        svg.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{colour}" '
                f'stroke="#fff" stroke-width="1"/>')
    else:
        svg.rect(x - 4.5, y - 4.5, 9, 9, colour, "#fff", ' stroke-width="1"')


# --- the claims --------------------------------------------------------------------

def verdict(ok):
    return "**holds**" if ok else "**does not hold**"


def claims(m, fio, fault, quick):
    """[(claim, verdict, numbers)] for issue 5's 'What the numbers must show'."""
    out = []
    work = "the reduced (--quick) workload" if quick else "the paper's workload"
    # 1. VM access % of locality blocks.
    c = "Access-locality blocks: VM access % above the paper's 83%"
    r = track_of(m, "locality") if m else None
    v = num(r.get("vm_access_pct")) if r else None
    if v is None and m:
        rr = next((x for x in m.get("results") or [] if x.get("name") == "locality"), None)
        v = num(rr.get("vm_access_pct")) if rr else None
    if v is None:
        out.append((c, "not measured", "no VM access run for locality"))
    else:
        out.append((c, verdict(v > 83), f"locality {v:.1f}% on {work} (paper: 83%)"))

    # 2. locality demand reads at most half of physical's.
    c = "Access-locality blocks: reads from storage at most half of physical-address blocks'"
    tl, tp = (track_of(m, "locality"), track_of(m, "physical")) if m else (None, None)
    a, b = demand_of(tl), demand_of(tp)
    src = "VM access runs"
    if a is None or b is None:
        # No VM access runs: the coldest, slowest timed condition instead.
        conds = [x for x in conditions(m) if x[0] == "cold"] or conditions(m) if m else []
        if conds:
            cache, lat = max(conds, key=lambda x: num(x[1]) or 0)
            a = num((result(m, "locality", cache, lat) or {}).get("demand_reads"))
            b = num((result(m, "physical", cache, lat) or {}).get("demand_reads"))
            src = f"timed runs, {cache} cache, {fmt_lat(lat)}"
    if a is None or b is None:
        out.append((c, "not measured", "no demand read counts for locality and physical"))
    else:
        ratio = a / b if b else None
        extra = ""
        tot = [num((x or {}).get("storage_reads")) for x in (tl, tp)]
        if None not in tot:
            extra = (f"; all reads, demand + prefetch: locality {int(tot[0]):,}, physical "
                     f"{int(tot[1]):,} (a completed restore reads every LB once)")
        out.append((c, verdict(b > 0 and a <= b / 2),
                    f"LB reads on demand ({src}): locality {int(a):,}, physical {int(b):,}"
                    f" = {sig(ratio, 2) if ratio is not None else '-'} of physical's"
                    f" on {work}{extra}"))

    # 3-5. halite against the peers at 5 ms, cold cache.
    peers = [("4k-on-demand", 10, "at most a tenth of 4 KiB-per-fault (4k-on-demand)"),
             ("mmap-private", 3, "at most a third of MAP_PRIVATE paging (mmap-private)"),
             ("eager", 1, "below eager")]
    have = conditions(m) if m else []
    at5 = ("cold", 5000) if any(x[0] == "cold" and num(x[1]) == 5000 for x in have) else None
    cold = [x for x in have if x[0] == "cold"]
    near = max(cold, key=lambda x: num(x[1]) or 0) if cold else None
    for peer, k, what in peers:
        c = f"Full Halite: restore overhead {what}, at 5 ms read latency, cold cache"
        if at5:
            h = num((result(m, "halite", *at5) or {}).get("restore_overhead_s"))
            p = num((result(m, peer, *at5) or {}).get("restore_overhead_s"))
            if h is None or p is None:
                out.append((c, "not measured", f"halite {fmt_s(h)}, {peer} {fmt_s(p)}"))
                continue
            ok = h < p if k == 1 else h <= p / k
            rel = f"{sig(h / p, 2)} of it" if p > 0 else "peer overhead ≤ 0"
            out.append((c, verdict(ok), f"halite {fmt_s(h)}, {peer} {fmt_s(p)} ({rel})"))
        else:
            note = "no run at 5 ms with cold cache"
            if near:
                h = num((result(m, "halite", *near) or {}).get("restore_overhead_s"))
                p = num((result(m, peer, *near) or {}).get("restore_overhead_s"))
                if h is not None and p is not None:
                    ok = h < p if k == 1 else h <= p / k
                    rel = f"{sig(h / p, 2)} of it" if p > 0 else "peer ≤ 0"
                    note += (f"; at the slowest cold condition measured ({fmt_lat(near[1])}) "
                             f"halite {fmt_s(h)}, {peer} {fmt_s(p)} ({rel}): would "
                             f"{'hold' if ok else 'not hold'} there")
            out.append((c, "not measured", note))

    # 6. a fault from storage against the machine's limit.
    c = ("A fault answered from storage costs within 1.5x of this machine's limit "
         "(one LB read + one decompression + one install), engine p50")
    if fault is None:
        out.append((c, "not measured", "no fault.json (halite-bench fault not run or "
                    "not built)"))
    else:
        out.append((c,) + fault_verdict(fault))
    return out


def flatten(d, prefix=""):
    """[(dotted key, scalar)] of a JSON value."""
    items = []
    if isinstance(d, dict):
        for k, v in d.items():
            items += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            name = v.get("name") if isinstance(v, dict) else None
            items += flatten(v, f"{prefix}[{name if isinstance(name, str) else i}]")
    else:
        items.append((prefix, d))
    return items


def fault_conditions(fault):
    """halite-bench fault's per-condition rows, if its JSON has them."""
    conds = fault.get("conditions") if isinstance(fault, dict) else None
    if not isinstance(conds, list):
        return []
    return [c for c in conds if isinstance(c, dict) and
            (num(c.get("ratio")) is not None or isinstance(c.get("within_1_5x"), bool))]


def fault_within(c):
    """Whether one condition's engine p50 is within 1.5x of its limit, or None."""
    if isinstance(c.get("within_1_5x"), bool):
        return c["within_1_5x"]
    r = num(c.get("ratio"))
    return None if r is None else r <= 1.5


def fault_verdict(fault):
    """(verdict, numbers) from halite-bench fault's JSON, whose format is not fixed:
    per condition a ratio of the engine's p50 to the limit and whether it is within
    1.5x; else any ratio or verdict-like boolean found in it."""
    conds = fault_conditions(fault)
    if conds:
        parts, oks = [], []
        for c in conds:
            ok = fault_within(c)
            oks.append(ok)
            parts.append(f"{c.get('cache', '?')}, {fmt_lat(c.get('read_latency_us'))}: engine "
                         f"p50 {fmt_us(c.get('engine_fault_p50_us'))} against a limit of "
                         f"{fmt_us(c.get('limit_us'))} = {fmt_x(c.get('ratio'), 3)}"
                         f"{'' if ok is None else ' (within)' if ok else ' (over)'}")
        if None in oks:
            v = "not measured" if all(o is None for o in oks) else \
                "**does not hold**" if False in oks else "not measured"
        else:
            v = verdict(all(oks))
            if not all(oks) and any(oks):
                v = "**does not hold** (holds in some conditions)"
        return v, "; ".join(parts)
    flat = flatten(fault)
    ratios = [(k, num(v)) for k, v in flat
              if "ratio" in k.lower().rsplit(".", 1)[-1] and num(v) is not None]
    bools = [(k, v) for k, v in flat if isinstance(v, bool) and
             any(w in k.lower().rsplit(".", 1)[-1] for w in ("within", "holds", "pass", "meets"))]
    p50 = [(k, num(v)) for k, v in flat if "p50" in k.lower() and num(v) is not None]
    def others(key):
        s = "; ".join(f"{k} = {v:g}" for k, v in (ratios + p50)[:6] if k != key)
        return f"; {s}" if s else ""

    if bools:
        k, v = bools[0]
        return verdict(v), f"{k} = {str(v).lower()}" + others(k)
    if ratios:
        pref = [x for x in ratios if "limit" in x[0].lower() or "p50" in x[0].lower()]
        k, v = (pref or ratios)[0]
        return verdict(v <= 1.5), f"{k} = {v:.2f} (at most 1.5)" + others(k)
    return "not measured", ("fault.json has no ratio or verdict this script recognises: "
                            "see the fault check above")


# --- summary.md ---------------------------------------------------------------------

def results_table(m, cache, lat):
    hal = num((result(m, "halite", cache, lat) or {}).get("restore_overhead_s"))
    rows = []
    for n in present_names(m):
        r = result(m, n, cache, lat)
        if r is None:
            continue
        v = num(r.get("restore_overhead_s"))
        vs = fmt_x(v / hal) if v is not None and hal and hal > 0 and n != "halite" else "-"
        status = "ok" if r.get("ok") is not False and not r.get("error") else \
            f"FAILED{': ' + str(r['error']) if r.get('error') else ''}"
        if r.get("failed_translations"):
            status += f", {r['failed_translations']} failed translations"
        rows.append([n, r.get("kind", "-"), fmt_s(v), vs, fmt_s(r.get("first_access_s")),
                     fmt_int(r.get("demand_reads")), fmt_int(r.get("storage_reads")),
                     fmt_mib(r.get("bytes_read")), fmt_int(r.get("demand_faults")),
                     fmt_pct(r.get("vm_access_pct")), r.get("content") or "-", status])
    return md_table(["method", "kind", "restore overhead", "÷ halite's", "first access",
                     "demand reads", "reads", "MiB read", "demand faults", "VM access %",
                     "memory", "status"], rows,
                    ["l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "l", "l"])


def oddities(m, pts, fio, runs, notes):
    odd = list(notes)
    for r in runs:
        if r["rc"] not in (0, None):
            what = {77: "skipped (no userfaultfd)", 1: "a run or a check failed"}.get(
                r["rc"], "failed")
            odd.append(f"`{r['command']}` exited {r['rc']}: {what}")
    if m:
        if m.get("error"):
            odd.append(f"micro.json error: {m['error']}")
        allruns = [("", r) for r in m.get("results") or []] + \
            [("VM access run ", r) for r in m.get("vm_access_runs") or []]
        for tag, r in allruns:
            where = f"{tag}{r.get('name')} ({r.get('cache')}, {fmt_lat(r.get('read_latency_us'))})"
            if r.get("ok") is False or r.get("error"):
                odd.append(f"{where} failed: {r.get('error') or 'ok is false'}")
            if r.get("content") == "mismatch":
                odd.append(f"{where}: memory differs from the snapshot "
                           f"({fmt_int(r.get('pages_wrong'))} pages)")
            if num(r.get("failed_translations")):
                odd.append(f"{where}: {r['failed_translations']} failed translations")
            v = num(r.get("restore_overhead_s"))
            if tag == "" and v is None:
                odd.append(f"{where}: no restore overhead (null)")
            elif tag == "" and v <= 0:
                odd.append(f"{where}: restore overhead {fmt_s(v)} ≤ 0: no slower than the "
                           "baseline, within its noise")
        if get(m, "save", "content") not in (None, "exact"):
            odd.append(f"the saved file is not the snapshot: {get(m, 'save', 'content')}")
        bl = [num(x) for x in m.get("baseline_runs_s") or [] if num(x)]
        if len(bl) > 1 and max(bl) / min(bl) > 1.2:
            odd.append(f"baseline runs spread {sig(max(bl) / min(bl), 2)}x "
                       f"({', '.join(fmt_s(x) for x in bl)}): overheads smaller than that "
                       "spread are noise")
        vm = {n: num((track_of(m, n) or {}).get("vm_access_pct")) for n in ORGS}
        exact = [n for n in ORGS if vm[n] is not None and vm[n] >= 99.95]
        if exact:
            odd.append(f"VM access % exactly 100.0 for {', '.join(exact)}: every block that "
                       "came with a demand read was touched (the paper's best is 83%)")
        if vm["physical"] is not None and vm["random"] is not None and \
                vm["physical"] < vm["random"]:
            odd.append(f"VM access %: physical ({vm['physical']:.1f}%) below random "
                       f"({vm['random']:.1f}%), unlike the paper (36% against 19%)")
        base = num(m.get("baseline_s"))
        for cache, lat in conditions(m):
            h = num((result(m, "halite", cache, lat) or {}).get("restore_overhead_s"))
            lo = num((result(m, "locality", cache, lat) or {}).get("restore_overhead_s"))
            if h is not None and lo is not None and h > lo * 1.1 and h - lo > 0.005:
                odd.append(f"{cache}, {fmt_lat(lat)}: halite ({fmt_s(h)}) slower than "
                           f"uncompressed locality blocks ({fmt_s(lo)})")
            best = None
            for n in PEERS:
                v = num((result(m, n, cache, lat) or {}).get("restore_overhead_s"))
                if v is not None and (best is None or v < best[1]):
                    best = (n, v)
            if h is not None and best and best[1] < h:
                odd.append(f"{cache}, {fmt_lat(lat)}: halite loses to a peer: {best[0]} "
                           f"{fmt_s(best[1])} against halite {fmt_s(h)}")
            mp = result(m, "mmap-private", cache, lat)
            if mp and num(lat) and num(mp.get("storage_reads")) == 0:
                odd.append(f"warm, {fmt_lat(lat)}: mmap-private counted 0 reads: the kernel "
                           "served the image from the page cache, so the added latency never "
                           "applied")
        if base and base < 0.2:
            odd.append(f"the baseline run is short ({fmt_s(base)}): the quick run's "
                       "overheads are dominated by restore start-up and scheduling on this "
                       "machine, and 2 cores for 4 vCPUs + the engine's threads makes them noisy")
    bl = [num(c.get("baseline_s")) for _, _, _, c in pts]
    bl = [x for x in bl if x]
    if len(bl) > 1 and max(bl) / min(bl) > 1.2:
        odd.append(f"Figure 4's baselines range {fmt_s(min(bl))} to {fmt_s(max(bl))} across "
                   "its runs: differences between its points smaller than that are noise")
    for pct, loc, hal, c in pts:
        st = stored_pct(c)
        if st is not None and abs(st - pct) > 10:
            odd.append(f"--compress {pct:g}: the codec ({get(c, 'params', 'codec') or '?'}) "
                       f"stored {st:.0f}% of the raw bytes, not ~{pct:g}%")
        imp = improvement(loc, hal)
        if imp is not None and imp < 0:
            odd.append(f"compressibility {pct:g}%: compressed halite slower than uncompressed "
                       f"locality ({fmt_s(hal.get('restore_overhead_s'))} against "
                       f"{fmt_s(loc.get('restore_overhead_s'))})")
    return odd


def summary(dirname, m, pts, fio, fault, runs, notes, figs):
    quick = bool(get(m, "params", "quick")) if m else any("--quick" in r["command"]
                                                           for r in runs)
    L = ["# Halite benchmarks (issue 5)", ""]
    L.append(f"Made by bench/plot.py from the JSON in `{dirname}` on "
             f"{time.strftime('%Y-%m-%d %H:%M %Z')}"
             f"{'; a --quick run (reduced sizes)' if quick else ''}.")
    L.append("")
    # Machine.
    mach = (m or {}).get("machine") or {}
    st = mach.get("storage") or {}
    if mach:
        L += ["## Machine", ""]
        mem = num(mach.get("memory_bytes"))
        rot = st.get("rotational")
        L.append(md_table(["", ""], [
            ["CPU", f"{mach.get('cpu', '-')}, {mach.get('cores', '-')} cores"],
            ["memory", f"{mem / 2**30:.1f} GiB" if mem else "-"],
            ["kernel", mach.get("kernel", "-")],
            ["storage", f"{st.get('dir', '-')} on {st.get('device') or '?'}"
             f"{' (' + st['model'] + ')' if st.get('model') else ''}"
             f"{'' if rot is None else ', rotational' if rot else ', non-rotational'}"],
        ], ["l", "l"]))
        L.append("")
    # Parameters.
    if m:
        p = m.get("params") or {}
        L += ["## Parameters", ""]
        rows = [["guest", guest_line(m)],
                ["stride / pattern", f"{p.get('stride', '-')} pages / {p.get('pattern', '-')}"],
                ["writes, zero pages, never touched",
                 f"{p.get('write_pct', '-')}%, {p.get('zero_pct', '-')}%, "
                 f"{p.get('untouched_pct', '-')}%"],
                ["passes (snapshot at half)", fmt_int(p.get("passes"))],
                ["memory block / locality block",
                 f"{fmt_int(p.get('mb_bytes'))} / {fmt_int(p.get('lb_bytes'))} bytes"],
                ["storage conditions", f"{', '.join(p.get('caches') or [])} cache x "
                 f"{', '.join(fmt_lat(x) for x in p.get('read_latencies_us') or [])} per read"],
                ["VM access run", "none" if not p.get("vm_access_run") else
                 f"{p['vm_access_run'].get('cache')} cache, "
                 f"{fmt_lat(p['vm_access_run'].get('read_latency_us'))} per read"],
                ["baseline (no restore)", f"{fmt_s(m.get('baseline_s'))}, median of "
                 f"{', '.join(fmt_s(x) for x in m.get('baseline_runs_s') or [])}"],
                ["seed", str(p.get("seed", "-"))]]
        sv = m.get("save") or {}
        if sv:
            raw, stored = num(sv.get("raw_bytes")), num(sv.get("stored_bytes"))
            rows.append(["saved file", f"{fmt_mib(sv.get('file_bytes'))} MiB, compression "
                         f"{sig(raw / stored, 3) + 'x' if raw and stored else '-'}, "
                         f"saved in {fmt_s(sv.get('duration_s'))}, content "
                         f"{sv.get('content') or '-'}"])
        files = m.get("files") or {}
        if files:
            rows.append(["files", ", ".join(
                f"{k} {fmt_mib(get(files, k, 'bytes'))} MiB" for k in ORGS if k in files)])
        L.append(md_table(["", ""], rows, ["l", "l"]))
        L.append("")
    # Commands.
    L += ["## Commands", ""]
    if runs:
        L.append("Run from the repository's top directory, in this order (exit code, time):")
        L.append("")
        L.append("```sh")
        for r in runs:
            L.append(f"{r['command']}    # -> {r['file']}: exit {r['rc']}, "
                     f"{r['seconds']:.0f} s" if r["seconds"] is not None else r["command"])
        L.append(f"bench/plot.py {dirname}")
        L.append("```")
        tot = sum(r["seconds"] or 0 for r in runs)
        L.append("")
        L.append(f"Benchmarks took {tot:.0f} s in all.")
    else:
        L.append("Not recorded (no runs.tsv: bench/run.sh writes it).")
    L.append("")
    # Figures.
    L += ["## Figures and Table 1", ""]
    for f, what in (("fig2-overhead.svg", "Figure 2: restore overhead"),
                    ("fig4-compress.svg", "Figure 4: compressed vs uncompressed")):
        if f in figs:
            L.append(f"![{what}]({f})")
            L.append("")
    L.append("Table 1: [table1.md](table1.md)." if "table1.md" in figs else "No Table 1.")
    L.append("")
    # Results per condition.
    if m and conditions(m):
        L += ["## Restore overhead per storage condition", "",
              "Restore overhead = the run with a restore − the baseline run without one; "
              "first access: from the restore's start to the first guest access that "
              "completed; *÷ halite's*: how many times halite's overhead. Demand reads: reads "
              "a fault waited for; reads: all read requests (an organisation's: every LB, "
              "demand and prefetch; mmap-private: the kernel's, counted from the process's "
              "I/O; eager: large sequential chunks).", ""]
        for cache, lat in conditions(m):
            L += [f"### {cache} cache, {fmt_lat(lat)} per read", "", results_table(m, cache, lat),
                  ""]
    # Table 1 inline.
    if m:
        t1 = table1(m).split("\n", 2)[2].split("\n## ")[0]
        L += ["## Table 1: reads and VM access % per organisation", "", t1.strip(), "",
              "Per storage condition: [table1.md](table1.md).", ""]
    # Figure 4 table.
    if pts:
        first = pts[0][3]
        L += ["## Compressibility (Figure 4)", "",
              f"{', '.join(get(first, 'params', 'caches') or [])} cache, "
              f"{', '.join(fmt_lat(x) for x in get(first, 'params', 'read_latencies_us') or [])}"
              " per read; each point its own save and baseline. *Gain*: 1 − halite's "
              "overhead / locality's (the paper: 89% at 10% down to 26% at 90%, zlib).", ""]
        rows = []
        for pct, loc, hal, c in pts:
            imp = improvement(loc, hal)
            sv = c.get("save") or {}
            raw, stored = num(sv.get("raw_bytes")), num(sv.get("stored_bytes"))
            rows.append([f"{pct:g}%", fmt_s(c.get("baseline_s")),
                         fmt_s((loc or {}).get("restore_overhead_s")),
                         fmt_s((hal or {}).get("restore_overhead_s")),
                         f"{imp * 100:.0f}%" if imp is not None else "-",
                         fmt_mib((loc or {}).get("bytes_read")),
                         fmt_mib((hal or {}).get("bytes_read")),
                         f"{sig(raw / stored, 3)}x" if raw and stored else "-"])
        L.append(md_table(["data compresses to", "baseline", "locality overhead",
                           "halite overhead", "gain", "locality MiB read", "halite MiB read",
                           "compression"], rows))
        L.append("")
    # fio.
    L += ["## This machine's random-read limits (fio)", ""]
    if fio and fio.get("fio"):
        L.append(f"bench/fio.sh: {fio.get('engine', '?')}, O_DIRECT, {fio.get('size', '?')} "
                 f"file in {fio.get('dir', '?')}, {fio.get('runtime_s', '?')} s per job, "
                 f"{fio.get('fio_version', '')}. Latency: fio's completion latency of one read.")
        L.append("")
        rows = [[j.get("name", "-"), f"{fmt_int(num(j.get('bs')) / 1024 if num(j.get('bs')) else None)} KiB",
                 fmt_int(j.get("iodepth")), fmt_int(j.get("iops")),
                 fmt_us(j.get("lat_p50_us")), fmt_us(j.get("lat_p99_us")),
                 f"{num(j.get('bw_mib_s')):,.1f}" if num(j.get("bw_mib_s")) is not None else "-"]
                for j in fio["fio"]]
        L.append(md_table(["job", "block", "queue depth", "IOPS", "p50", "p99", "MiB/s"],
                          rows))
    else:
        L.append("Not measured (no fio.json).")
    L.append("")
    # Fault check.
    L += ["## A fault answered from storage (halite-bench fault)", ""]
    if fault is None:
        L.append("Not measured: no fault.json (`halite-bench fault` is not in this build, or "
                 "it was not run).")
    else:
        conds = fault_conditions(fault)
        if conds:
            p = fault.get("params") or {}
            L.append(f"`halite-bench fault`: {fmt_mib(p.get('mem_bytes'))} MiB image, "
                     f"{p.get('codec', '?')}, {fmt_int(p.get('lb_bytes'))}-byte LBs "
                     f"({fmt_pct(p.get('stored_pct'))} stored), {fmt_int(p.get('touches'))} "
                     "LBs faulted one page each, one at a time. *Limit* = one LB read (QD1) "
                     "+ one block decompression + one install (UFFDIO_COPY waking a faulting "
                     "thread), measured in the same run; the engine also verifies the LB's "
                     "checksum, which the limit leaves out; "
                     "*touch*: the faulting thread's own time, against LB read + "
                     "decompression + the bare fault round trip.")
            L.append("")
            rows = []
            for c in conds:
                ok = fault_within(c)
                rows.append([f"{c.get('cache', '?')}, {fmt_lat(c.get('read_latency_us'))}",
                             f"{fmt_us(c.get('engine_fault_p50_us'))} "
                             f"({fmt_us(c.get('engine_fault_p99_us'))})",
                             fmt_us(c.get("lb_read_p50_us")), fmt_us(c.get("decompress_p50_us")),
                             fmt_us(c.get("install_p50_us", c.get("uffd_copy_p50_us"))),
                             fmt_us(c.get("verify_p50_us")), fmt_us(c.get("limit_us")),
                             fmt_x(c.get("ratio"), 3),
                             "-" if ok is None else "yes" if ok else "no",
                             f"{fmt_us(c.get('touch_p50_us'))} / "
                             f"{fmt_us(c.get('limit_roundtrip_us'))} = "
                             f"{fmt_x(c.get('touch_ratio'), 3)}"])
            L.append(md_table(["condition", "engine fault p50 (p99)", "LB read p50",
                               "decompress p50", "install p50", "verify (not in limit)",
                               "limit", "ratio",
                               "within 1.5x", "touch p50 / its limit"], rows))
            L.append("")
            L.append("Its notes and parameters: fault.json.")
        else:
            flat = [(k, v) for k, v in flatten(fault) if not isinstance(v, (dict, list))]
            L.append("fault.json as found (a format this script does not know):")
            L.append("")
            rows = [[f"`{k}`", "null" if v is None else str(v).lower()
                     if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)]
                    for k, v in flat[:80]]
            L.append(md_table(["key", "value"], rows, ["l", "r"]))
            if len(flat) > 80:
                L.append(f"\n… and {len(flat) - 80} more in fault.json.")
    L.append("")
    # Claims.
    L += ["## Issue 5's claims against these numbers", ""]
    if quick:
        L.append("A --quick run: a 128 MiB guest and fewer storage conditions than the "
                 "claims name, so these are indications; the full run (`bench/run.sh`) "
                 "measures the claims' own conditions.")
        L.append("")
    rows = [[i + 1, c, v, n] for i, (c, v, n) in enumerate(claims(m or {}, fio, fault, quick))]
    L.append(md_table(["#", "claim", "verdict", "numbers"], rows, ["r", "l", "l", "l"]))
    L.append("")
    # Oddities.
    odd = oddities(m, pts, fio, runs, notes)
    L += ["## Worth a look", ""]
    if odd:
        L += [f"- {o}" for o in odd]
    else:
        L.append("Nothing this script checks for (failed runs, memory that differs, "
                 "null or ≤ 0 overheads, noisy baselines, halite beaten) turned up.")
    L.append("")
    return "\n".join(L)


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr if len(argv) != 2 else sys.stdout)
        return 0 if len(argv) == 2 else 2
    d = argv[1]
    if not os.path.isdir(d):
        print(f"plot.py: {d}: not a directory", file=sys.stderr)
        return 2
    notes = []
    m = load_json(os.path.join(d, "micro.json"), notes)
    fio = load_json(os.path.join(d, "fio.json"), notes)
    fault = load_json(os.path.join(d, "fault.json"), notes)
    runs = load_runs(os.path.join(d, "runs.tsv"))
    pts = compress_points(d, notes)
    made = []
    if m and fig2(m, os.path.join(d, "fig2-overhead.svg")):
        made.append("fig2-overhead.svg")
    if m:
        with open(os.path.join(d, "table1.md"), "w") as f:
            f.write(table1(m))
        made.append("table1.md")
    if fig4(pts, os.path.join(d, "fig4-compress.svg")):
        made.append("fig4-compress.svg")
    traces = trace_runs(d, notes)
    for name, tm in traces:
        if fig2(tm, os.path.join(d, f"fig2-trace-{name}.svg")):
            made.append(f"fig2-trace-{name}.svg")
    tt = traces_table(m, traces) if traces else ""
    if tt:
        with open(os.path.join(d, "table-traces.md"), "w") as f:
            f.write(tt)
        made.append("table-traces.md")
    if m is None:
        notes.append("no usable micro.json: no Figure 2, no Table 1")
    if not pts:
        notes.append("no compress-*.json: no Figure 4")
    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write(summary(d, m, pts, fio, fault, runs, notes, made))
        if tt:
            f.write("\n## Real programs' traces (issue 15)\n\n" +
                    "Figure 2 per trace: " +
                    ", ".join(f"[{n}](fig2-trace-{n}.svg)" for n, _ in traces) + ".\n\n" +
                    tt.split("\n", 2)[2])
        f.write(issue15_goals(d, traces, notes))
        f.write(issue17_goals(d, notes))
    made.append("summary.md")
    for f in made:
        print(os.path.join(d, f))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
