#!/usr/bin/env python3
"""Issue 6's QEMU benchmark: halite-qemu's lazy restore of a real guest against
QEMU's own eager restore of the same guest, in the same run.

    bench/qemu.py [--runs N] [--quick] [--json] [--cache cold,warm] [--dir DIR] ...   (--help)

One run of this script:
1. boots the test guest (scripts/make-guest.sh built it: Debian's kernel, the
   memory verifier, busybox httpd; TCG) with a verifier region big enough for
   memory to matter, waits until it is ready, and freezes the verifier's
   rewrites so both snapshots hold the same memory (--rewrites leaves them on);
2. saves it with `halite-qemu save` (lazy, the guest keeps running);
3. saves it QEMU's way from the same running guest: QMP migrate to
   `exec:cat > FILE` (QEMU's 32 MiB/s migration throttle lifted, see
   --qemu-bandwidth), until query-migrate says completed; the source goes;
4. for each run, each page-cache state (--cache: cold, both files' page
   cache dropped first; warm, kept) and each method (the order alternates
   between runs), starts the restore and measures from just before starting
   the process:
     first_http_s  the answer to GET /hello.txt on one connection opened as
                   soon as the restore starts (connect retried every 2 ms
                   while refused: nothing listens yet) and held: the request
                   is sent once and its answer awaited, as a client that
                   connects to a restoring guest sees it (--first-http poll:
                   polled with short tries instead, --http-try each, as
                   before)
     connected_s   when that connection was accepted
     requests      right after that answer, --requests (1000) GETs of the
                   guest's numbered pages (/p/I.txt, 4-16 KiB each, written
                   into its memory at boot by testing/guest-image/pages.c), I drawn
                   from a Gaussian over 0..1999 (mean 1000, --sigma 300,
                   rounded and clipped; --seed, in the JSON), one after
                   another, each on a new connection (busybox httpd closes
                   every connection after one answer: no keep-alive), every
                   answer's bytes compared with the page's known content;
                   latency = connect to close: mean, p50, p99, max, the
                   mean of each tenth in order, and the CPU the guest's
                   QEMU got meanwhile (--requests-after S: not before S s)
     workload_s    the answer to GET /cgi-bin/digest, asked right after: the
                   verifier re-reads its whole region, so all of it must be in;
                   the answer must say "expected" (else the run failed)
     running_s     when QMP query-status first said "running"
     all_in_s      all guest memory in (eager: = running_s; halite: its
                   resume plus done_s)
   methods: "halite" = `halite-qemu restore --detach FILE -- qemu ARGS`;
            "qemu-eager" = `qemu ARGS -incoming "exec:cat FILE"` (no -S: QEMU
            starts the guest once the stream is loaded).
            "halite-NAME" = halite with `--variant NAME=ARGS`: ARGS added to
            halite-qemu restore (e.g. idle20="--prefetch-idle 20000"), in
            the same runs.
   Each restored QEMU is killed after its measurement.
5. prints one JSON object on stdout with --json (machine, params, save,
   runs, summary: per cache state, medians per method, speedup =
   qemu-eager's median / halite's, and issue 15's goals: halite's first
   answer <= 1/3 of eager's, its request mean and max <= eager's), a short
   table otherwise; progress on stderr. Nothing asserts timings.

With --learn (issue 17: snapshots that learn their guest), the learning loop
instead: one restore of the halite file with `halite-qemu restore --learn
TRACE` (method halite-learn; the client's first answer and requests as
above, then the workload only once the learning window is over, so the trace
holds what the client's work touched), `halite-inspect relayout FILE --trace
TRACE -o RELAYOUT`, then per run, cache state and added read latency
(--learn-latencies, microseconds per read: 0 and 1000) restores of the
original file (halite, halite-lat1000us), of the relayouted one
(halite-relayout, halite-relayout-lat1000us) and of the relayouted one with
--hot-prefix 0 (halite-relayout-nohot...: its layout read by faults, whose
VM access is the layout's), all with --track-access, no eager restore.
Each run also restores the relayouted file paused until every block is in
(--paused --detach), holds a connection, sends QMP cont and times the
answer from cont: the guest's own time, memory aside (learn.all_in_answer_s).
The JSON's "learn" says what was learnt and the relayout's report;
summary.CACHE.learn, per latency, the medians of VM access %, demand reads
(lb_demand), hot LBs read first (lb_hot), first answer, request mean and
max for the three, the floor of the first answer (floor_first_http_s: the
relayouted file's median resume plus that all-in time), and issue 17's
goals: the relayouted layout's VM access (nohot) >= 83%, the relayouted
file's demand reads <= 1/3 of the original's, and at 1 ms per read its
first answer <= 1/2 of the original's.

Exit status: 0 every run answered with the expected digest, 1 a run or a save
failed (a wrong digest included), 2 usage, 77 missing prerequisites (QEMU, the
guest image, root, or halite-qemu not built; HALITE_REQUIRE_QEMU=1 makes
those 1).

Every QEMU this script starts is killed on the way out, error and Ctrl-C
included (its temporary directory names them all).
"""
import argparse
import http.client
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import halite_guest as hg  # noqa: E402

# What bench/qemu.py keeps of halite-qemu restore's report, per run.
HALITE_KEYS = ["qmp_ready_ms", "engine_ready_ms", "devices_loaded_ms", "resumed_ms",
               "ready_to_resume_ms", "done_s", "faults", "faults_vcpu", "faults_zero",
               "faults_cached", "fault_p50_us", "fault_p99_us", "lb_total", "lb_demand",
               "lb_prefetch", "bytes_read", "mb_total", "mb_fault", "mb_pool", "mb_prefetch",
               "mb_zero", "vm_access_pct", "lb_hot", "store"]
DIGEST_RX = re.compile(r"seq \d+ pass \d+ digest ([0-9a-f]+) uptime ([0-9.]+) (expected|differs)$")


