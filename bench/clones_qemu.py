#!/usr/bin/env python3
"""Issue 14's QEMU clones: N clones of the QEMU test guest from the clone
service (halite-cloned, each clone a `halite-qemu clone` and its QEMU)
against N independent restores (`halite-qemu restore`, N at once) of the
same snapshot, in the same run.

    bench/clones_qemu.py [--counts 1,2,4] [--runs 3] [--quick] [--json] ...   (--help)

One run of this script:
1. boots the test guest (scripts/make-guest.sh; as tests/clone's case qemu:
   a 64 MiB qcow2 disk on virtio, a vmgenid, user networking with one
   forwarded port; here 512 MiB of RAM and a 256 MiB verifier region like
   bench/qemu.py, TCG), waits until it is ready, freezes the verifier's
   rewrites so the snapshot's digest stays put, saves it with `halite-qemu
   save` and stops it;
2. --runs times, for each N of --counts and each mode (their order
   alternates from one N and run to the next), the snapshot's page cache
   dropped first:
     service      a fresh halite-cloned (temporary --socket, --state-dir,
                  --mem-dir), POST /templates, then at once one POST
                  /templates/ID/clones {"count": N}. The POST answers once
                  all N run; then each clone's forwarded port is read from
                  GET /clones/ID and one connection opened to it.
     independent  N `halite-qemu restore --detach --json` of the snapshot
                  started at once, each with the recorded command line's
                  machine and its own host port, QMP socket, serial file
                  and --disk-dir (restore puts the frozen disk's overlay
                  there, so N restores never share one); a connection to
                  each port is opened as soon as its restore starts (refused
                  until the restore adds the forward, then held).
   Per clone: first_answer_s, from the request (the POST; the first
   restore's start) to the answer of GET /hello.txt on one connection held
   from the moment it can be opened, the request sent once (what
   bench/qemu.py --first-http held does). Once everything is in (service:
   every clone's state "done"; independent: every restore exited): the PSS
   of every clone's QEMU (/proc/PID/smaps_rollup), summed, plus for the
   service the daemon's (it holds the template memory file); the snapshot
   bytes read (service: the template's stats.bytes_read; independent: the
   sum of every restore's JSON report); then every clone is checked from
   inside: /cgi-bin/digest (the verifier re-reads its whole region) must
   equal the snapshot's digest.
3. prints one JSON object with --json ({"machine", "params", "save",
   "results": [{"mode", "clones", "first_answer_p50_s", "first_answer_p95_s",
   "bytes_read", "pss_bytes", "digest_ok", ...}], "errors"}: one result per
   N and mode, each figure the median over the runs, every run's own in its
   "runs"), a table otherwise; progress on stderr. --quick: N = 1, 2, one
   run. Nothing asserts timings.

Exit status: 0 every clone of every run came up with the snapshot's digest,
1 a run or the save failed, 2 usage, 77 missing prerequisites (QEMU, the
guest image, root, halite-qemu or halite-cloned not built;
HALITE_REQUIRE_QEMU=1 makes those 1).

Every process this script starts (daemons, clones, restores, QEMUs) is
killed on the way out, error and Ctrl-C included: their command lines name
its work, snapshot and memory directories.
"""
import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import halite_guest as hg  # noqa: E402


