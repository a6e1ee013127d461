#!/usr/bin/env python3
"""End-to-end tests of halite-cloned, the template fast-clone service (issue 14).

  test_clone.py CASE     CASE: api, bad-requests, exact, kill-restart, delete, corrupt,
                         damaged-chunk, cache-limit, hotset-relayout,
                         qemu

Each case starts its own daemon (temporary --socket, --state-dir, and a
--mem-dir under /dev/shm; its temporary directory is its --snapshot-dir), makes a small synthetic template with
`halite-synth save --mem 64 --vcpus 2`, talks to the daemon over its unix
socket with http.client (one connection per request, no retries), and kills
every process it started at the end, clones included, even when it fails.
- api: health, templates created, listed, shown; clones started, listed,
  shown with their fields; every /metrics sample line well formed, clones by
  state and the fault counters consistent with GET /clones; the CLI.
- bad-requests: invalid JSON, missing and mistyped fields, count 0 and 1000,
  an unknown template, route and method, a body over 64 KiB, a snapshot that
  does not exist and a file that is not a snapshot: each its status and a
  message naming the problem; a running clone's digest unchanged after.
- exact: 4 clones (no writes): each one's memory (control `dump`) equals the
  template's, extracted from the snapshot by halite-inspect.
- kill-restart: the daemon SIGKILLed while clones restore (slowed reads): a
  clone's `digest` blocks rather than answer; a new daemon re-attaches every
  clone and each finishes exact.
- delete: a clone deleted mid-restore is gone (process, GET, metrics); the
  others finish exact.
- corrupt: a byte flipped in one locality block of a template: a clone that
  reads all its memory fails with the block named; the daemon stays healthy
  and another template's clone is exact.
- qemu: the QEMU test guest (scripts/make-guest.sh) saved by halite-qemu save
  while its verifier runs becomes a template of kind "qemu"; 2 clones
  (halite-qemu clone, each QEMU on the template memory file mapped
  privately) run at once, each on its own forwarded port, QMP socket, serial
  file and MAC, and the verifier inside each re-reads its 64 MiB and finds
  the snapshot's digest. Skipped (77) without QEMU or the guest image.
- damaged-chunk: a format 1.1 template whose MB-map chunk is damaged: its clone
  fails naming the chunk (never zero pages); a good template's clone is exact.
- hotset-relayout: the learning loop (issue 17). Clones teach a template its
  hot set, which the daemon saves at the path the template's JSON names;
  `halite-inspect restore` reads it as a template's restore trace and
  `halite-inspect relayout` takes it; a template of the relayouted file,
  with no hot set file, has its hot prefix as hot set (exactly the blocks
  relayout put there), and a clone started with it premapped is exact.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CLONED = os.environ.get("HALITE_CLONED_BIN")
CLIENT = os.environ.get("HALITE_CLONE_BIN")
SYNTH = os.environ.get("HALITE_SYNTH_BIN")
INSPECT = os.environ.get("HALITE_INSPECT_BIN")
QEMU_BIN = os.environ.get("HALITE_QEMU_BIN")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts"))
import halite_guest as hg  # noqa: E402


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def log(msg):
    print(msg, flush=True)


class Env:
    """One case's daemon, directories and every process it started."""

    def __init__(self, name):
        self.tmp = tempfile.mkdtemp(prefix="halite-clone-%s." % name)
        self.mem = tempfile.mkdtemp(prefix="halite-clone-%s." % name, dir="/dev/shm")
        self.sock = os.path.join(self.tmp, "api.sock")
        self.state = os.path.join(self.tmp, "state")
        self.daemon = None
        self.daemon_args = []
        # what runs the daemon (e.g. nsenter into a network namespace) and its
        # environment: the test's own unless set
        self.wrap = []
        self.env = None
        self.pids = set()
        self.logs = []
        # snapshots are made in tmp: the daemon takes them from there only
        self.snapdirs = [self.tmp]

    # --- daemon ---
    def start(self, *args):
        self.daemon_args = list(args) or self.daemon_args
        logf = open(os.path.join(self.tmp, "daemon-%d.log" % len(self.logs)), "w")
        self.logs.append(logf.name)
        self.daemon = subprocess.Popen(
            self.wrap +
            [CLONED, "--socket", self.sock, "--state-dir", self.state, "--mem-dir", self.mem,
             "--synth-bin", SYNTH] + sum([["--snapshot-dir", s] for s in self.snapdirs], []) +
            self.daemon_args, stdout=logf, stderr=logf, env=self.env)
        logf.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            check(self.daemon.poll() is None, "the daemon exited at start:\n" + self.log_text())
            try:
                if self.req("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise Fail("the daemon did not answer /healthz within 20 s")

    def kill_daemon(self, sig=signal.SIGKILL):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(sig)
            rc = self.daemon.wait(timeout=30)
            self.daemon = None
            return rc
        return None

    def log_text(self):
        out = ""
        for p in self.logs:
            with open(p) as f:
                out += f.read()
        return out

    def req(self, method, path, body=None, raw=None, timeout=120):
        c = hg.UnixHTTPConnection(self.sock, timeout)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            headers = {"Content-Type": "application/json"} if data is not None else {}
            c.request(method, path, body=data, headers=headers)
            r = c.getresponse()
            text = r.read().decode()
            ctype = r.getheader("Content-Type", "")
            if ctype.startswith("application/json"):
                return r.status, json.loads(text)
            return r.status, text
        finally:
            c.close()

    def ok(self, method, path, body=None, want=200):
        st, j = self.req(method, path, body)
        check(st == want, "%s %s: %s, wanted %d: %s" % (method, path, st, want, j))
        return j

    # --- templates and clones ---
    def snapshot(self, name="t.hlt", *extra):
        path = os.path.join(self.tmp, name)
        subprocess.run([SYNTH, "save", "--out", path, "--mem", "64", "--vcpus", "2"] + list(extra),
                       check=True, stdout=subprocess.DEVNULL, timeout=120)
        return path

    def template(self, snap, hotset=True):
        return self.ok("POST", "/templates", {"snapshot": snap, "hotset": hotset}, 201)

    def clones(self, tid, count, **opts):
        body = {"count": count, "write_pct": 0}
        body.update(opts)
        j = self.ok("POST", "/templates/%s/clones" % tid, body, 201)
        for c in j["clones"]:
            self.pids.add(c["pid"])
        check(len(j["clones"]) == count, "%d clones started of %d: %s" % (len(j["clones"]), count, j))
        return [c["id"] for c in j["clones"]]

    def clone(self, cid):
        return self.ok("GET", "/clones/%s" % cid)

    def wait_state(self, cid, states, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            c = self.clone(cid)
            if c["state"] in states:
                return c
            time.sleep(0.1)
        raise Fail("clone %s still %s after %d s (wanted %s)" % (cid, c["state"], timeout, states))

    def ctl_path(self, cid):
        return os.path.join(self.state, "clones", cid, "control.sock")

    def extract(self, snap):
        img = snap + ".img"
        if not os.path.exists(img):
            subprocess.run([INSPECT, "extract", "-r", "pc.ram", "-o", img, snap], check=True,
                           stdout=subprocess.DEVNULL, timeout=120)
        with open(img, "rb") as f:
            return f.read()

    def check_exact(self, cid, want):
        out = os.path.join(self.tmp, cid + ".dump")
        ctl(self.ctl_path(cid), "dump " + out, timeout=60)
        with open(out, "rb") as f:
            got = f.read()
        os.unlink(out)
        check(len(got) == len(want), "clone %s: dump has %d bytes, the template %d" % (cid, len(got), len(want)))
        if got != want:
            bad = next(i for i in range(len(got)) if got[i] != want[i])
            raise Fail("clone %s: memory differs from the template's at byte 0x%x" % (cid, bad))

    # --- the end ---
    def cleanup(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        cdir = os.path.join(self.state, "clones")
        if os.path.isdir(cdir):
            for cid in os.listdir(cdir):
                try:
                    with open(os.path.join(cdir, cid, "clone.json")) as f:
                        self.pids.add(json.load(f)["pid"])
                except (OSError, ValueError, KeyError):
                    pass
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.mem, ignore_errors=True)


def ctl(path, cmd, timeout=10):
    """One command on a clone's control socket; its JSON reply. socket.timeout if none."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall((cmd + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    j = json.loads(buf)
    check("error" not in j, "control %s: %s" % (cmd, j))
    return j


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
                    r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*)?\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$')


def parse_metrics(text):
    """{(name, labels-tuple): value}; every line checked."""
    out, typed = {}, set()
    check(text.endswith("\n"), "metrics text does not end with a newline")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            parts = line.split()
            check(len(parts) == 4 and parts[3] in ("counter", "gauge", "histogram"), "bad TYPE line: " + line)
            typed.add(parts[2])
            continue
        m = SAMPLE.match(line)
        check(m, "bad metrics line: %r" % line)
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        check(name in typed or base in typed, "sample %s before its TYPE line" % name)
        labels = tuple(sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', m.group(3) or "")))
        out[(name, labels)] = float(m.group(5))
    return out


# --- cases -----------------------------------------------------------------

def case_api(e):
    e.start()
    h = e.ok("GET", "/healthz")
    check(h == {"ok": True, "templates": 0, "clones": 0}, "healthz: %s" % h)
    snap = e.snapshot()
    t = e.template(snap)
    for k in ("id", "kind", "snapshot", "memory_bytes", "stored_bytes"):
        check(k in t, "POST /templates reply lacks %s: %s" % (k, t))
    check(t["kind"] == "synthetic" and t["memory_bytes"] == 64 << 20, "template: %s" % t)
    lst = e.ok("GET", "/templates")["templates"]
    check([x["id"] for x in lst] == [t["id"]], "GET /templates: %s" % lst)
    show = e.ok("GET", "/templates/" + t["id"])
    check("stats" in show and show["stats"]["mb_total"] > 0, "GET /templates/ID: %s" % show)

    ids = e.clones(t["id"], 2, accesses=20000)
    clones = e.ok("GET", "/clones")["clones"]
    check(sorted(c["id"] for c in clones) == sorted(ids), "GET /clones: %s" % clones)
    for cid in ids:
        c = e.wait_state(cid, ("done",))
        for k in ("id", "template", "pid", "state", "ready_s", "faults", "faults_cached", "faults_read",
                  "faults_zero", "mb_premapped", "fault_p99_us", "pss_bytes", "rss_bytes", "error",
                  "lb_read", "bytes_read"):
            check(k in c, "GET /clones/ID lacks %s: %s" % (k, c))
        check(c["template"] == t["id"] and c["ready_s"] > 0 and c["rss_bytes"] > 0, "clone: %s" % c)
        check(c["faults"] >= c["faults_cached"] + c["faults_read"] + c["faults_zero"] - 0, "faults: %s" % c)
    # Each clone's reads are those it asked for first: together at most the template's demand reads.
    tst = e.ok("GET", "/templates/" + t["id"])["stats"]
    asked = sum(e.clone(cid)["lb_read"] for cid in ids)
    check(asked <= tst["lb_demand"], "clones' lb_read %d > the template's demand reads %d" % (asked, tst["lb_demand"]))
    h = e.ok("GET", "/healthz")
    check(h["templates"] == 1 and h["clones"] == 2, "healthz: %s" % h)

    st, text = e.req("GET", "/metrics")
    check(st == 200 and isinstance(text, str), "GET /metrics: %s" % st)
    m = parse_metrics(text)
    clones = e.ok("GET", "/clones")["clones"]
    for state in ("starting", "running", "done", "failed", "exited"):
        n = sum(1 for c in clones if c["state"] == state)
        check(m[("halite_clones", (("state", state),))] == n, "halite_clones{%s} != %d" % (state, n))
    for kind in ("cached", "read", "zero"):
        n = sum(c["faults_" + kind] for c in clones)
        check(m[("halite_clone_faults_total", (("kind", kind),))] == n,
              "halite_clone_faults_total{%s} %s != %d" % (kind, m[("halite_clone_faults_total", (("kind", kind),))], n))
    check(m[("halite_clone_ready_seconds_count", ())] == 2, "ready histogram count")
    check(m[("halite_clone_ready_seconds_bucket", (("le", "+Inf"),))] == 2, "ready histogram +Inf")
    tl = (("template", t["id"]),)
    check(m[("halite_template_complete", tl)] == 1, "template not complete")
    check(m[("halite_template_bytes_read_total", tl)] > 0, "no bytes read")

    # the CLI: exit 0 on 2xx, 1 on an error from the server, 2 for usage
    def cli(*args):
        return subprocess.run([CLIENT, "--socket", e.sock] + list(args), capture_output=True, text=True,
                              timeout=60)
    r = cli("list")
    check(r.returncode == 0 and all(cid in r.stdout for cid in ids), "halite-clone list: %s" % r)
    r = cli("--json", "show", ids[0])
    check(r.returncode == 0 and json.loads(r.stdout)["id"] == ids[0], "halite-clone show: %s" % r)
    r = cli("show", "c-00000000")
    check(r.returncode == 1 and "no clone" in r.stderr, "halite-clone show unknown: %s" % r)
    r = cli("frobnicate")
    check(r.returncode == 2, "halite-clone usage: %s" % r)
    r = cli("template", "delete", t["id"])
    check(r.returncode == 1 and "clone" in r.stderr, "template delete with clones: %s" % r)
    for cid in ids:
        check(cli("delete", cid).returncode == 0, "halite-clone delete")
    r = cli("template", "delete", t["id"])
    check(r.returncode == 0, "template delete: %s" % r)
    check(not any(n.startswith(t["id"]) for n in os.listdir(e.mem)), "template memory files left: %s" % os.listdir(e.mem))
    stop_daemon(e)


def stop_daemon(e):
    # SIGTERM: exit 0, the socket removed (sanitizer builds: no leak reported)
    rc = e.kill_daemon(signal.SIGTERM)
    check(rc == 0, "the daemon exited %s on SIGTERM:\n%s" % (rc, e.log_text()[-3000:]))
    check(not os.path.exists(e.sock), "the API socket is left after SIGTERM")


def case_bad_requests(e):
    e.start()
    snap = e.snapshot()
    t = e.template(snap)
    tid = t["id"]
    cid = e.clones(tid, 1)[0]
    e.wait_state(cid, ("done",))
    d0 = ctl(e.ctl_path(cid), "digest")["xxh3"]
    junk = os.path.join(e.tmp, "junk")
    with open(junk, "wb") as f:
        f.write(b"not a snapshot\n" * 100)

    cases = [
        ("POST", "/templates", b"{bad", 400, "invalid JSON"),
        ("POST", "/templates", b"[1,2]", 400, "JSON object"),
        ("POST", "/templates", b"", 400, "missing body"),
        ("POST", "/templates", b"{}", 400, "snapshot"),
        ("POST", "/templates", b'{"snapshot": 5}', 400, "snapshot"),
        ("POST", "/templates", b'{"snapshot": "rel/path"}', 400, "absolute"),
        ("POST", "/templates", json.dumps({"snapshot": snap, "hotset": "yes"}).encode(), 400, "hotset"),
        ("POST", "/templates", b'{"snapshot": "/nonexistent/x.hlt"}', 403, "not inside a snapshot directory"),
        ("POST", "/templates", json.dumps({"snapshot": e.tmp + "/nonexistent.hlt"}).encode(), 400,
         "nonexistent.hlt: No such file"),
        ("POST", "/templates", json.dumps({"snapshot": junk}).encode(), 400, "not a Halite file"),
        ("POST", "/templates", json.dumps({"snapshot": snap, "extra": 1}).encode(), 400, "extra"),
        ("POST", "/templates/%s/clones" % tid, b'{"count": 0}', 400, "count"),
        ("POST", "/templates/%s/clones" % tid, b'{"count": 1000}', 400, "count"),
        ("POST", "/templates/%s/clones" % tid, b'{"count": "2"}', 400, "count"),
        ("POST", "/templates/%s/clones" % tid, b'{"count": 1.5}', 400, "count"),
        ("POST", "/templates/%s/clones" % tid, b'{"write_pct": 101}', 400, "write_pct"),
        ("POST", "/templates/%s/clones" % tid, b'{"pattern": "zigzag"}', 400, "pattern"),
        ("POST", "/templates/%s/clones" % tid, b'{"premap_hot": 1}', 400, "premap_hot"),
        ("POST", "/templates/t-00000000/clones", b'{"count": 1}', 404, "t-00000000"),
        ("GET", "/templates/t-00000000", None, 404, "t-00000000"),
        ("GET", "/clones/c-00000000", None, 404, "c-00000000"),
        ("DELETE", "/clones/whatever", None, 404, "whatever"),
        ("GET", "/nope", None, 404, "/nope"),
        ("GET", "/templates/%s/clones/x" % tid, None, 404, "no route"),
        ("PUT", "/templates", b"{}", 405, "PUT"),
        ("POST", "/healthz", b"{}", 405, "POST"),
        ("GET", "/templates/%s/clones" % tid, None, 405, "GET"),
        ("DELETE", "/templates/%s" % tid, None, 409, "clone"),
        ("POST", "/templates", b'{"snapshot": "' + b"x" * (70 << 10) + b'"}', 413, "65536"),
    ]
    for method, path, body, want, words in cases:
        st, j = e.req(method, path, raw=body)
        check(st == want, "%s %s %.60r: status %s, wanted %d (%s)" % (method, path, body, st, want, j))
        check(isinstance(j, dict) and isinstance(j.get("error"), str), "%s %s: not a JSON error: %r" % (method, path, j))
        check(words.lower() in j["error"].lower(), "%s %s: error %r does not name %r" % (method, path, j["error"], words))
        log("  %-6s %-34s %d %s" % (method, path[:34], st, j["error"]))
    c = e.clone(cid)
    check(c["state"] == "done", "the clone is %s after the bad requests" % c["state"])
    check(ctl(e.ctl_path(cid), "digest")["xxh3"] == d0, "the clone's digest changed")
    check(e.ok("GET", "/healthz")["clones"] == 1, "healthz after the bad requests")


def case_exact(e):
    e.start()
    snap = e.snapshot()
    want = e.extract(snap)
    t = e.template(snap)
    ids = e.clones(t["id"], 4, pattern="random")
    digests = set()
    for cid in ids:
        e.wait_state(cid, ("done",))
        e.check_exact(cid, want)
        digests.add(ctl(e.ctl_path(cid), "digest")["xxh3"])
    check(len(digests) == 1, "clones' digests differ: %s" % digests)
    # SIGTERM leaves the clones running (the next daemon's)
    stop_daemon(e)
    for cid in ids:
        with open(os.path.join(e.state, "clones", cid, "clone.json")) as f:
            os.kill(json.load(f)["pid"], 0)


def slow_daemon_args():
    # One reader, 20 ms per locality block: a 64 MiB template's ~600 blocks
    # take seconds, so the clones are mid-restore when the test acts.
    return ["--readers", "1", "--read-latency-us", "20000", "--hot-window-ms", "100"]


def mid_restore(e):
    """A slow daemon, a template and 3 clones still being restored: (their ids, the memory they must end with)."""
    e.start(*slow_daemon_args())
    snap = e.snapshot()
    want = e.extract(snap)
    t = e.template(snap, hotset=False)
    ids = e.clones(t["id"], 3, pattern="random", premap_hot=False)
    time.sleep(0.3)
    states = [e.clone(cid)["state"] for cid in ids]
    check(all(s == "running" for s in states), "clones not mid-restore: %s" % states)
    return ids, want


def case_kill_restart(e):
    ids, want = mid_restore(e)
    e.kill_daemon(signal.SIGKILL)
    for cid in ids:
        check(os.path.exists(e.ctl_path(cid)), "clone %s's directory gone with the daemon" % cid)
    # The clones outlive the daemon; one that touches all its memory blocks.
    try:
        r = ctl(e.ctl_path(ids[0]), "digest", timeout=2)
        raise Fail("a clone answered 'digest' with no daemon serving it: %s" % r)
    except socket.timeout:
        log("  digest blocked without the daemon, as it should")
    e.start()
    for cid in ids:
        c = e.wait_state(cid, ("done",), timeout=120)
        check(not c["error"], "clone %s: %s" % (cid, c["error"]))
        e.check_exact(cid, want)
    check("re-attached" in e.log_text(), "the daemon's log does not say it re-attached")
    stop_daemon(e)


def case_delete(e):
    ids, want = mid_restore(e)
    victim = e.clone(ids[0])
    j = e.ok("DELETE", "/clones/" + ids[0])
    check(j == {"deleted": ids[0]}, "DELETE reply: %s" % j)
    check(e.req("GET", "/clones/" + ids[0])[0] == 404, "deleted clone still listed")
    check(not os.path.exists(os.path.join(e.state, "clones", ids[0])), "deleted clone's directory left")
    try:
        os.kill(victim["pid"], 0)
        raise Fail("deleted clone's process %d still runs" % victim["pid"])
    except ProcessLookupError:
        pass
    for cid in ids[1:]:
        e.wait_state(cid, ("done",), timeout=120)
        e.check_exact(cid, want)
    m = parse_metrics(e.req("GET", "/metrics")[1])
    total = sum(v for (n, _), v in m.items() if n == "halite_clones")
    check(total == 2 and m[("halite_clones", (("state", "done"),))] == 2, "metrics after delete: %s clones" % total)


def case_cache_limit(e):
    # The operator's bound on the templates' decoded blocks: one fits, two do not.
    e.start()
    snap = e.snapshot()
    need = e.ok("POST", "/templates", {"snapshot": snap}, want=201)
    st = e.ok("GET", "/templates/" + need["id"])["stats"]
    one = st["mb_stored"] * (need["memory_bytes"] // st["mb_total"])
    e.ok("DELETE", "/templates/" + need["id"])
    stop_daemon(e)
    e.start("--cache-max", str(one + one // 2))
    t1 = e.template(snap)
    st, j = e.req("POST", "/templates", {"snapshot": snap})
    check(st == 507, "second template past --cache-max: status %s (%s)" % (st, j))
    check("--cache-max" in j["error"], "507 error does not name --cache-max: %r" % j["error"])
    check(len(e.ok("GET", "/templates")["templates"]) == 1, "the refused template is listed")
    check(sorted(os.listdir(e.mem)) == sorted([t1["id"] + ".mem", t1["id"] + ".mem.fill"]),
          "the refused template left files: %s" % os.listdir(e.mem))
    m = parse_metrics(e.req("GET", "/metrics")[1])
    check(m[("halite_template_cache_limit_bytes", ())] == one + one // 2, "metrics: cache limit")
    e.ok("DELETE", "/templates/" + t1["id"])
    t2 = e.template(snap)
    cid = e.clones(t2["id"], 1)[0]
    e.wait_state(cid, ("done",))
    e.check_exact(cid, e.extract(snap))


def flip_byte_in_lb(snap, out):
    r = subprocess.run([INSPECT, "blocks", "--json", snap], check=True, capture_output=True, text=True)
    lbs = [b for b in json.loads(r.stdout)["lbs"] if b["used"] > 1024 and b["mbs"] > 0]
    lb = lbs[len(lbs) // 2]
    shutil.copy(snap, out)
    with open(out, "r+b") as f:
        f.seek(lb["offset"] + lb["used"] // 2)
        b = f.read(1)
        f.seek(lb["offset"] + lb["used"] // 2)
        f.write(bytes([b[0] ^ 0x5a]))
    return lb["lb"]


def case_corrupt(e):
    e.start()
    good = e.snapshot()
    want = e.extract(good)
    bad = os.path.join(e.tmp, "bad.hlt")
    lb = flip_byte_in_lb(good, bad)
    log("  flipped a byte in locality block %d" % lb)
    tb = e.template(bad, hotset=False)
    tg = e.template(good)
    cb = e.clones(tb["id"], 1, premap_hot=False)[0]
    # A dump reads all of the clone's memory: it needs the bad block and blocks.
    def dump():
        try:
            ctl(e.ctl_path(cb), "dump " + os.path.join(e.tmp, "bad.dump"), timeout=30)
        except (socket.timeout, OSError, Fail, ValueError):
            pass
    threading.Thread(target=dump, daemon=True).start()
    c = e.wait_state(cb, ("failed",), timeout=60)
    check(re.search(r"\b%d\b" % lb, c["error"]), "the failed clone's error does not name LB %d: %r" % (lb, c["error"]))
    log("  failed clone: %s" % c["error"])
    check(e.ok("GET", "/healthz")["ok"], "daemon unhealthy")
    cg = e.clones(tg["id"], 1)[0]
    e.wait_state(cg, ("done",), timeout=60)
    e.check_exact(cg, want)


def damage_mb_map_entry(snap, out, mb):
    """A copy of @snap with memory block @mb's entry in the MB map damaged (a
    format 1.1 file: its chunk fails its checksum when first used)."""
    shutil.copy(snap, out)
    info = json.loads(subprocess.run([INSPECT, "info", "--json", out], stdout=subprocess.PIPE,
                                     check=True, timeout=60).stdout)
    check(str(info["version"]) == "1.1", "%s is format %s, not 1.1 (chunked index)" % (snap, info["version"]))
    off = next(x["offset"] for x in info["sections"] if x["name"] == "mb-map")
    with open(out, "r+b") as f:
        f.seek(off + 8 * mb + 1)
        b = f.read(1)
        f.seek(off + 8 * mb + 1)
        f.write(bytes([b[0] ^ 1]))


def case_damaged_chunk(e):
    """A damaged MB-map chunk (issue 24): the clone that needs it fails naming the
    chunk, never runs on zero pages; a clone of a good template is exact."""
    e.start()
    good = e.snapshot("big.hlt", "--mem", "128")  # 16384 blocks: two MB-map chunks
    bad = os.path.join(e.tmp, "bad.hlt")
    damage_mb_map_entry(good, bad, 8192 + 7)
    tb = e.template(bad, hotset=False)
    cb = e.clones(tb["id"], 1, premap_hot=False, accesses=32768)[0]
    c = e.wait_state(cb, ("failed", "done", "exited"), timeout=60)
    check(c["state"] == "failed" and "mb-map chunk 1" in c["error"] and bad in c["error"],
          "the clone of the damaged file: %s, %r (wanted failed, naming the file and "
          "mb-map chunk 1)"
          % (c["state"], c["error"]))
    log("  failed clone: %s" % c["error"])
    check(e.ok("GET", "/healthz")["ok"], "daemon unhealthy")
    tg = e.template(good)
    cg = e.clones(tg["id"], 1)[0]
    e.wait_state(cg, ("done",), timeout=60)
    e.check_exact(cg, e.extract(good))


class Skip(Exception):
    pass


def case_qemu(e):
    if not hg.qemu_available() or not hg.image_ready() or not QEMU_BIN:
        raise Skip("no qemu-system-x86_64, test guest (scripts/make-guest.sh) or halite-qemu")
    image = os.path.join(e.tmp, "disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", image, "64M"], check=True,
                   timeout=60)
    src = hg.Guest(e.tmp, "source").with_disk("drive", image)
    src.args += ["-device", "vmgenid,guid=c0ffee00-1234-4321-8765-0123456789ab"]
    src.boot()
    e.pids.add(src.pid)
    src.wait_ready()
    d_disk, _, _, ok = src.disklog()
    check(ok and d_disk > 0, "the source guest's disklog counts on its disk (%d)" % d_disk)
    # The verifier's rewrites frozen: the digest stays put across the snapshot.
    src.rewrites(False)
    d0, _, ok0 = src.digest()
    check(ok0, "source guest digest %s as expected" % d0)
    snap = os.path.join(e.tmp, "guest.hlt")
    p = subprocess.run([QEMU_BIN, "save", "--qmp", src.qmp_path, "--json", "-q", snap],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p.returncode == 0, "halite-qemu save: exit %d: %s" % (p.returncode, p.stderr[-2000:]))
    q = src.qmp()
    q.cmd("quit")
    src.proc.wait(timeout=30)
    log("  saved the test guest (digest %s)" % d0)

    e.start("--qemu-bin", QEMU_BIN)
    t = e.template(snap)
    check(t["kind"] == "qemu", "the template is of kind qemu: %s" % t)
    t0 = time.time()
    ids = e.clones(t["id"], 2)
    log("  2 clones started in %.2f s" % (time.time() - t0))
    mem_file = os.path.join(e.mem, t["id"] + ".mem")
    guests, ports, macs, genids, overlays = [], set(), set(), set(), set()
    for cid in ids:
        c = e.wait_state(cid, ("running", "done"), timeout=120)
        e.pids.add(c["qemu_pid"])
        check(c["qemu_pid"] != c["pid"] and c["forwards"] and c["macs"] and c["qmp"],
              "clone %s: its QEMU, forwards, MAC and QMP socket: %s" % (cid, c))
        g = hg.Guest(e.tmp, cid)
        g.adopt(c["qemu_pid"])
        g.port = c["forwards"][0]["host_port"]
        g.console = c["serial"]
        g.qmp_path = c["qmp"]
        guests.append(g)
        ports.add(g.port)
        macs.add(c["macs"][0])
        overlays.update(c["disks"])
        with open("/proc/%d/maps" % c["qemu_pid"]) as f:
            check(any(l.split()[1].startswith("rw-p") and l.split()[-1] == mem_file
                      for l in f if len(l.split()) >= 6),
                  "clone %s: QEMU maps the template memory file privately" % cid)
        q = g.qmp()
        genids.add(q.cmd("query-vm-generation-id")["guid"])
        net = q.cmd("human-monitor-command", **{"command-line": "info network"})
        q.close()
        log("  clone %s: forwards %s, MAC %s (QEMU says: %s)" % (
            cid, c["forwards"], c["macs"],
            " ".join(l.strip() for l in net.splitlines() if "macaddr" in l)))
    check(len(ports) == 2 and len(macs) == 2 and len({g.qmp_path for g in guests}) == 2,
          "each clone has its own host port %s, MAC %s and QMP socket" % (ports, macs))
    check(len(genids) == 2 and "c0ffee00-1234-4321-8765-0123456789ab" not in genids,
          "each clone has a new vmgenid: %s" % genids)
    check(len(overlays) == 2 and all(os.path.exists(o) for o in overlays),
          "each clone runs on its own disk overlay: %s" % overlays)
    for g in guests:
        d, up, ok = g.digest()
        check(ok and d == d0, "clone on port %d: the verifier's digest %s is the snapshot's %s"
              % (g.port, d, d0))
        st = g.status()
        check(st["mismatches"] == "0", "clone on port %d: 0 mismatches" % g.port)
        dk, mk, _, ok = g.disklog()
        check(ok and dk >= d_disk, "clone on port %d: its disk's count %d agrees with its "
              "memory's %d" % (g.port, dk, mk))
        q = g.qmp()
        check(q.cmd("query-status")["status"] == "running", "its own QMP answers: running")
        q.close()
        g.check_console()
        log("  clone on port %d: digest %s, uptime %.1f s, %s passes" % (g.port, d, up,
                                                                         st["passes"]))
    for cid in ids:
        c = e.wait_state(cid, ("done",), timeout=120)
        check(not c["error"], "clone %s done: %s" % (cid, c))
        log("  clone %s done: %d faults (%d vCPU), %d blocks premapped, QEMU's RSS %d MiB, "
            "PSS %d MiB" % (cid, c["faults"], c["faults_vcpu"], c["mb_premapped"],
                            c["rss_bytes"] >> 20, c["pss_bytes"] >> 20))
    # A restarted daemon finds its QEMU clones again (their info, their userfaultfds).
    e.kill_daemon()
    e.start()
    for cid in ids:
        c = e.clone(cid)
        check(c["state"] in ("running", "done") and not c["error"],
              "after a daemon restart clone %s is %s: %s" % (cid, c["state"], c))
    for g in guests:
        d, _, ok = g.digest()
        check(ok and d == d0, "all memory in: the digest is still the snapshot's")
    for cid in ids:
        e.ok("DELETE", "/clones/%s" % cid)


def run_json(args, want_rc=0):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(p.returncode == want_rc, "%s: exit %d, wanted %d: %s %s" % (
        " ".join(args), p.returncode, want_rc, p.stdout.decode(), p.stderr.decode()))
    return json.loads(p.stdout)


def case_hotset_relayout(e):
    e.start("--hot-window-ms", "300")
    snap = e.snapshot()
    want = e.extract(snap)
    t = e.template(snap)
    hot = os.path.join(e.state, "templates", t["id"] + ".hot")
    check(t["hotset_path"] == hot, "hotset_path %s, wanted %s" % (t["hotset_path"], hot))
    ids = e.clones(t["id"], 2, pattern="random", premap_hot=False)
    # Saved once the window (300 ms) and half a second more are over.
    deadline = time.time() + 30
    while not os.path.exists(hot) and time.time() < deadline:
        time.sleep(0.1)
    check(os.path.exists(hot), "no hot set at %s after 30 s" % hot)
    for cid in ids:
        e.wait_state(cid, ("done",))
    st = e.ok("GET", "/templates/%s" % t["id"])["stats"]
    check(st["hot_mb"] > 0 and st["hot_mb_prefix"] == 0, "template stats: %s" % st)
    r = run_json([INSPECT, "restore", "--json", snap, hot])
    learn = r["learn"]
    check(r["written_by"] == "template" and r["stats"] is None and r["trace_version"] == 2,
          "halite-inspect restore of the hot set: %s" % r)
    check(learn["touches"] == st["hot_mb"] and learn["stored"] == learn["touches"] and
          learn["window_ms"] == 300 and not learn["complete"],
          "hot set trace %s, template hot_mb %d" % (learn, st["hot_mb"]))
    snap2 = os.path.join(e.tmp, "t2.hlt")
    rl = run_json([INSPECT, "relayout", "--json", snap, "--trace", hot, "-o", snap2])
    check(rl["touched_blocks"] == st["hot_mb"] and rl["hot_blocks"] == st["hot_mb"] and
          rl["hot_lbs"] > 0, "relayout: %s (hot_mb %d)" % (rl, st["hot_mb"]))
    # A trace of the template's snapshot only: the relayouted file refuses it.
    run_json([INSPECT, "restore", "--json", snap2, hot], want_rc=1)

    t2 = e.template(snap2, hotset=False)
    check(t2["hotset_path"] is None, "hotset_path without a hot set: %s" % t2["hotset_path"])
    st2 = e.ok("GET", "/templates/%s" % t2["id"])["stats"]
    check(st2["hot_mb"] == rl["hot_blocks"] and st2["hot_mb_prefix"] == rl["hot_blocks"],
          "relayouted template's hot set %s, relayout's hot blocks %d" % (st2, rl["hot_blocks"]))
    cid = e.clones(t2["id"], 1, pattern="random", premap_hot=True)[0]
    c = e.wait_state(cid, ("done",))
    check(c["mb_premapped"] == rl["hot_blocks"], "premapped %s, hot blocks %d" % (
        c["mb_premapped"], rl["hot_blocks"]))
    e.check_exact(cid, want)


CASES = {"api": case_api, "bad-requests": case_bad_requests, "exact": case_exact,
         "kill-restart": case_kill_restart, "delete": case_delete, "corrupt": case_corrupt,
         "cache-limit": case_cache_limit, "qemu": case_qemu, "damaged-chunk": case_damaged_chunk,
         "hotset-relayout": case_hotset_relayout}


def run_cases(cases, doc, prefix="", teardown=None):
    """The case runner every tests/clone script shares: `SCRIPT CASE`, a daemon
    environment of its own, exit 0 (pass), 1 (fail: the daemon's log shown),
    2 (usage) or 77 (skip). @teardown(e), if given, ends the case instead of
    e.cleanup() (and must call it)."""
    if len(sys.argv) != 2 or sys.argv[1] not in cases:
        print(doc, file=sys.stderr)
        return 2
    for name, v in (("HALITE_CLONED_BIN", CLONED), ("HALITE_CLONE_BIN", CLIENT),
                    ("HALITE_SYNTH_BIN", SYNTH), ("HALITE_INSPECT_BIN", INSPECT)):
        if not v:
            print("%s not set" % name, file=sys.stderr)
            return 2
    if os.geteuid() != 0:
        print("skip: the engine serves other processes' userfaultfds (root)")
        return 77
    e = Env(prefix + sys.argv[1])
    try:
        cases[sys.argv[1]](e)
        log("%s: ok" % sys.argv[1])
        return 0
    except Skip as x:
        log("skip: %s" % x)
        return 77
    except Exception as x:  # a Fail, or anything else: the daemon's log helps
        log("%s: FAIL: %s: %s" % (sys.argv[1], type(x).__name__, x))
        log("--- daemon log ---\n" + e.log_text())
        return 1
    finally:
        (teardown or Env.cleanup)(e)


def main():
    return run_cases(CASES, __doc__)


if __name__ == "__main__":
    sys.exit(main())