class BenchError(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def record_failure(result, e):
    """What ended a benchmark's run (an error, or ^C) in result["errors"], and said;
    returns 1, the exit code."""
    if isinstance(e, KeyboardInterrupt):
        result["errors"].append(f"interrupted ({e})")
    else:
        log(f"FAILED: {e}")
        result["errors"].append(str(e))
    return 1


def remove_dirs(*dirs):
    for d in dirs:
        subprocess.run(["rm", "-rf", "--", d])


def now():
    return time.monotonic()


def rnd(x, n=3):
    return None if x is None else round(x, n)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --- processes: everything started here is killed on the way out ------------

class Reaper:
    """Every process started here, and the directories that name all of them
    (the QEMUs' command lines hold the work directory's console and socket
    paths, the cats of the migrations the snapshot directory)."""

    def __init__(self, workdir, *more):
        self.workdir = workdir
        self.markers = [d.encode() for d in (workdir,) + more]
        self.procs = []
        self.pids = set()

    def popen(self, *a, **kw):
        p = subprocess.Popen(*a, **kw)
        self.procs.append(p)
        return p

    def ours(self):
        """Live processes whose command line names one of our directories: QEMUs
        that halite-qemu restore started detached, the migrations' cats."""
        me = os.getpid()
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == me:
                continue
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if any(m in cmd for m in self.markers):
                found.append(int(d))
        return found

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for pid in set(self.pids) | set(self.ours()):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = now() + 10
        while self.ours() and now() < deadline:
            time.sleep(0.05)


def wait_gone(pid, timeout=10):
    deadline = now() + timeout
    while now() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.02)
    return False


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_gone(pid)


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().split(")")[-1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


# --- files -------------------------------------------------------------------

def drop_cache(path):
    """Write back and drop @path's page cache, so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_bytes(path):
    """Bytes of @path in the page cache (util-linux fincore), or None."""
    try:
        p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           timeout=10)
        return int(p.stdout.split()[0]) if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def fs_type(path):
    best, kind = "", None
    path = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


# --- the machine ---------------------------------------------------------------

def source_ready(g, halite_qemu):
    """Wait until booted guest @g is ready (logged), then describe the machine:
    machine_info() with the QEMU version @g runs and the load average now."""
    t = now()
    g.wait_ready(timeout=180)
    log(f"  ready in {now() - t:.1f} s")
    q = g.qmp()
    qemu_version = "{major}.{minor}.{micro}".format(**q.version)
    q.close()
    m = machine_info(halite_qemu, qemu_version)
    m["loadavg_at_start"] = os.getloadavg()[0]
    return m


def machine_info(halite_qemu, qemu_version):
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        hv = subprocess.run([halite_qemu, "--version"], stdout=subprocess.PIPE, text=True,
                            timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        hv = None
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "memory_bytes": mem,
            "kernel": platform.release(), "qemu_version": qemu_version,
            "accel": "tcg", "halite_qemu": hv, "python": platform.python_version()}


# --- HTTP and QMP while a restore runs ----------------------------------------

def http_get(port, path, timeout):
    """(status, body) of GET @path, or raises OSError/TimeoutError/URLError."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class StatusWatch(threading.Thread):
    """Polls the restored QEMU's own QMP socket (the guest's -qmp) until
    query-status says running; records when, from @t0. A QEMU busy loading
    may answer late: the answer's time is what is recorded."""

    def __init__(self, guest, t0, deadline, period=0.02):
        super().__init__(daemon=True)
        self.guest, self.t0, self.deadline, self.period = guest, t0, deadline, period
        self.running_s = None
        self.stop = False
        self.error = None

    def run(self):
        q = None
        try:
            while not self.stop and now() < self.deadline:
                if q is None:
                    if not os.path.exists(self.guest.qmp_path):
                        time.sleep(self.period)
                        continue
                    try:
                        q = hg.QMP(self.guest.qmp_path, timeout=60)
                    except (hg.GuestError, OSError, EOFError, ValueError):
                        q = None
                        time.sleep(self.period)
                        continue
                st = q.cmd("query-status")["status"]
                if st == "running":
                    self.running_s = now() - self.t0
                    return
                time.sleep(self.period)
        except (hg.GuestError, OSError, EOFError, ValueError) as e:
            self.error = str(e)
        finally:
            if q is not None:
                q.close()


def held_http(guest, t0, deadline, alive):
    """GET /hello.txt on one connection held from the start (halite_guest.held_get).
    Returns (seconds from t0 to the answer, seconds to the connection's accept)."""
    try:
        t_conn, t_ans, status, body = hg.held_get(guest.port, "/hello.txt", deadline, alive)
    except hg.GuestError as e:
        raise BenchError(str(e))
    if status != 200:
        raise BenchError(f"GET /hello.txt on the held connection: HTTP {status}")
    return t_ans - t0, t_conn - t0


def qemu_of(guest):
    """The pid of the QEMU running @guest (its command line names the guest's
    console file, which is unique), or None."""
    mark = guest.console.encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"qemu-system-x86_64") and any(mark in a for a in cmd):
                return int(d)
    return None


