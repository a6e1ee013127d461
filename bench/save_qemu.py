#!/usr/bin/env python3
"""Issue 15's QEMU save: how much a lazy save (`halite-qemu save`) slows the
QEMU test guest down while it runs, against the same guest not being saved,
in the same run.

    bench/save_qemu.py [--runs 2] [--quick] [--json] ...   (--help)

One run of this script:
1. boots the test guest (scripts/make-guest.sh; TCG, 512 MiB of RAM on a
   shared memfd as tests/qemu boots it, --private for QEMU's default private
   RAM; a 128 MiB verifier region, which the verifier re-reads for ever, so
   every block of it faults once during a save) and waits until it is ready;
2. then a sequence of windows on that one guest, each measured the same way:
     baseline  --baseline seconds, nothing saved
     save      `halite-qemu save --json` of the running guest, from its start
               to its exit (the file is deleted after; the guest runs on);
               mode "halite": the engine's defaults (its fault thread
               SCHED_FIFO where allowed), "halite-no-rt": --no-realtime
   as baseline, save, baseline, save, ..., baseline: --runs times each mode,
   the order alternating from one run to the next. In every window:
     rounds_per_s  the verifier's passes over its region per second of the
                   guest's time, from its /digest ("pass N ... uptime S",
                   written after every pass) read at the window's start and
                   end
     http_*_ms     GET /hello.txt, one request every --http-period seconds
                   on a new connection (busybox httpd forks a CGI-less
                   handler): p50, p99, max of the answers' latencies
   A save's slowdown_pct compares its rounds_per_s with the mean of the two
   baselines around it; its fault figures are halite-qemu save's report.
3. checks at the end that the verifier never saw a mismatch and that its
   on-demand digest (a re-read of the whole region) is as expected;
4. prints one JSON object with --json ({"machine", "params", "windows",
   "saves", "summary": per mode, medians over its saves}), a table
   otherwise; progress on stderr. Nothing asserts timings; the machine's
   load average at the start and end is in "machine" (other work on 2 cores
   shows in every figure).

Exit status: 0 every save succeeded and the guest stayed intact, 1 a save
failed or the guest did not, 2 usage, 77 missing prerequisites (QEMU, the
guest image, root, halite-qemu not built; HALITE_REQUIRE_QEMU=1 makes those
1). Every QEMU this script starts is killed on the way out, error and Ctrl-C
included.
"""
import argparse
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import halite_guest as hg  # noqa: E402


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


qb = _load("halite_bench_qemu", "qemu.py")  # reaper, machine info, unmet()
cq = _load("halite_bench_clones_qemu", "clones_qemu.py")  # pct()
BenchError, log, now, rnd, median = qb.BenchError, qb.log, qb.now, qb.rnd, qb.median

MODES = {"halite": [], "halite-no-rt": ["--no-realtime"]}
DIGEST_RX = re.compile(r"pass (\d+) digest [0-9a-f]+ uptime ([0-9.]+)")
# What each save keeps of halite-qemu save's report.
SAVE_KEYS = ["pause_ms", "save_s", "file_bytes", "faults", "faults_vcpu", "fault_p50_us",
             "fault_p99_us", "fault_max_us", "fault_realtime", "mb_background"]


def passes(guest):
    """(passes, guest uptime at the end of the last one) from the verifier's /digest."""
    body = guest.http("/digest", timeout=30)
    m = DIGEST_RX.search(body)
    if not m:
        raise BenchError(f"/digest: unexpected answer {body!r}")
    return int(m.group(1)), float(m.group(2))


class Prober(threading.Thread):
    """GET /hello.txt every @period seconds until stopped: the latencies."""

    def __init__(self, port, period):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/hello.txt"
        self.period = period
        self.lat = []
        self.failed = 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            t = now()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as r:
                    r.read()
                self.lat.append(now() - t)
            except OSError:
                self.failed += 1
            self.halt.wait(max(0.0, self.period - (now() - t)))

    def stop(self):
        self.halt.set()
        self.join()
        return self.lat