def _load_qemu_bench():
    """bench/qemu.py, for its process reaper, cache and machine helpers."""
    spec = importlib.util.spec_from_file_location("halite_bench_qemu",
                                                  os.path.join(HERE, "qemu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


qb = _load_qemu_bench()
BenchError, log, now, rnd = qb.BenchError, qb.log, qb.now, qb.rnd

MODES = ["service", "independent"]
VMGENID = "c0ffee00-1234-4321-8765-0123456789ab"


def pct(xs, q):
    """The same percentile as halite-bench clones: the sorted value at
    round(q * (n - 1))."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[int(q * (len(xs) - 1) + 0.5)]


def pss(pid, field="Pss"):
    """Proportional set size of @pid in bytes (smaps_rollup; @field another
    of its lines: Anonymous, its private anonymous memory), None if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- the daemon's API ------------------------------------------------------------

class Daemon:
    """One halite-cloned with its own socket, state and memory directories."""

    def __init__(self, args, reaper, name, snapdir):
        self.dir = os.path.join(reaper.workdir, name)
        self.mem = os.path.join(reaper.memdir, name)
        os.makedirs(self.dir)
        os.makedirs(self.mem)
        self.sock = os.path.join(self.dir, "api.sock")
        self.state = os.path.join(self.dir, "state")
        self.log_path = os.path.join(self.dir, "daemon.log")
        with open(self.log_path, "w") as logf:
            self.proc = reaper.popen(
                [args.halite_cloned, "--socket", self.sock, "--state-dir", self.state,
                 "--mem-dir", self.mem, "--qemu-bin", args.halite_qemu,
                 "--snapshot-dir", snapdir],  # the daemon takes snapshots from there only
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
        deadline = now() + 20
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"halite-cloned exited at start ({self.proc.returncode}):\n"
                                 f"{self.log_tail()}")
            try:
                if self.req("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            if now() > deadline:
                raise BenchError("halite-cloned did not answer /healthz within 20 s")
            time.sleep(0.05)

    def log_tail(self, n=3000):
        try:
            with open(self.log_path) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def req(self, method, path, body=None, timeout=600):
        c = hg.UnixHTTPConnection(self.sock, timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            c.request(method, path, body=data,
                      headers={"Content-Type": "application/json"} if data else {})
            r = c.getresponse()
            text = r.read().decode(errors="replace")
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text
        finally:
            c.close()

    def ok(self, method, path, body=None, want=200):
        st, j = self.req(method, path, body)
        if st != want:
            raise BenchError(f"halite-cloned: {method} {path}: HTTP {st}: {j}\n"
                             f"daemon log:\n{self.log_tail()}")
        return j

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- one clone, whichever way it started --------------------------------------------

class Clone:
    def __init__(self, name):
        self.name = name
        self.guest = None        # hg.Guest: port, console, QMP path, QEMU's pid
        self.qemu_pid = None
        self.helper_pid = None   # halite-qemu clone (service)
        self.first_answer_s = None
        self.connected_s = None
        self.error = None
        self.thread = None

    def held(self, t0, deadline, alive):
        try:
            t_conn, t_ans, status, _ = hg.held_get(self.guest.port, "/hello.txt", deadline,
                                                  alive)
            if status != 200:
                raise BenchError(f"GET /hello.txt on the held connection: HTTP {status}")
            self.connected_s, self.first_answer_s = t_conn - t0, t_ans - t0
        except (hg.GuestError, BenchError, OSError) as e:
            self.error = f"{self.name}: {e}"


def check_digests(res, clones, src_digest):
    """Every clone's verifier re-reads its region: its digest must be the snapshot's.
    res["digest_ok"] says whether all are; a BenchError names the clones that differ."""
    res["digest_ok"] = digests_match(clones, src_digest)
    if not res["digest_ok"]:
        raise BenchError("; ".join(c.error for c in clones if c.error))


def digests_match(clones, src_digest):
    ok = True
    for c in clones:
        if c.error:
            ok = False
            continue
        try:
            d, up, expected = c.guest.digest()
            c.guest.check_console()
            c.digest = d
            if not expected or d != src_digest:
                c.error = (f"{c.name}: digest {d} ({'expected' if expected else 'differs'}), "
                           f"the snapshot's is {src_digest}")
                ok = False
        except hg.GuestError as e:
            c.error = f"{c.name}: {e}"
            ok = False
    return ok


def new_result(mode, n):
    return {"mode": mode, "clones": n, "first_answer_p50_s": None, "first_answer_p95_s": None,
            "bytes_read": None, "pss_bytes": None, "digest_ok": False,
            "first_answer_s": [], "connected_s": [], "ready_s": [], "request_s": None,
            "all_in_s": None, "pss_qemu_bytes": None, "pss_daemon_bytes": None,
            "pss_helpers_bytes": None, "qemu_anon_bytes": None, "template_file_bytes": None,
            "lb_decoded": None, "bytes_read_each": None, "cached_bytes_before": None, "error": None}


def finish(res, clones):
    res["first_answer_s"] = [rnd(c.first_answer_s) for c in clones]
    res["connected_s"] = [rnd(c.connected_s) for c in clones]
    res["first_answer_p50_s"] = rnd(pct([c.first_answer_s for c in clones], 0.5))
    res["first_answer_p95_s"] = rnd(pct([c.first_answer_s for c in clones], 0.95))


# --- service -----------------------------------------------------------------------

def run_service(args, reaper, n, snap, src_digest):
    res = new_result("service", n)
    clones = []
    d = Daemon(args, reaper, f"service-{n}", os.path.dirname(snap))
    try:
        qb.drop_cache(snap)
        res["cached_bytes_before"] = qb.cached_bytes(snap)
        t = d.ok("POST", "/templates", {"snapshot": snap}, 201)
        if t.get("kind") != "qemu":
            raise BenchError(f"the template is not of kind qemu: {t}")
        tid = t["id"]
        t0 = now()
        j = d.ok("POST", f"/templates/{tid}/clones", {"count": n}, 201)
        res["request_s"] = rnd(now() - t0)
        deadline = t0 + args.timeout
        for c in j["clones"]:
            reaper.pids.add(c["pid"])
        if len(j["clones"]) != n:
            raise BenchError(f"{len(j['clones'])} clones started of {n}: {j}")
        res["ready_s"] = [rnd(c["ready_s"]) for c in j["clones"]]

        def one(cl, cid):
            try:
                info = d.ok("GET", f"/clones/{cid}")
                cl.qemu_pid, cl.helper_pid = info["qemu_pid"], info["pid"]
                reaper.pids.add(cl.qemu_pid)
                g = hg.Guest(reaper.workdir, cid, image=args.image, mem_mib=args.mem_mib,
                             smp=args.smp, verifier_mib=args.verifier_mib)
                g.adopt(cl.qemu_pid)
                g.port = info["forwards"][0]["host_port"]
                g.console, g.qmp_path = info["serial"], info["qmp"]
                cl.guest = g
            except (BenchError, KeyError, IndexError, TypeError, OSError) as e:
                cl.error = f"{cid}: {e}"
                return
            cl.held(t0, deadline, lambda: None if g.alive() else f"clone {cid}'s QEMU exited")

        for c in j["clones"]:
            cl = Clone(c["id"])
            cl.thread = threading.Thread(target=one, args=(cl, c["id"]), daemon=True)
            cl.thread.start()
            clones.append(cl)
        for cl in clones:
            cl.thread.join()
        errors = [c.error for c in clones if c.error]
        if errors:
            raise BenchError("; ".join(errors))
        # Everything in: every clone "done" (all of its memory in, on its own).
        while True:
            states = {cl.name: d.ok("GET", f"/clones/{cl.name}") for cl in clones}
            bad = {k: v for k, v in states.items() if v["state"] in ("failed", "exited")}
            if bad:
                raise BenchError(f"clones failed: {bad}")
            if all(v["state"] == "done" for v in states.values()):
                break
            if now() > deadline:
                raise BenchError("clones not done by the deadline: " +
                                 ", ".join(f"{k} {v['state']}" for k, v in states.items()))
            time.sleep(0.1)
        res["all_in_s"] = rnd(now() - t0)
        qp = [pss(cl.qemu_pid) for cl in clones]
        qa = [pss(cl.qemu_pid, "Anonymous") for cl in clones]
        res["qemu_anon_bytes"] = sum(qa) if None not in qa else None
        hp = [pss(cl.helper_pid) for cl in clones]
        dp = pss(d.proc.pid)
        if None not in qp and dp is not None:
            res["pss_qemu_bytes"], res["pss_daemon_bytes"] = sum(qp), dp
            res["pss_bytes"] = sum(qp) + dp
        res["pss_helpers_bytes"] = sum(hp) if None not in hp else None
        tj = d.ok("GET", f"/templates/{tid}")
        st = tj.get("stats", {})
        res["bytes_read"] = st.get("bytes_read")
        if st.get("lb_demand") is not None and st.get("lb_prefetch") is not None:
            res["lb_decoded"] = st["lb_demand"] + st["lb_prefetch"]
        res["template_stats"] = st
        try:
            res["template_file_bytes"] = os.stat(os.path.join(d.mem, tid + ".mem")).st_blocks * 512
        except OSError:
            pass
        check_digests(res, clones, src_digest)
    except (BenchError, hg.GuestError, OSError, KeyError, ValueError) as e:
        res["error"] = str(e)
    finally:
        finish(res, clones)
        for cl in clones:
            try:
                d.req("DELETE", f"/clones/{cl.name}", timeout=30)
            except OSError:
                pass
        d.stop()
        for cl in clones:
            for pid in (cl.qemu_pid, cl.helper_pid):
                if pid:
                    qb.kill_pid(pid)
        for pid in reaper.ours():
            qb.kill_pid(pid)
        subprocess.run(["rm", "-rf", "--", d.mem, d.dir])
    return res


# --- independent restores ------------------------------------------------------------

def source_guest(args, workdir, name, image):
    g = hg.Guest(workdir, name, image=args.image, mem_mib=args.mem_mib, smp=args.smp,
                 verifier_mib=args.verifier_mib).with_disk("drive", image)
    g.args += ["-device", f"vmgenid,guid={VMGENID}"]
    return g


def run_independent(args, reaper, n, snap, image, src_digest):
    res = new_result("independent", n)
    clones, procs, outs, errs = [], [], [], []
    try:
        qb.drop_cache(snap)
        res["cached_bytes_before"] = qb.cached_bytes(snap)
        cmds = []
        for i in range(n):
            cl = Clone(f"independent-{n}-{i}")
            cl.guest = source_guest(args, reaper.workdir, cl.name, image)
            disk_dir = os.path.join(reaper.workdir, cl.name + "-disks")
            os.makedirs(disk_dir)
            cmds.append([args.halite_qemu, "restore", "--detach", "--json", "-q",
                         "--disk-dir", disk_dir, snap, "--", "qemu-system-x86_64"] +
                        cl.guest.args)
            outs.append(open(os.path.join(reaper.workdir, cl.name + ".out"), "w+"))
            errs.append(open(os.path.join(reaper.workdir, cl.name + ".err"), "w+"))
            clones.append(cl)
        t0 = now()
        deadline = t0 + args.timeout
        for i in range(n):
            procs.append(reaper.popen(cmds[i], stdin=subprocess.DEVNULL, stdout=outs[i],
                                      stderr=errs[i]))
        for i, cl in enumerate(clones):
            p = procs[i]
            cl.thread = threading.Thread(
                target=cl.held, args=(t0, deadline, lambda p=p: (
                    f"halite-qemu restore exited {p.returncode}"
                    if p.poll() not in (None, 0) else None)), daemon=True)
            cl.thread.start()
        ended = [None] * n
        while None in ended:
            for i, p in enumerate(procs):
                if ended[i] is None and p.poll() is not None:
                    ended[i] = now() - t0
            if now() > deadline:
                raise BenchError("restores not finished by the deadline")
            time.sleep(0.02)
        res["all_in_s"] = rnd(max(ended))
        reports = []
        for i, cl in enumerate(clones):
            outs[i].seek(0)
            text = outs[i].read()
            try:
                rep = json.loads(text)
            except ValueError:
                rep = None
            if procs[i].returncode != 0 or not rep or not rep.get("ok"):
                errs[i].seek(0)
                raise BenchError(f"{cl.name}: halite-qemu restore: exit {procs[i].returncode}"
                                 f"\nstdout: {text[-1500:]}\nstderr: {errs[i].read()[-2500:]}")
            cl.qemu_pid = rep["qemu"]["pid"]
            reaper.pids.add(cl.qemu_pid)
            cl.guest.adopt(cl.qemu_pid)
            reports.append(rep)
        res["ready_s"] = [rnd((r.get("resumed_ms") or 0) / 1e3) for r in reports]
        for cl in clones:
            cl.thread.join(max(0.0, deadline - now()))
        errors = [c.error for c in clones if c.error]
        if errors:
            raise BenchError("; ".join(errors))
        qp = [pss(cl.qemu_pid) for cl in clones]
        qa = [pss(cl.qemu_pid, "Anonymous") for cl in clones]
        res["qemu_anon_bytes"] = sum(qa) if None not in qa else None
        if None not in qp:
            res["pss_qemu_bytes"] = res["pss_bytes"] = sum(qp)
        res["bytes_read_each"] = [r.get("bytes_read") for r in reports]
        if None not in res["bytes_read_each"]:
            res["bytes_read"] = sum(res["bytes_read_each"])
        lbs = [(r.get("lb_demand") or 0) + (r.get("lb_prefetch") or 0) for r in reports]
        res["lb_decoded"] = sum(lbs)
        overlays = {dk.get("overlay") for r in reports for dk in r.get("disks", [])}
        res["disk_overlays"] = len(overlays)
        check_digests(res, clones, src_digest)
    except (BenchError, hg.GuestError, OSError, KeyError, ValueError) as e:
        res["error"] = str(e)
    finally:
        finish(res, clones)
        for p in procs:
            if p.poll() is None:
                p.kill()  # SIGKILL mid-restore: its QEMU blocks, and goes below
                p.wait()
        for cl in clones:
            if cl.qemu_pid:
                qb.kill_pid(cl.qemu_pid)
        for pid in reaper.ours():
            qb.kill_pid(pid)
        for f in outs + errs:
            f.close()
        for cl in clones:
            subprocess.run(["rm", "-rf", "--", os.path.join(reaper.workdir, cl.name + "-disks")])
    return res


def aggregate(n, mode, rows):
    """One result per count and mode: each number the median over the runs
    that succeeded; every run's own figures in "runs"."""
    ok = [r for r in rows if r["error"] is None]
    out = {"mode": mode, "clones": n, "runs_ok": len(ok), "runs": rows}
    for k in ("first_answer_p50_s", "first_answer_p95_s", "bytes_read", "pss_bytes",
              "all_in_s", "request_s", "pss_qemu_bytes", "pss_daemon_bytes",
              "pss_helpers_bytes", "qemu_anon_bytes", "template_file_bytes", "lb_decoded"):
        v = qb.median([r[k] for r in ok])
        out[k] = None if v is None else (rnd(v) if k.endswith("_s") else int(v))
    out["first_answer_max_s"] = rnd(max((r["first_answer_p95_s"] for r in ok
                                         if r["first_answer_p95_s"] is not None), default=None))
    out["digest_ok"] = bool(rows) and all(r["digest_ok"] for r in rows)
    errs = [f"run {r['run']}: {r['error']}" for r in rows if r["error"]]
    out["error"] = "; ".join(errs) if errs else None
    return out


# --- main ------------------------------------------------------------------------

def mib(x):
    return "-" if x is None else f"{x / 1048576:.0f} MiB"


def secs(x):
    return "-" if x is None else f"{x:.2f} s"


def table(result):
    rows = [("mode", "clones", "runs", "1st answer p50", "p95", "all in", "bytes read", "PSS",
             "digest")]
    for r in result["results"]:
        rows.append((r["mode"], str(r["clones"]), f"{r['runs_ok']}/{len(r['runs'])}",
                     secs(r["first_answer_p50_s"]),
                     secs(r["first_answer_p95_s"]), secs(r["all_in_s"]), mib(r["bytes_read"]),
                     mib(r["pss_bytes"]),
                     "ok" if r["digest_ok"] else ("FAILED" if r["error"] else "-")))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        out.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                             for i, c in enumerate(row)))
    for r in result["results"]:
        if r["error"]:
            out.append(f"{r['mode']} x{r['clones']}: {r['error'].splitlines()[0]}")
    return "\n".join(out)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [OPTIONS]")
    ap.add_argument("--counts", default="1,2,4", help="numbers of clones (1,2,4)")
    ap.add_argument("--runs", type=int, default=3,
                    help="times each count and mode is run; figures are medians (3)")
    ap.add_argument("--quick", action="store_true", help="--counts 1,2 --runs 1")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--mem-mib", type=int, default=512, help="guest RAM in MiB (512)")
    ap.add_argument("--smp", type=int, default=2, help="vCPUs (2)")
    ap.add_argument("--verifier-mib", type=int, default=256,
                    help="the verifier's region in MiB, re-read for the digest (256)")
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the snapshot and the disk image go, in a directory made "
                    "there (/var/tmp; a tmpfs makes every run warm)")
    ap.add_argument("--image", metavar="DIR",
                    default=os.path.join(hg.ROOT, "build", "guest-image"),
                    help="the test guest (scripts/make-guest.sh's OUTDIR: build/guest-image)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds allowed for the save and for each count and mode (300)")
    ap.add_argument("--halite-qemu", metavar="PATH",
                    default=os.environ.get("HALITE_QEMU_BIN") or os.path.join(
                        hg.ROOT, "build", "tools", "halite-qemu", "halite-qemu"),
                    help="halite-qemu ($HALITE_QEMU_BIN, else the build tree's)")
    ap.add_argument("--halite-cloned", metavar="PATH",
                    default=os.environ.get("HALITE_CLONED_BIN") or os.path.join(
                        hg.ROOT, "build", "tools", "halite-cloned", "halite-cloned"),
                    help="halite-cloned ($HALITE_CLONED_BIN, else the build tree's)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    a = ap.parse_args()
    if a.quick:
        a.counts, a.runs = "1,2", 1
    try:
        a.ns = [int(x) for x in a.counts.split(",") if x]
    except ValueError:
        ap.error("--counts: numbers, comma-separated")
    if not a.ns or any(x < 1 or x > 64 for x in a.ns):
        ap.error("--counts: 1..64 each")
    if a.runs < 1:
        ap.error("--runs: 1 or more")
    if a.verifier_mib < 1 or a.verifier_mib >= a.mem_mib:
        ap.error("0 < --verifier-mib < --mem-mib")
    return a


def prerequisites(args):
    return hg.bench_prerequisites(args.image, [args.halite_qemu, args.halite_cloned],
                                  "halite-qemu ptraces QEMU; the daemon serves other processes")


def memory_check(args):
    """Refuse a run whose guests would not fit: the independent mode's largest
    count holds that many whole guests at once."""
    try:
        with open("/proc/meminfo") as f:
            avail = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f}["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None
    need = (max(args.ns) + 1) * (args.mem_mib << 20) + (1 << 30)
    if need > avail:
        return (f"{max(args.ns)} guests of {args.mem_mib} MiB need about {need >> 20} MiB; "
                f"{avail >> 20} MiB available")
    return None


def main():
    args = parse_args()
    why = prerequisites(args)
    if why:
        return qb.unmet(why)
    why = memory_check(args)
    if why:
        log("FAIL: " + why)
        return 1
    workdir = tempfile.mkdtemp(prefix="halite-clones-qemu.")
    os.makedirs(args.dir, exist_ok=True)
    filedir = tempfile.mkdtemp(prefix="halite-clones-qemu.", dir=args.dir)
    memdir = tempfile.mkdtemp(prefix="halite-clones-qemu.", dir="/dev/shm")
    reaper = qb.Reaper(workdir, filedir, memdir)
    reaper.memdir = memdir
    snap = os.path.join(filedir, "guest.hlt")
    image = os.path.join(filedir, "disk.qcow2")

    def on_term(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_term)
    result = {"machine": None, "params": {
        "counts": args.ns, "runs": args.runs, "modes": MODES, "mem_mib": args.mem_mib,
        "smp": args.smp, "verifier_mib": args.verifier_mib, "disk": "64 MiB qcow2, virtio (-drive)",
        "dir": filedir, "fs": qb.fs_type(filedir), "cache": "cold (snapshot's page cache "
        "dropped before each count and mode)", "first_answer": "GET /hello.txt on one "
        "connection held, from the request (service: the POST; independent: the first "
        "restore's start)", "timeout_s": args.timeout,
        "order": "alternating: run 1 count 1 service first, then independent first, ...",
        "command": " ".join(shlex.quote(a) for a in sys.argv)},
        "save": None, "results": [], "errors": []}
    code = 0
    raw = []
    t_start = now()
    try:
        log(f"work dir {workdir}, files in {filedir} ({result['params']['fs']}), "
            f"template memory in {memdir}")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", image, "64M"], check=True,
                       timeout=60)
        src = source_guest(args, workdir, "source", image)
        reaper.procs.append(src.boot().proc)
        log(f"boot: {args.mem_mib} MiB, {args.smp} vCPUs, verifier {args.verifier_mib} MiB, "
            f"a 64 MiB qcow2 disk")
        result["machine"] = qb.source_ready(src, args.halite_qemu)
        src.rewrites(False)
        src_digest, _, ok = src.digest()
        if not ok:
            raise BenchError("the source guest's digest differs before the save")
        log(f"  rewrites frozen, digest {src_digest}")
        result["params"]["source_digest"] = src_digest
        sv = qb.save_halite(args, src, snap)
        sv.pop("report", None)
        result["save"] = sv
        q = src.qmp()
        try:
            q.cmd("quit")
        except (EOFError, OSError):
            pass  # QEMU may close the socket before it answers
        q.close()
        src.proc.wait(timeout=30)
        for run in range(1, args.runs + 1):
            for k, n in enumerate(args.ns):
                order = MODES if (k + run) % 2 == 1 else list(reversed(MODES))
                for mode in order:
                    log(f"run {run}/{args.runs}: {mode}, {n} clone{'s' if n > 1 else ''}")
                    if mode == "service":
                        r = run_service(args, reaper, n, snap, src_digest)
                    else:
                        r = run_independent(args, reaper, n, snap, image, src_digest)
                    r["run"] = run
                    raw.append(r)
                    if r["error"]:
                        log(f"  FAILED: {r['error']}")
                        result["errors"].append(f"{mode} x{n} run {run}: {r['error']}")
                        code = 1
                    else:
                        log(f"  first answers {r['first_answer_s']} s (p50 "
                            f"{r['first_answer_p50_s']}, p95 {r['first_answer_p95_s']}), all "
                            f"in {r['all_in_s']} s, {mib(r['bytes_read'])} read, PSS "
                            f"{mib(r['pss_bytes'])}, digests ok")
    except (KeyboardInterrupt, BenchError, hg.GuestError, subprocess.SubprocessError,
            OSError) as e:
        code = qb.record_failure(result, e)
    finally:
        reaper.kill_all()
        if not args.keep:
            qb.remove_dirs(workdir, filedir, memdir)
        else:
            log(f"kept {workdir}, {filedir} and {memdir}")
    result["results"] = [aggregate(n, m, [r for r in raw if r["clones"] == n and r["mode"] == m])
                         for n in args.ns for m in MODES
                         if any(r["clones"] == n and r["mode"] == m for r in raw)]
    qb.emit(result, args, t_start, table)
    return code


if __name__ == "__main__":
    sys.exit(main())