def cpu_seconds(pid):
    """User + system CPU seconds of process @pid so far, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read().split(")")[-1].split()
        return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def page_requests(args, guest, t0, deadline):
    """The client's requests after its first answer (hg.page_requests: one
    new connection each, every body checked). Returns the latency summary,
    when they started and ended (from t0) and the slowest five."""
    pages = hg.gaussian_pages(args.requests, args.seed, sigma=args.sigma)
    if args.requests_after:  # not before then: both methods' requests as long after the start
        time.sleep(max(0.0, t0 + args.requests_after - now()))
    qpid = qemu_of(guest)
    cpu0 = cpu_seconds(qpid) if qpid else None
    start = now()
    try:
        got = hg.page_requests(guest.port, pages, deadline)
    except hg.GuestError as e:
        raise BenchError(str(e))
    wall = now() - start
    cpu1 = cpu_seconds(qpid) if qpid else None
    lat = got["latencies_s"]
    out = hg.latency_summary(lat)
    out.update(start_s=rnd(start - t0), end_s=rnd(now() - t0), bytes=got["bytes"],
               distinct_pages=len(set(pages)))
    # How much CPU the host gave the guest's QEMU meanwhile (cores' worth): a
    # QEMU that gets less serves more slowly, whatever restored it.
    out["qemu_cpu_s"] = rnd(cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    out["qemu_cpu_share"] = rnd((cpu1 - cpu0) / wall) if out["qemu_cpu_s"] is not None else None
    # The mean of each tenth of the requests, in order: whether the early ones
    # (while memory still comes in) or all of them are slower.
    tenth = max(1, len(lat) // 10)
    out["mean_by_tenth_s"] = [rnd(statistics.fmean(lat[k:k + tenth]), 6)
                              for k in range(0, len(lat), tenth)]
    # Where the slow ones were: when each started (from t0) and which page.
    at, slow = start, []
    for k, x in enumerate(lat):
        slow.append((x, k, pages[k], at - t0))
        at += x
    out["slowest"] = [{"request": k, "page": i, "start_s": rnd(t, 4), "latency_s": rnd(x, 6)}
                      for x, k, i, t in sorted(slow, reverse=True)[:5]]
    return out


def first_http(guest, t0, deadline, per_try, watch, alive):
    """Poll GET /hello.txt until answered. Tries are @per_try long; once QMP says
    the guest runs, a try that times out lengthens the next (up to 2 s), so a
    guest slow to answer is still heard. Returns (seconds from t0, tries)."""
    tries = timeouts = 0
    last = None
    while now() < deadline:
        tries += 1
        t = per_try if watch.running_s is None else min(2.0, per_try * 1.25 ** timeouts)
        try:
            status, body = http_get(guest.port, "/hello.txt", t)
            if status == 200:
                return now() - t0, tries
            last = f"HTTP {status}"
        except (TimeoutError, OSError, urllib.error.URLError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            last = str(reason)
            if isinstance(reason, TimeoutError) or "timed out" in last:
                if watch.running_s is not None:
                    timeouts += 1
            else:
                time.sleep(0.01)  # refused: QEMU is not listening yet
        why = alive()
        if why:
            raise BenchError(f"{why} before the first HTTP answer")
    raise BenchError(f"no HTTP answer to /hello.txt within the deadline ({last})")


def workload(guest, t0, deadline, alive):
    """GET /cgi-bin/digest (one request: it makes the verifier re-read its whole
    region). Returns (seconds from t0, digest, expected, body)."""
    while True:
        left = deadline - now()
        if left <= 0:
            raise BenchError("/cgi-bin/digest: no answer within the deadline")
        try:
            status, body = http_get(guest.port, "/cgi-bin/digest", left)
            t = now() - t0
            break
        except (TimeoutError, OSError, urllib.error.URLError, http.client.HTTPException) as e:
            why = alive()
            if why:
                raise BenchError(f"{why} during /cgi-bin/digest ({e})")
            time.sleep(0.05)
    body = body.strip()
    m = DIGEST_RX.match(body)
    if status != 200 or not m:
        raise BenchError(f"/cgi-bin/digest: HTTP {status}, {body!r}")
    return t, m.group(1), m.group(3) == "expected", body


# --- saves ---------------------------------------------------------------------

def run_json(cmd, what, timeout, **kw):
    """Run a halite tool with --json; its report, or BenchError naming @what
    with its exit status and the end of its output."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, **kw)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = None
    if p.returncode != 0 or not rep or not rep.get("ok"):
        raise BenchError(f"{what}: exit {p.returncode}\nstdout: {p.stdout[-2000:]}\n"
                         f"stderr: {p.stderr[-3000:]}")
    return rep


def save_halite(args, src, path):
    log(f"save (halite-qemu save) -> {path}")
    t = now()
    rep = run_json([args.halite_qemu, "save", "--qmp", src.qmp_path, "--json", "-q", path],
                   "halite-qemu save", args.timeout)
    wall = now() - t
    out = {"wall_s": rnd(wall), "pause_ms": rep.get("pause_ms"), "save_s": rep.get("save_s"),
           "file_bytes": os.path.getsize(path), "memory_bytes": rep.get("memory_bytes"),
           "report": rep}
    log(f"  pause {rep.get('pause_ms')} ms, saved in {rep.get('save_s')} s, "
        f"{out['file_bytes'] >> 20} MiB")
    return out


def save_qemu(args, src, path):
    """QEMU's own snapshot: a live migration into a file, the guest running."""
    log(f"save (QMP migrate exec:cat) -> {path}")
    q = src.qmp()
    try:
        if args.qemu_bandwidth:
            q.cmd("migrate-set-parameters", **{"max-bandwidth": args.qemu_bandwidth})
        params = q.cmd("query-migrate-parameters")
        t = now()
        q.cmd("migrate", uri=f"exec:cat > {shlex.quote(path)}")
        deadline = t + args.timeout
        while True:
            info = q.cmd("query-migrate")
            st = info.get("status")
            if st == "completed":
                break
            if st in ("failed", "cancelled"):
                raise BenchError(f"QEMU migrate to {path}: {st}: {info.get('error-desc')}")
            if now() > deadline:
                raise BenchError(f"QEMU migrate to {path}: still {st} after {args.timeout} s")
            time.sleep(0.01)
        done = now()
        # "completed" means QEMU wrote its last byte into the pipe; cat may still
        # be writing it out.
        cats = children(src.pid)
        end = now() + 30
        while cats and now() < end:
            cats = [c for c in cats if not wait_gone(c, 0.05)]
        wall = now() - t
        status = q.cmd("query-status")["status"]
    finally:
        q.close()
    drop_cache(path)  # fsync too: the file is complete on disk
    out = {"wall_s": rnd(wall), "completed_s": rnd(done - t),
           "total_ms": info.get("total-time"), "downtime_ms": info.get("downtime"),
           "setup_ms": info.get("setup-time"), "file_bytes": os.path.getsize(path),
           "source_status_after": status, "max_bandwidth": params.get("max-bandwidth"),
           "downtime_limit_ms": params.get("downtime-limit"), "ram": info.get("ram")}
    log(f"  total {info.get('total-time')} ms, downtime {info.get('downtime')} ms, "
        f"{out['file_bytes'] >> 20} MiB")
    return out


# --- restores -----------------------------------------------------------------

