#!/usr/bin/env python3
"""halite-cloned: what the daemon reads, and its own files and records (issue 24).

  test_clone_files.py CASE    CASE: snapdir, resave, unavailable, dirs

- snapdir: snapshots come from --snapshot-dir only. A root-only (0600)
  snapshot outside the directory and a path outside that does not exist get
  byte-identical 403 replies, and so do links inside that lead out; a FIFO
  inside is refused (400) within a second, the daemon still answering and
  stopping on SIGTERM; a group-writable snapshot and one of user nobody are
  refused naming why; '..' is refused; a good one is made, with its file's
  uuid. A daemon without --snapshot-dir refuses every POST /templates, and a
  group-writable --snapshot-dir is refused at start.
- resave: the snapshot of a template whose 2 clones are mid-restore is
  re-saved at its path (another snapshot, tmp + rename) and the daemon
  restarted: the template is unavailable naming the replacement, its memory
  file's bytes and inode untouched, the clones alive and listed; a POST of the
  path is a new template with the new uuid, its clone exact against the new
  file; the old file put back, the old template loads again and its clones
  finish exact against the old file.
- unavailable: the snapshot moved away and the daemon restarted: the template
  is unavailable with the reason, its clones orphaned with the reason, DELETE
  of one ends its process; moved back, ready within 10 s and the other clone
  finishes exact. Restarted with a --cache-max that fits one of two templates:
  one ready, one unavailable naming --cache-max.
- dirs: a --mem-dir under /dev/shm made first by user nobody, a --state-dir
  of mode 0777 and one reached through nobody's symlink: exit 1 naming the
  owner and the fix; after a run every file under the state and memory
  directories is 0600, every directory 0700 (sockets: no access for group
  and others); a second daemon on the same --state-dir: exit 1 naming the
  first's pid.
"""
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_clone as tc  # noqa: E402
from test_clone import (CLONED, INSPECT, SYNTH, Fail, check, hg, log,  # noqa: E402
                        slow_daemon_args, stop_daemon)

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def raw_post(e, path, body, timeout=5):
    """POST a JSON body: (status, the reply's bytes), for byte-for-byte comparisons."""
    c = hg.UnixHTTPConnection(e.sock, timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def post_snapshot(e, snap, want, words, timeout=5):
    st, body = raw_post(e, "/templates", {"snapshot": snap, "hotset": False}, timeout)
    j = json.loads(body)
    check(st == want, "POST %s: status %s, wanted %d: %s" % (snap, st, want, j))
    check(words in j.get("error", ""), "POST %s: error %r does not say %r" % (snap, j, words))
    log("  %s -> %d %s" % (snap, st, j["error"]))
    return body


def save(path, *extra):
    subprocess.run([SYNTH, "save", "--out", path, "--mem", "64", "--vcpus", "2"] + list(extra),
                   check=True, stdout=subprocess.DEVNULL, timeout=120)


def extract(snap, out):
    subprocess.run([INSPECT, "extract", "-r", "pc.ram", "-o", out, snap], check=True,
                   stdout=subprocess.DEVNULL, timeout=120)
    with open(out, "rb") as f:
        return f.read()


def file_uuid(snap):
    r = subprocess.run([INSPECT, "info", "--json", snap], check=True, capture_output=True,
                       text=True, timeout=60)
    return json.loads(r.stdout)["uuid"]


def tmpl(e, tid):
    return e.ok("GET", "/templates/" + tid)


def wait_template(e, tid, state, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = tmpl(e, tid)
        if t["state"] == state:
            return t
        time.sleep(0.1)
    raise Fail("template %s still %s after %d s (wanted %s): %s" % (tid, t["state"], timeout,
                                                                    state, t.get("error")))


def gone(pid, timeout=5):
    """The process ended (a zombie awaiting its reaper counts as ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def start_fails(args, timeout=20):
    """The daemon with @args must exit at start: (exit code, its output)."""
    p = subprocess.run([CLONED, "--synth-bin", SYNTH] + args, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def case_snapdir(e):
    e.start()
    outside = tempfile.mkdtemp(prefix="halite-files-outside.")
    try:
        secret = os.path.join(outside, "secret.hlt")
        save(secret)
        os.chmod(secret, 0o600)
        nothing = os.path.join(outside, "nothing.hlt")
        a = post_snapshot(e, secret, 403, "is not inside a snapshot directory of this daemon")
        b = post_snapshot(e, nothing, 403, "is not inside a snapshot directory of this daemon")
        check(a == b, "a root-only file and a missing one outside get different replies:\n"
              "%r\n%r" % (a, b))
        check(("--snapshot-dir %s" % e.tmp).encode() in a, "the 403 names no --snapshot-dir: %r" % a)
        for name, target in (("abs-link.hlt", secret),
                             ("rel-link.hlt", os.path.relpath(secret, e.tmp))):
            link = os.path.join(e.tmp, name)
            os.symlink(target, link)
            c = post_snapshot(e, link, 403, "is not inside a snapshot directory")
            check(c == a, "a link inside leading out (%s) gets another reply: %r" % (target, c))
        post_snapshot(e, e.tmp + "/../" + os.path.basename(outside) + "/secret.hlt", 400, "'..'")

        fifo = os.path.join(e.tmp, "fifo.hlt")
        os.mkfifo(fifo)
        t0 = time.time()
        post_snapshot(e, fifo, 400, "not a regular file (a FIFO)", timeout=5)
        check(time.time() - t0 < 1, "the FIFO took %.1f s to refuse" % (time.time() - t0))
        check(e.ok("GET", "/healthz")["ok"], "the daemon is unhealthy after the FIFO")

        good = e.snapshot("good.hlt")
        gw = os.path.join(e.tmp, "group-writable.hlt")
        shutil.copy(good, gw)
        os.chmod(gw, 0o664)
        post_snapshot(e, gw, 400, "is writable by group or others (mode 0664)")
        theirs = os.path.join(e.tmp, "nobody.hlt")
        shutil.copy(good, theirs)
        os.chown(theirs, 65534, 65534)
        post_snapshot(e, theirs, 400, "is owned by uid 65534")
        t = e.template(good, hotset=False)
        check(t["uuid"] == file_uuid(good) and t["state"] == "ready",
              "the template's uuid %s state %s, the file's uuid %s" % (t["uuid"], t["state"],
                                                                       file_uuid(good)))
        with open(os.path.join(e.state, "templates", t["id"] + ".json")) as f:
            check(json.load(f)["uuid"] == t["uuid"], "the record lacks the uuid")
        stop_daemon(e)

        # no --snapshot-dir: no template at all
        e.snapdirs = []
        e.start()
        post_snapshot(e, good, 403, "start halite-cloned with --snapshot-dir")
        stop_daemon(e)
        # a snapshot directory others may write to is refused at start
        os.chmod(outside, 0o777)
        rc, out = start_fails(["--socket", e.sock + "2", "--state-dir", e.state, "--mem-dir",
                               e.mem, "--snapshot-dir", outside])
        check(rc == 1 and "must belong to root or this daemon's uid" in out,
              "a world-writable --snapshot-dir: exit %d: %s" % (rc, out))
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def mem_state(e, tid):
    path = os.path.join(e.mem, tid + ".mem")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return os.stat(path).st_ino, digest


def case_resave(e):
    e.start(*slow_daemon_args())
    snap = e.snapshot("t.hlt")
    want_old = extract(snap, os.path.join(e.tmp, "old.img"))
    t = e.template(snap, hotset=False)
    ids = e.clones(t["id"], 2, pattern="random", premap_hot=False)
    time.sleep(0.3)
    cl = [e.clone(cid) for cid in ids]
    check(all(c["state"] == "running" for c in cl), "clones not mid-restore: %s" %
          [c["state"] for c in cl])
    pids = [c["pid"] for c in cl]

    # Re-saved at the same path: another snapshot written aside, renamed over.
    old = os.path.join(e.tmp, "old.hlt")
    os.link(snap, old)
    save(os.path.join(e.tmp, "t.hlt.new"), "--seed", "7")
    os.rename(os.path.join(e.tmp, "t.hlt.new"), snap)
    new_uuid = file_uuid(snap)
    check(new_uuid != t["uuid"], "the re-saved file has the old uuid")
    e.kill_daemon(signal.SIGKILL)
    before = mem_state(e, t["id"])
    e.start(*slow_daemon_args())

    t1 = tmpl(e, t["id"])
    check(t1["state"] == "unavailable" and "was replaced" in t1["error"] and
          new_uuid in t1["error"] and t["uuid"] in t1["error"],
          "the re-saved template: %s" % t1)
    log("  template %s: %s" % (t["id"], t1["error"]))
    check(mem_state(e, t["id"]) == before, "the template's memory file changed (inode or bytes)")
    for cid, pid in zip(ids, pids):
        c = e.clone(cid)
        check(alive(pid) and c["state"] == "orphaned" and "unavailable" in c["error"],
              "clone %s (pid %d alive %s): %s" % (cid, pid, alive(pid), c))

    t2 = e.template(snap, hotset=False)
    check(t2["id"] != t["id"] and t2["uuid"] == new_uuid, "a new POST of the path: %s" % t2)
    want_new = extract(snap, os.path.join(e.tmp, "new.img"))
    if want_new == want_old:
        log("  (the re-saved snapshot's memory equals the old one's)")
    c2 = e.clones(t2["id"], 1)[0]
    e.wait_state(c2, ("done",), timeout=120)
    e.check_exact(c2, want_new)
    check(mem_state(e, t["id"]) == before, "the old template's memory file changed")

    os.rename(old, snap)
    wait_template(e, t["id"], "ready", 10)
    for cid in ids:
        c = e.wait_state(cid, ("done",), timeout=120)
        check(not c["error"], "clone %s: %s" % (cid, c["error"]))
        e.check_exact(cid, want_old)
    stop_daemon(e)


def case_unavailable(e):
    e.start(*slow_daemon_args())
    snap = e.snapshot("t.hlt")
    want = e.extract(snap)
    t = e.template(snap, hotset=False)
    ids = e.clones(t["id"], 2, pattern="random", premap_hot=False)
    time.sleep(0.3)
    e.kill_daemon(signal.SIGKILL)
    away = os.path.join(e.tmp, "away.hlt")
    os.rename(snap, away)
    e.start(*slow_daemon_args())
    t1 = tmpl(e, t["id"])
    check(t1["state"] == "unavailable" and snap in t1["error"] and
          "No such file" in t1["error"], "the template of a missing snapshot: %s" % t1)
    check(len(e.ok("GET", "/templates")["templates"]) == 1, "the template is not listed")
    cl = {cid: e.clone(cid) for cid in ids}
    for cid, c in cl.items():
        check(c["state"] == "orphaned" and "unavailable" in c["error"] and alive(c["pid"]),
              "clone %s: %s" % (cid, c))
    log("  clone %s: %s" % (ids[0], cl[ids[0]]["error"]))
    j = e.ok("DELETE", "/clones/" + ids[0])
    check(j == {"deleted": ids[0]}, "DELETE of an orphaned clone: %s" % j)
    check(gone(cl[ids[0]]["pid"]), "the deleted orphaned clone's process runs on")
    check(e.req("GET", "/clones/" + ids[0])[0] == 404, "the deleted clone is listed")
    check(not os.path.exists(os.path.join(e.state, "clones", ids[0])), "its records are left")
    st, j = e.req("POST", "/templates/%s/clones" % t["id"], {"count": 1})
    check(st == 409 and "unavailable" in j["error"], "a clone of an unavailable template: %s %s"
          % (st, j))

    os.rename(away, snap)
    t0 = time.time()
    wait_template(e, t["id"], "ready", 10)
    log("  ready again %.1f s after the file came back" % (time.time() - t0))
    c = e.wait_state(ids[1], ("done",), timeout=120)
    check(not c["error"], "clone %s: %s" % (ids[1], c["error"]))
    e.check_exact(ids[1], want)

    # --cache-max applies to reloads: of two templates, one fits.
    t2 = e.template(snap, hotset=False)
    st = tmpl(e, t2["id"])["stats"]
    one = st["mb_stored"] * (t2["memory_bytes"] // st["mb_total"])
    stop_daemon(e)
    e.start("--cache-max", str(one + one // 2))
    ts = e.ok("GET", "/templates")["templates"]
    states = sorted(x["state"] for x in ts)
    check(states == ["ready", "unavailable"], "templates at a restart under --cache-max: %s" % ts)
    bad = [x for x in ts if x["state"] == "unavailable"][0]
    check("--cache-max" in bad["error"], "the unavailable template's error: %s" % bad["error"])
    log("  %s: %s" % (bad["id"], bad["error"]))


def walk_modes(root):
    bad = []
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files + [""]:
            p = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode) and mode != 0o700:
                bad.append("%s: dir %04o" % (p, mode))
            elif stat.S_ISREG(st.st_mode) and mode != 0o600:
                bad.append("%s: file %04o" % (p, mode))
            elif stat.S_ISSOCK(st.st_mode) and mode & 0o077:
                bad.append("%s: socket %04o" % (p, mode))
            elif stat.S_ISLNK(st.st_mode):
                bad.append("%s: a symlink" % p)
    return bad


def case_dirs(e):
    base = ["--socket", os.path.join(e.tmp, "x.sock"), "--snapshot-dir", e.tmp]
    shm = "/dev/shm/halite-files-%d" % os.getpid()
    subprocess.run(NOBODY + ["mkdir", shm], check=True)
    try:
        rc, out = start_fails(base + ["--state-dir", os.path.join(e.tmp, "s1"), "--mem-dir", shm])
        check(rc == 1 and "uid 65534 (nobody)" in out and
              "chown %d %s && chmod 700 %s" % (os.geteuid(), shm, shm) in out,
              "a --mem-dir of nobody's: exit %d: %s" % (rc, out))
        log("  " + out.strip().splitlines()[-1])
    finally:
        os.rmdir(shm)
    s777 = os.path.join(e.tmp, "s777")
    os.mkdir(s777)
    os.chmod(s777, 0o777)
    rc, out = start_fails(base + ["--state-dir", s777, "--mem-dir", e.mem])
    check(rc == 1 and "mode 0777" in out and "chmod 700 %s" % s777 in out,
          "a --state-dir of mode 0777: exit %d: %s" % (rc, out))
    link = "/tmp/halite-files-link-%d" % os.getpid()
    subprocess.run(NOBODY + ["ln", "-s", e.tmp, link], check=True)
    try:
        rc, out = start_fails(base + ["--state-dir", link + "/s2", "--mem-dir", e.mem])
        check(rc == 1 and "symbolic link owned by uid 65534" in out,
              "a --state-dir through nobody's link: exit %d: %s" % (rc, out))
    finally:
        os.unlink(link)

    e.start("--hot-window-ms", "100")
    snap = e.snapshot()
    t = e.template(snap)
    ids = e.clones(t["id"], 2)
    for cid in ids:
        e.wait_state(cid, ("done",))
    time.sleep(1)  # the hot set written
    check(os.path.exists(os.path.join(e.state, "templates", t["id"] + ".hot")), "no hot set")
    rc, out = start_fails(["--socket", os.path.join(e.tmp, "second.sock"), "--state-dir",
                           e.state, "--mem-dir", e.mem, "--snapshot-dir", e.tmp])
    check(rc == 1 and "(pid %d)" % e.daemon.pid in out,
          "a second daemon on the state dir: exit %d, wanted 1 naming pid %d: %s" %
          (rc, e.daemon.pid, out))
    log("  " + out.strip().splitlines()[-1])
    stop_daemon(e)
    bad = walk_modes(e.state) + walk_modes(e.mem)
    check(not bad, "files and directories not the daemon's own:\n  " + "\n  ".join(bad))


CASES = {"snapdir": case_snapdir, "resave": case_resave, "unavailable": case_unavailable,
         "dirs": case_dirs}


def main():
    if not shutil.which("setpriv"):
        print("skip: no setpriv (util-linux) to act as user nobody")
        return 77
    return tc.run_cases(CASES, __doc__, "files-")


if __name__ == "__main__":
    sys.exit(main())