def window(args, guest, kind, body):
    """Measure the guest while body() runs; body returns the window's extra fields."""
    prober = Prober(guest.port, args.http_period)
    p0, u0 = passes(guest)
    t0 = now()
    prober.start()
    try:
        extra = body()
    finally:
        lat = prober.stop()
    t1 = now()
    p1, u1 = passes(guest)
    ms = [x * 1e3 for x in lat]
    w = {"kind": kind, "wall_s": rnd(t1 - t0),
         "rounds": p1 - p0, "guest_s": rnd(u1 - u0),
         "rounds_per_s": rnd((p1 - p0) / (u1 - u0)) if u1 > u0 else None,
         "http_requests": len(ms), "http_failed": prober.failed,
         "http_p50_ms": rnd(cq.pct(ms, 0.5), 1), "http_p99_ms": rnd(cq.pct(ms, 0.99), 1),
         "http_max_ms": rnd(max(ms), 1) if ms else None}
    w.update(extra or {})
    return w


def save(args, guest, path, mode):
    """halite-qemu save of the running guest in @mode: its report's figures."""
    cmd = [args.halite_qemu, "save", "--qmp", guest.qmp_path, "--json", "-q",
           *MODES[mode], path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.timeout)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = None
    if p.returncode != 0 or not rep or not rep.get("ok"):
        raise BenchError(f"halite-qemu save ({mode}): exit {p.returncode}\n"
                         f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}")
    out = {"mode": mode, **{k: rep.get(k) for k in SAVE_KEYS}}
    out["file_bytes"] = os.path.getsize(path)
    os.unlink(path)
    return out


def summarize(saves):
    summary = {}
    for mode in MODES:
        rows = [s for s in saves if s["mode"] == mode]
        if rows:
            summary[mode] = {k: rnd(median([r.get(k) for r in rows]), 2) for k in
                             ("slowdown_pct", "rounds_per_s", "baseline_rounds_per_s",
                              "http_p50_ms", "http_p99_ms", "baseline_http_p99_ms",
                              "save_s", "pause_ms", "faults", "fault_p50_us",
                              "fault_p99_us", "fault_max_us")}
            summary[mode]["saves"] = len(rows)
    return summary


def table(result):
    lines = [f"{'mode':<14} {'saves':>5} {'slowdown%':>9} {'rounds/s':>9} {'base r/s':>9} "
             f"{'http p99 ms':>11} {'base p99':>9} {'save s':>7} {'p50 us':>7} {'p99 us':>7} "
             f"{'max us':>8}"]
    for mode, s in result["summary"].items():
        lines.append(f"{mode:<14} {s['saves']:>5} {s['slowdown_pct']!s:>9} "
                     f"{s['rounds_per_s']!s:>9} {s['baseline_rounds_per_s']!s:>9} "
                     f"{s['http_p99_ms']!s:>11} {s['baseline_http_p99_ms']!s:>9} "
                     f"{s['save_s']!s:>7} {s['fault_p50_us']!s:>7} {s['fault_p99_us']!s:>7} "
                     f"{s['fault_max_us']!s:>8}")
    return "\n".join(lines)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [OPTIONS]")
    ap.add_argument("--runs", type=int, default=2,
                    help="saves of each mode; figures are medians (2)")
    ap.add_argument("--quick", action="store_true", help="--runs 1 --baseline 3")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--baseline", type=float, default=5.0,
                    help="seconds of each baseline window (5)")
    ap.add_argument("--http-period", type=float, default=0.2,
                    help="seconds between HTTP probes (0.2)")
    ap.add_argument("--mem-mib", type=int, default=512, help="guest RAM in MiB (512)")
    ap.add_argument("--smp", type=int, default=2, help="vCPUs (2)")
    ap.add_argument("--verifier-mib", type=int, default=128,
                    help="the verifier's region in MiB, re-read for ever (128)")
    ap.add_argument("--private", action="store_true",
                    help="QEMU's default private RAM (-m alone), not a shared memfd")
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the snapshot files go, in a directory made there (/var/tmp)")
    ap.add_argument("--image", metavar="DIR",
                    default=os.path.join(hg.ROOT, "build", "guest-image"),
                    help="the test guest (scripts/make-guest.sh's OUTDIR: build/guest-image)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds allowed per save (300)")
    ap.add_argument("--halite-qemu", metavar="PATH",
                    default=os.environ.get("HALITE_QEMU_BIN") or os.path.join(
                        hg.ROOT, "build", "tools", "halite-qemu", "halite-qemu"),
                    help="halite-qemu ($HALITE_QEMU_BIN, else the build tree's)")
    a = ap.parse_args()
    if a.quick:
        a.runs, a.baseline = 1, 3.0
    if a.runs < 1 or a.baseline <= 0 or a.http_period <= 0:
        ap.error("--runs >= 1, --baseline > 0, --http-period > 0")
    if a.verifier_mib < 1 or a.verifier_mib >= a.mem_mib:
        ap.error("0 < --verifier-mib < --mem-mib")
    return a