def restore_run(args, reaper, method, run, cache, files, src_digest):
    g = hg.Guest(reaper.workdir, f"{method}-{cache}-{run}", image=args.image, mem_mib=args.mem_mib,
                 smp=args.smp, verifier_mib=args.verifier_mib)
    res = {"method": method, "run": run, "cache": cache, "first_http_s": None,
           "first_http": args.first_http, "connected_s": None, "http_tries": None,
           "running_s": None, "workload_s": None, "all_in_s": None, "digest_ok": False,
           "digest": None, "digest_same_as_source": None, "console_ok": None,
           "cached_bytes_before": None, "requests": None, "error": None}
    for f in files.values():
        if not os.path.exists(f):  # --learn: the relayouted file, before the relayout
            continue
        if cache == "cold":
            drop_cache(f)
        else:
            with open(f, "rb") as fh:  # warm: every byte in the page cache
                while fh.read(1 << 24):
                    pass
    path = files["qemu-eager" if method == "qemu-eager" else
                 args.method_file.get(method, "halite")]
    res["cached_bytes_before"] = cached_bytes(path)
    trace = None
    out = open(os.path.join(reaper.workdir, f"{g.name}.out"), "w+")
    err = open(os.path.join(reaper.workdir, f"{g.name}.err"), "w+")
    proc = None
    qemu_pid = None
    watch = None
    try:
        if method != "qemu-eager":
            cmd = [args.halite_qemu, "restore", "--detach", "--json", "-q"]
            if args.track_access and method != "halite-learn":
                cmd.append("--track-access")
            if args.trace and method != "halite-learn":
                trace = os.path.join(reaper.workdir, f"{g.name}.trace")
                cmd += ["--trace", trace]
            cmd += args.variants.get(method, [])
            cmd += [path, "--", "qemu-system-x86_64"] + g.args
        else:
            cmd = ["qemu-system-x86_64"] + g.args + [
                "-incoming", f"exec:cat {shlex.quote(path)}"]
        t0 = now()
        # Each QEMU in a session of its own, as halite-qemu restore --detach
        # starts its QEMU: with the kernel's autogroup scheduling a session is
        # a scheduling group, and on a loaded host a QEMU that shared ours
        # was scheduled differently from the detached one (docs/benchmarks.md).
        proc = reaper.popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            start_new_session=True)
        if method == "qemu-eager":
            qemu_pid = proc.pid
        deadline = t0 + args.timeout
        watch = StatusWatch(g, t0, deadline)
        watch.start()

        def alive():
            rc = proc.poll()
            if method == "qemu-eager" and rc is not None:
                return f"QEMU exited ({rc})"
            if method != "qemu-eager" and rc not in (None, 0):
                return f"halite-qemu restore exited {rc}"
            return None

        if args.first_http == "held":
            res["first_http_s"], res["connected_s"] = held_http(g, t0, deadline, alive)
            res["http_tries"] = 1
        else:
            res["first_http_s"], res["http_tries"] = first_http(g, t0, deadline,
                                                                args.http_try, watch, alive)
        if args.requests:
            res["requests"] = page_requests(args, g, t0, deadline)
        if method == "halite-learn":
            # The workload re-reads the verifier's whole region: not what the
            # client's work touches, so not learnt (the window from the
            # engine's ready, which comes within a second or two of t0).
            res["requests_within_window"] = (
                res["requests"] is None or res["requests"]["end_s"] < args.learn_window / 1e3)
            time.sleep(max(0.0, t0 + args.learn_window / 1e3 + 2.0 - now()))
        wl, digest, expected, body = workload(g, t0, deadline, alive)
        res["workload_s"], res["digest"], res["digest_ok"] = wl, digest, expected
        if src_digest is not None:
            res["digest_same_as_source"] = digest == src_digest
        watch.join(max(0.0, min(5.0, deadline - now())))
        res["running_s"] = watch.running_s
        if method != "qemu-eager":
            try:
                proc.wait(timeout=max(1.0, deadline - now()))
            except subprocess.TimeoutExpired:
                raise BenchError("halite-qemu restore did not finish bringing memory in")
            out.seek(0)
            text = out.read()
            try:
                rep = json.loads(text)
            except ValueError:
                rep = None
            if proc.returncode != 0 or not rep or not rep.get("ok"):
                err.seek(0)
                raise BenchError(f"halite-qemu restore: exit {proc.returncode}\nstdout: "
                                 f"{text[-2000:]}\nstderr: {err.read()[-3000:]}")
            qemu_pid = rep["qemu"]["pid"]
            reaper.pids.add(qemu_pid)
            res["halite"] = {k: rep.get(k) for k in HALITE_KEYS}
            if rep.get("resumed_ms") is not None and rep.get("done_s") is not None:
                res["all_in_s"] = rep["resumed_ms"] / 1e3 + rep["done_s"]
            if trace and method != "halite-learn":
                res["trace"] = trace_summary(args, path, trace, rep, res)
        else:
            res["all_in_s"] = res["running_s"]
        try:
            g.check_console()
            res["console_ok"] = True
        except hg.GuestError as e:
            res["console_ok"] = False
            raise BenchError(str(e))
        if not expected:
            raise BenchError(f"the restored guest's digest differs from what its verifier "
                             f"expects: {body!r}")
    except (BenchError, hg.GuestError, OSError) as e:
        res["error"] = str(e)
        err.seek(0)
        tail = err.read()[-1500:]
        log(f"  {method} run {run}: FAILED: {e}" + (f"\n  stderr: {tail}" if tail else "") +
            f"\n  console:\n{g.console_tail(10)}")
    finally:
        if watch is not None:
            watch.stop = True
        if proc is not None and proc.poll() is None:
            proc.kill()  # eager: its QEMU; halite: its QEMU, if still there, goes below
            proc.wait()
        if qemu_pid and qemu_pid != proc.pid:
            kill_pid(qemu_pid)
        for pid in reaper.ours():  # a halite QEMU whose pid we never learned
            kill_pid(pid)
        out.close()
        err.close()
    for k in ("first_http_s", "connected_s", "running_s", "workload_s", "all_in_s"):
        res[k] = rnd(res[k])
    if res["error"] is None:
        extra = ""
        if method != "qemu-eager":
            h = res["halite"]
            extra = (f", resumed {h['ready_to_resume_ms']:.0f} ms after QEMU was ready, all in "
                     f"{res['all_in_s']} s, {h['faults']} faults, {h['lb_demand']} demand / "
                     f"{h['lb_prefetch']} prefetched LBs")
        how = (f"held, connected at {res['connected_s']} s" if args.first_http == "held" else
               f"{res['http_tries']} tries")
        rq = res["requests"]
        if rq:
            how += (f"; {rq['n']} requests from {rq['start_s']} s: mean "
                    f"{rq['mean_s'] * 1e3:.1f} ms, p99 {rq['p99_s'] * 1e3:.1f} ms, max "
                    f"{rq['max_s'] * 1e3:.1f} ms")
        log(f"  {method} {cache} run {run}: first HTTP {res['first_http_s']} s ({how}), "
            f"running {res['running_s']} s, workload {res['workload_s']} s, digest "
            f"{'expected' if res['digest_ok'] else 'DIFFERS'}{extra}")
    return res


def trace_summary(args, path, trace, rep, res):
    """When the restore read what, against the client's timeline (--trace):
    halite-inspect restore --blocks over the engine's trace. Each LB's time
    is from the engine's ready, which the report places engine_ready_ms
    after the command started (t0)."""
    p = subprocess.run([args.halite_inspect, "restore", "--blocks", "--json", path, trace],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    if p.returncode != 0:
        raise BenchError(f"halite-inspect restore: exit {p.returncode}: {p.stderr.strip()}")
    lbs = json.loads(p.stdout)["lbs"]
    ready = rep["engine_ready_ms"] / 1e3
    first = res["first_http_s"]
    rq = res["requests"] or {}
    out = {"demand_before_first_answer": 0, "prefetch_before_first_answer": 0,
           "last_demand_before_first_answer_s": None, "demand_during_requests": 0,
           "prefetch_during_requests": 0, "last_read_s": None, "streams_demanded": {}}
    for b in lbs:
        if b["fate"] not in ("demand", "prefetch"):
            continue
        t = ready + b["t_ns"] / 1e9
        out["last_read_s"] = max(out["last_read_s"] or 0, t)
        if t <= first:
            out[b["fate"] + "_before_first_answer"] += 1
            if b["fate"] == "demand":
                sd = out["streams_demanded"]
                sd[b["stream"]] = sd.get(b["stream"], 0) + 1
                out["last_demand_before_first_answer_s"] = max(
                    out["last_demand_before_first_answer_s"] or 0, t)
        elif rq and t <= rq["end_s"]:
            out[b["fate"] + "_during_requests"] += 1
    for k in ("last_demand_before_first_answer_s", "last_read_s"):
        out[k] = rnd(out[k], 4)
    return out


def learn_loop(args, reaper, files, src_digest):
    """Issue 17's first two steps: a learning restore of the halite file (the
    client's work as in every run, cold cache), then halite-inspect relayout
    of the file from its trace."""
    trace = os.path.join(reaper.workdir, "learn.trace")
    args.variants["halite-learn"] = ["--learn", trace, "--learn-window", str(args.learn_window)]
    log("learn: halite-qemu restore --learn")
    res = restore_run(args, reaper, "halite-learn", 0, "cold", files, src_digest)
    out = {"restore": res, "trace_lines": None, "touches": None, "relayout": None,
           "all_in_answer_s": []}
    if res["error"]:
        return out
    with open(trace) as f:
        lines = f.read().splitlines()
    out["trace_lines"] = len(lines)
    out["touches"] = sum(1 for x in lines if x.startswith("touch "))
    cmd = [args.halite_inspect, "relayout", files["halite"], "--trace", trace,
           "-o", files["relayout"], "--json"]
    if args.hot_max:
        cmd += ["--hot-max", args.hot_max]
    log("relayout: " + " ".join(shlex.quote(x) for x in cmd))
    rep = run_json(cmd, "halite-inspect relayout", args.timeout)
    out["relayout"] = rep
    log(f"  {out['touches']} first touches learnt; hot prefix {rep.get('hot_lbs')} LBs, "
        f"{rep.get('hot_blocks')} blocks, {rep.get('hot_bytes')} bytes")
    drop_cache(files["relayout"])
    return out


def all_in_answer(args, reaper, files, run):
    """What the guest itself takes to answer, memory aside: the relayouted file
    restored paused (halite-qemu restore --paused --detach: it exits once
    every block is in), a connection held open, then QMP cont; seconds from
    cont to the answer on it (the floor of any restore's first answer is
    this plus the restore's time to resume)."""
    g = hg.Guest(reaper.workdir, f"all-in-{run}", image=args.image, mem_mib=args.mem_mib,
                 smp=args.smp, verifier_mib=args.verifier_mib)
    cmd = [args.halite_qemu, "restore", "--paused", "--detach", "--json", "-q",
           files["relayout"], "--", "qemu-system-x86_64"] + g.args
    rep = run_json(cmd, "halite-qemu restore --paused", args.timeout, start_new_session=True)
    pid = rep["qemu"]["pid"]
    reaper.pids.add(pid)
    got = {}
    deadline = now() + args.timeout

    def get():
        try:
            got["t"] = hg.held_get(g.port, "/hello.txt", deadline)
        except hg.GuestError as e:
            got["error"] = str(e)

    th = threading.Thread(target=get)
    try:
        th.start()
        time.sleep(0.3)  # connected and waiting: slirp accepts it while the guest is paused
        q = g.qmp()
        t_cont = now()
        q.cmd("cont")
        th.join(max(1.0, deadline - now()))
        q.close()
    finally:
        kill_pid(pid)
    if "t" not in got:
        raise BenchError(f"the all-in guest's answer: {got.get('error', 'none')}")
    s = rnd(got["t"][1] - t_cont)
    log(f"  all in, paused: first answer {s} s after cont")
    return s


def summarize(runs, cache, methods):
    s = {}
    for m in methods:
        ok = [r for r in runs if r["method"] == m and r["cache"] == cache and r["error"] is None]
        s[m] = {"runs_ok": len(ok),
                "first_http_s_median": rnd(median([r["first_http_s"] for r in ok])),
                "connected_s_median": rnd(median([r["connected_s"] for r in ok])),
                "workload_s_median": rnd(median([r["workload_s"] for r in ok])),
                "running_s_median": rnd(median([r["running_s"] for r in ok])),
                "all_in_s_median": rnd(median([r["all_in_s"] for r in ok]))}
        for k in ("first_http_s", "workload_s"):
            xs = [r[k] for r in ok if r[k] is not None]
            s[m][k + "_min"] = rnd(min(xs)) if xs else None
            s[m][k + "_max"] = rnd(max(xs)) if xs else None
        rq = [r["requests"] for r in ok if r["requests"]]
        for k in ("mean_s", "p50_s", "p99_s", "max_s"):
            s[m]["requests_" + k.replace("_s", "") + "_s_median"] = (
                rnd(median([q[k] for q in rq]), 6) if rq else None)

    def ratio(k):
        if "qemu-eager" not in s or "halite" not in s:
            return None
        a, b = s["qemu-eager"][k], s["halite"][k]
        return rnd(a / b, 2) if a is not None and b else None

    s["speedup_first_http"] = ratio("first_http_s_median")
    s["speedup_workload"] = ratio("workload_s_median")
    s["speedup_requests_mean"] = ratio("requests_mean_s_median")
    s["speedup_requests_max"] = ratio("requests_max_s_median")
    s["speedup_note"] = "qemu-eager's median / halite's: above 1, halite is faster"

    def goal(k, factor):
        if "qemu-eager" not in s or "halite" not in s:
            return None
        a, b = s["halite"][k], s["qemu-eager"][k]
        return None if a is None or b is None else a <= b * factor

    # Issue 15: the first answer within a third of the eager restore's; the
    # requests' mean and max latency no worse than eager's.
    s["goals"] = {"first_http_third_of_eager": goal("first_http_s_median", 1 / 3),
                  "requests_mean_le_eager": goal("requests_mean_s_median", 1),
                  "requests_max_le_eager": goal("requests_max_s_median", 1)}
    if "qemu-eager" not in s:
        s["goals"] = {}
    return s


LEARN_KINDS = ("original", "relayout", "relayout_nohot")


def learn_method(latency_us, kind):
    """The method restoring the original file, the relayouted one, or the
    relayouted one without reading its hot prefix first (--hot-prefix 0: its
    layout's own VM access), with @latency_us added to every read."""
    name = {"original": "halite", "relayout": "halite-relayout",
            "relayout_nohot": "halite-relayout-nohot"}[kind]
    return name + (f"-lat{latency_us}us" if latency_us else "")


def summarize_learn(runs, cache, latencies, all_in):
    """Issue 17: per added read latency, the original file against the one
    relayouted from the learning restore (medians over the runs). @all_in:
    all_in_answer()'s times; with the relayouted file's median resume, the
    floor of its first answer (floor_first_http_s): the guest's own time
    with every block in before it runs."""
    out = {}
    for lat in latencies:
        row = {}
        for kind in LEARN_KINDS:
            m = learn_method(lat, kind)
            ok = [r for r in runs if r["method"] == m and r["cache"] == cache and
                  r["error"] is None]
            h = [r["halite"] for r in ok]
            rq = [r["requests"] for r in ok if r["requests"]]
            row[kind] = {
                "method": m, "runs_ok": len(ok),
                "vm_access_pct_median": rnd(median([x["vm_access_pct"] for x in h]), 2),
                "lb_demand_median": median([x["lb_demand"] for x in h]),
                "lb_prefetch_median": median([x["lb_prefetch"] for x in h]),
                "lb_hot_median": median([x["lb_hot"] for x in h]),
                "faults_median": median([x["faults"] for x in h]),
                "first_http_s_median": rnd(median([r["first_http_s"] for r in ok])),
                "requests_mean_s_median": rnd(median([q["mean_s"] for q in rq]), 6),
                "requests_max_s_median": rnd(median([q["max_s"] for q in rq]), 6),
                "all_in_s_median": rnd(median([r["all_in_s"] for r in ok])),
                "resumed_s_median": rnd(median([x["resumed_ms"] / 1e3 for x in h
                                                if x.get("resumed_ms") is not None]))}
        a, b, c = row["original"], row["relayout"], row["relayout_nohot"]
        row["all_in_answer_s_median"] = rnd(median(all_in))
        row["floor_first_http_s"] = (
            None if b["resumed_s_median"] is None or not all_in else
            rnd(b["resumed_s_median"] + median(all_in)))

        def le(x, y, factor):
            return None if x is None or y is None else x <= y * factor

        # VM access is the layout's measure (the paper's: of the blocks of each
        # LB read for a fault, how many the guest used), so it is taken where
        # faults read the relayouted layout: without its hot prefix read first
        # (with it, the few LBs left to faults are those the learning restore
        # did not see).
        row["goals"] = {
            "vm_access_ge_83": (None if c["vm_access_pct_median"] is None else
                                c["vm_access_pct_median"] >= 83),
            "demand_le_third": le(b["lb_demand_median"], a["lb_demand_median"], 1 / 3)}
        # The first-answer goal is at 1 ms per read; said at every latency.
        row["goals"]["first_http_le_half"] = le(b["first_http_s_median"],
                                                a["first_http_s_median"], 1 / 2)
        out[f"latency_{lat}us"] = row
    return out


# --- main -------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [OPTIONS]")
    ap.add_argument("--runs", type=int, default=3, help="restores per method (3)")
    ap.add_argument("--json", action="store_true",
                    help="print the whole result as one JSON object (else a short table)")
    ap.add_argument("--requests", type=int, default=1000,
                    help="page requests after the first answer, each run (1000; 0: none)")
    ap.add_argument("--sigma", type=float, default=300,
                    help="the Gaussian's sigma over the 2000 page numbers (300; mean 1000)")
    ap.add_argument("--seed", type=int, default=15, help="the page numbers' random seed (15)")
    ap.add_argument("--requests-after", type=float, default=0, metavar="S",
                    help="start the requests no sooner than S seconds after the restore "
                    "started (0: right after the first answer, as a client would)")
    ap.add_argument("--quick", action="store_true", help="one restore per method (--runs 1)")
    ap.add_argument("--mem-mib", type=int, default=512, help="guest RAM in MiB (512)")
    ap.add_argument("--smp", type=int, default=2, help="vCPUs (2)")
    ap.add_argument("--verifier-mib", type=int, default=256,
                    help="the verifier's region in MiB: what the workload re-reads (256)")
    ap.add_argument("--cache", default="cold,warm",
                    help="page-cache states to restore in, each run: cold (the files' page "
                    "cache dropped before every restore), warm (read into it first), or "
                    "both (cold,warm: the default)")
    ap.add_argument("--warm", action="store_true", help="the same as --cache warm")
    ap.add_argument("--first-http", choices=("held", "poll"), default="held",
                    help="the first HTTP answer on one connection held from the start "
                    "(default), or polled with short tries (--http-try), as before")
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the snapshot files go, in a directory made there "
                    "(/var/tmp; a tmpfs makes every run warm)")
    ap.add_argument("--http-try", type=float, default=0.2,
                    help="seconds per GET /hello.txt try while polling (0.2)")
    ap.add_argument("--rewrites", action="store_true",
                    help="leave the verifier's rewrites on across the saves (the snapshots "
                    "then hold different memory; digest_same_as_source is null)")
    ap.add_argument("--qemu-bandwidth", type=int, default=64 << 30,
                    help="QEMU's migrate max-bandwidth for its save, bytes/s (64 GiB/s: "
                    "QEMU's own default, 32 MiB/s, is meant for a network; 0 keeps it)")
    ap.add_argument("--track-access", action="store_true",
                    help="restore with halite-qemu --track-access (VM access %%; costs a minor "
                    "fault per staged block)")
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds allowed for each save and each restore (300)")
    ap.add_argument("--halite-qemu", metavar="PATH",
                    default=os.environ.get("HALITE_QEMU_BIN") or os.path.join(
                        hg.ROOT, "build", "tools", "halite-qemu", "halite-qemu"),
                    help="the halite-qemu binary ($HALITE_QEMU_BIN, else "
                    "build/tools/halite-qemu/halite-qemu)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also restore with `halite-qemu restore ARGS` as method halite-NAME, in "
                    "the same runs (e.g. idle20=\"--prefetch-idle 20000\"); repeatable; not "
                    "--no-prefetch, whose restore never ends")
    ap.add_argument("--trace", action="store_true",
                    help="halite restores write a trace (kept in the work directory with "
                    "--keep); each run's JSON then says what was read before the first answer "
                    "and during the requests (halite-inspect restore)")
    ap.add_argument("--learn", action="store_true",
                    help="the learning loop (issue 17): a restore with --learn, halite-inspect "
                    "relayout of the file from its trace, then restores of the original and the "
                    "relayouted file at each --learn-latencies (with --track-access; no eager "
                    "restore)")
    ap.add_argument("--learn-window", type=int, default=15000, metavar="MS",
                    help="the learning restore's window, ms from its engine's ready (15000): "
                    "long enough for the first answer and the requests")
    ap.add_argument("--learn-latencies", default="0,1000", metavar="US,...",
                    help="with --learn: the added read latencies, microseconds per read, "
                    "each a restore of both files (0,1000)")
    ap.add_argument("--hot-max", metavar="SIZE",
                    help="with --learn: halite-inspect relayout --hot-max SIZE")
    ap.add_argument("--halite-inspect", metavar="PATH",
                    default=os.environ.get("HALITE_INSPECT_BIN") or os.path.join(
                        hg.ROOT, "build", "tools", "halite-inspect", "halite-inspect"),
                    help="the halite-inspect binary, for --trace ($HALITE_INSPECT_BIN, else "
                    "build/tools/halite-inspect/halite-inspect)")
    ap.add_argument("--image", default=os.path.join(hg.ROOT, "build", "guest-image"),
                    help="the test guest (scripts/make-guest.sh's OUTDIR; build/guest-image)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and files")
    a = ap.parse_args()
    if a.quick:
        a.runs = 1
    if a.warm:
        a.cache = "warm"
    if a.learn and "--cache" not in " ".join(sys.argv) and not a.warm:
        a.cache = "cold"  # the measurement: the relayouted file's reads from disk
    a.caches = [c for c in a.cache.split(",") if c]
    a.variants = {}
    for v in a.variant:
        name, eq, rest = v.partition("=")
        if not eq or not re.fullmatch(r"[a-z0-9_]+", name) or f"halite-{name}" in a.variants:
            ap.error(f"--variant {v!r}: NAME=ARGS, NAME lower-case letters, digits or _, "
                     "each NAME once")
        a.variants[f"halite-{name}"] = shlex.split(rest)
    a.methods = ["halite"] + list(a.variants) + ["qemu-eager"]
    a.method_file = {}
    if a.learn:
        try:
            a.latencies = [int(x) for x in a.learn_latencies.split(",") if x != ""]
        except ValueError:
            a.latencies = []
        if not a.latencies or any(x < 0 or x > 1000000 for x in a.latencies) or \
                len(set(a.latencies)) != len(a.latencies):
            ap.error("--learn-latencies: distinct microseconds 0..1000000, comma-separated")
        if a.learn_window < 1:
            ap.error("--learn-window: at least 1 ms")
        a.track_access = True
        a.methods = []
        for lat in a.latencies:
            for kind in LEARN_KINDS:
                m = learn_method(lat, kind)
                a.methods.append(m)
                a.variants[m] = (["--read-latency", str(lat)] if lat else []) + (
                    ["--hot-prefix", "0"] if kind == "relayout_nohot" else [])
                if kind != "original":
                    a.method_file[m] = "relayout"
        a.methods += [m for m in a.variants if m not in a.methods]
    if not a.caches or any(c not in ("cold", "warm") for c in a.caches):
        ap.error("--cache: cold, warm or cold,warm")
    if (a.runs < 1 or a.verifier_mib < 1 or a.verifier_mib >= a.mem_mib or a.http_try <= 0 or
            a.requests < 0 or a.sigma <= 0):
        ap.error("--runs >= 1, 0 < --verifier-mib < --mem-mib, --http-try > 0, --requests >= 0, "
                 "--sigma > 0")
    return a