def prerequisites(args):
    return hg.bench_prerequisites(args.image, [args.halite_qemu])


def main():
    args = parse_args()
    why = prerequisites(args)
    if why:
        return qb.unmet(why)
    workdir = tempfile.mkdtemp(prefix="halite-save-qemu.")
    os.makedirs(args.dir, exist_ok=True)
    filedir = tempfile.mkdtemp(prefix="halite-save-qemu.", dir=args.dir)
    reaper = qb.Reaper(workdir, filedir)

    def on_term(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_term)
    result = {"machine": None, "params": {
        "runs": args.runs, "modes": MODES, "baseline_s": args.baseline,
        "http_period_s": args.http_period, "mem_mib": args.mem_mib, "smp": args.smp,
        "verifier_mib": args.verifier_mib,
        "ram": "private (-m)" if args.private else "memory-backend-memfd share=on",
        "dir": filedir, "fs": qb.fs_type(filedir),
        "command": " ".join(shlex.quote(a) for a in sys.argv)},
        "windows": [], "saves": [], "summary": {}, "errors": []}
    code = 0
    t_start = now()
    try:
        g = hg.Guest(workdir, "guest", image=args.image, mem_mib=args.mem_mib, smp=args.smp,
                     verifier_mib=args.verifier_mib)
        if args.private:
            g.private_ram()
        reaper.procs.append(g.boot().proc)
        log(f"boot: {args.mem_mib} MiB ({result['params']['ram']}), {args.smp} vCPUs, "
            f"verifier {args.verifier_mib} MiB")
        result["machine"] = qb.source_ready(g, args.halite_qemu)
        path = os.path.join(filedir, "guest.hlt")
        order = []
        for run in range(args.runs):
            modes = list(MODES) if run % 2 == 0 else list(reversed(MODES))
            order += modes
        wins = result["windows"]

        def baseline():
            wins.append(window(args, g, "baseline", lambda: time.sleep(args.baseline)))
            log(f"  baseline: {wins[-1]['rounds_per_s']} rounds/s, "
                f"http p99 {wins[-1]['http_p99_ms']} ms")

        baseline()
        for mode in order:
            log(f"save ({mode})")
            wins.append(window(args, g, "save", lambda m=mode: save(args, g, path, m)))
            w = wins[-1]
            log(f"  {w['save_s']} s, {w['rounds_per_s']} rounds/s, http p99 "
                f"{w['http_p99_ms']} ms, faults {w['faults']} p50 {w['fault_p50_us']} "
                f"p99 {w['fault_p99_us']} max {w['fault_max_us']} us")
            baseline()
            g.check_console()
        # Each save against the baselines just before and just after it.
        for i, w in enumerate(wins):
            if w["kind"] != "save":
                continue
            before, after = wins[i - 1], wins[i + 1]
            base = median([before["rounds_per_s"], after["rounds_per_s"]])
            s = dict(w)
            s["baseline_rounds_per_s"] = rnd(base)
            s["baseline_http_p99_ms"] = median([before["http_p99_ms"], after["http_p99_ms"]])
            s["slowdown_pct"] = (rnd(100.0 * (1.0 - w["rounds_per_s"] / base), 1)
                                 if base and w["rounds_per_s"] is not None else None)
            result["saves"].append(s)
        digest, _, ok = g.digest()
        g.check_console()
        result["params"]["final_digest"] = digest
        if not ok:
            raise BenchError("the guest's on-demand digest differs from the expected one "
                             "after the saves")
        result["summary"] = summarize(result["saves"])
    except (KeyboardInterrupt, BenchError, hg.GuestError, subprocess.SubprocessError,
            OSError) as e:
        code = qb.record_failure(result, e)
    finally:
        reaper.kill_all()
        qb.remove_dirs(workdir, filedir)
    qb.emit(result, args, t_start, table)
    return code


if __name__ == "__main__":
    sys.exit(main())