def prerequisites(args):
    bins = [args.halite_qemu] + ([args.halite_inspect] if args.trace or args.learn else [])
    return hg.bench_prerequisites(args.image, bins)


def unmet(why):
    """What the run lacks: skipped (77), or a failure when $HALITE_REQUIRE_QEMU=1."""
    need = os.environ.get("HALITE_REQUIRE_QEMU") == "1"
    log(("FAIL: " if need else "SKIP: ") + why)
    return 1 if need else 77


def main():
    args = parse_args()
    why = prerequisites(args)
    if why:
        return unmet(why)
    workdir = tempfile.mkdtemp(prefix="halite-bench-qemu.")
    os.makedirs(args.dir, exist_ok=True)
    filedir = tempfile.mkdtemp(prefix="halite-bench-qemu.", dir=args.dir)
    reaper = Reaper(workdir, filedir)
    files = {"halite": os.path.join(filedir, "guest.hlt"),
             "qemu-eager": os.path.join(filedir, "guest.qemu")}
    if args.learn:  # no eager restore: the relayouted file instead
        files = {"halite": files["halite"],
                 "relayout": os.path.join(filedir, "guest-relayout.hlt")}

    def on_term(sig, frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_term)
    result = {"machine": None, "params": {
        "runs": args.runs, "mem_mib": args.mem_mib, "smp": args.smp,
        "verifier_mib": args.verifier_mib, "caches": args.caches,
        "first_http": args.first_http, "dir": filedir, "fs": fs_type(filedir),
        "http_try_s": args.http_try if args.first_http == "poll" else None,
        "rewrites_frozen": not args.rewrites, "qemu_max_bandwidth": args.qemu_bandwidth or None,
        "track_access": args.track_access, "timeout_s": args.timeout,
        "learn": args.learn, "learn_window_ms": args.learn_window if args.learn else None,
        "learn_latencies_us": args.latencies if args.learn else None,
        "hot_max": args.hot_max if args.learn else None,
        "methods": args.methods,
        "variants": {k: " ".join(v) for k, v in args.variants.items()},
        "requests": args.requests, "pages": hg.PAGES, "pages_mean": hg.PAGES // 2,
        "pages_sigma": args.sigma, "seed": args.seed, "requests_after_s": args.requests_after,
        "connections": "a new one per request (busybox httpd does not keep alive)",
        "order": "alternating: run 1 halite first, run 2 qemu-eager first, ...",
        "command": " ".join(shlex.quote(a) for a in sys.argv)},
        "save": {}, "learn": None, "runs": [], "summary": None, "errors": []}
    code = 0
    t_start = now()
    try:
        log(f"work dir {workdir}, files in {filedir} ({result['params']['fs']})")
        src = hg.Guest(workdir, "source", image=args.image, mem_mib=args.mem_mib, smp=args.smp,
                       verifier_mib=args.verifier_mib)
        reaper.procs.append(src.boot().proc)
        log(f"boot: {args.mem_mib} MiB, {args.smp} vCPUs, verifier {args.verifier_mib} MiB")
        result["machine"] = source_ready(src, args.halite_qemu)
        src_digest = None
        if not args.rewrites:
            src.rewrites(False)
            src_digest, up, ok = src.digest()
            if not ok:
                raise BenchError(f"the source guest's digest differs before the saves")
            log(f"  rewrites frozen, digest {src_digest}")
        result["params"]["source_digest"] = src_digest
        result["save"]["halite"] = save_halite(args, src, files["halite"])
        if not args.learn:
            result["save"]["qemu"] = save_qemu(args, src, files["qemu-eager"])
        src.kill()
        drop_cache(files["halite"])
        if args.learn:
            result["learn"] = learn_loop(args, reaper, files, src_digest)
            if result["learn"]["restore"]["error"]:
                raise BenchError(f"the learning restore: {result['learn']['restore']['error']}")
        for run in range(1, args.runs + 1):
            if args.learn:
                log(f"run {run}/{args.runs}: the relayouted file all in, then cont")
                result["learn"]["all_in_answer_s"].append(all_in_answer(args, reaper, files,
                                                                        run))
            order = args.methods if run % 2 else list(reversed(args.methods))
            for cache in args.caches:
                for m in order:
                    log(f"run {run}/{args.runs}: {m} ({cache})")
                    r = restore_run(args, reaper, m, run, cache, files, src_digest)
                    result["runs"].append(r)
                    if r["error"]:
                        result["errors"].append(f"{m} {cache} run {run}: {r['error']}")
                        code = 1
    except (KeyboardInterrupt, BenchError, hg.GuestError, subprocess.TimeoutExpired,
            OSError) as e:
        code = record_failure(result, e)
    finally:
        reaper.kill_all()
        if not args.keep:
            remove_dirs(workdir, filedir)
        else:
            log(f"kept {workdir} and {filedir}")
    result["summary"] = {c: summarize(result["runs"], c, args.methods) for c in args.caches}
    if args.learn:
        for c in args.caches:
            result["summary"][c]["learn"] = summarize_learn(
                result["runs"], c, args.latencies,
                (result.get("learn") or {}).get("all_in_answer_s", []))
    result["elapsed_s"] = rnd(now() - t_start, 1)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    for c, s in result["summary"].items():
        if args.learn:
            for lat, row in s["learn"].items():
                a, b = row["original"], row["relayout"]
                log(f"medians, {c}, {lat}: VM access {a['vm_access_pct_median']} -> "
                    f"{b['vm_access_pct_median']} % ({row['relayout_nohot']['vm_access_pct_median']}"
                    f" % without the hot prefix read first), demand LBs {a['lb_demand_median']} -> "
                    f"{b['lb_demand_median']} ({b['lb_hot_median']} hot first), first HTTP "
                    f"{a['first_http_s_median']} -> {b['first_http_s_median']} s, requests mean "
                    f"{a['requests_mean_s_median']} -> {b['requests_mean_s_median']} s, max "
                    f"{a['requests_max_s_median']} -> {b['requests_max_s_median']} s; floor "
                    f"(all in before it runs) {row['floor_first_http_s']} s; goals "
                    f"{row['goals']}")
            continue
        log(f"medians, {c}: first HTTP ({args.first_http}) halite "
            f"{s['halite']['first_http_s_median']} s, qemu-eager "
            f"{s['qemu-eager']['first_http_s_median']} s (x{s['speedup_first_http']}); "
            f"workload halite {s['halite']['workload_s_median']} s, qemu-eager "
            f"{s['qemu-eager']['workload_s_median']} s (x{s['speedup_workload']})")
    return code


def emit(result, args, t_start, table):
    """The end of a QEMU bench's run: its elapsed time and the load it ran under
    (other work shows in every timing on 2 cores) into @result, then the JSON
    on stdout with @table(result) on stderr, or the table alone."""
    result["elapsed_s"] = rnd(now() - t_start, 1)
    if result.get("machine"):
        result["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
        log(table(result))
    else:
        print(table(result))


def print_table(result):
    """The medians per cache state and method, and the goals, for a reader."""
    def ms(x):
        return "-" if x is None else f"{x * 1e3:.1f} ms"
    print(f"{'cache':5} {'method':14} {'runs':>4} {'first answer':>13} {'req mean':>10} "
          f"{'req p50':>10} {'req p99':>10} {'req max':>10} {'workload':>10}")
    for c, s in result["summary"].items():
        for m in result["params"]["methods"]:
            x = s[m]
            print(f"{c:5} {m:14} {x['runs_ok']:>4} {ms(x['first_http_s_median']):>13} "
                  f"{ms(x['requests_mean_s_median']):>10} {ms(x['requests_p50_s_median']):>10} "
                  f"{ms(x['requests_p99_s_median']):>10} {ms(x['requests_max_s_median']):>10} "
                  f"{ms(x['workload_s_median']):>10}")
        print(f"{c:5} goals: " + ", ".join(f"{k} {'met' if v else 'NOT met' if v is False else '-'}"
                                           for k, v in s["goals"].items()))
        for lat, row in s.get("learn", {}).items():
            for k in LEARN_KINDS:
                x = row[k]
                print(f"{c:5} {lat:16} {k:14}: VM access {x['vm_access_pct_median']} %, demand "
                      f"LBs {x['lb_demand_median']}, hot LBs {x['lb_hot_median']}, first "
                      f"answer {ms(x['first_http_s_median'])}, req mean "
                      f"{ms(x['requests_mean_s_median'])}, max {ms(x['requests_max_s_median'])}")
            print(f"{c:5} {lat:16} goals: " + ", ".join(
                f"{k} {'met' if v else 'NOT met' if v is False else '-'}"
                for k, v in row["goals"].items()))
    for e in result["errors"]:
        print(f"error: {e}")


if __name__ == "__main__":
    sys.exit(main())
