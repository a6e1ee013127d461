#!/usr/bin/env python3
"""halite-cloned with templates read from an object store (issue 26).

  test_clone_s3.py CASE    CASE: template, refuse, qemu, qemu_disks

Run under tests/s3/run_with_store.sh: a real S3 store (radosgw) is started and
its AWS_ENDPOINT_URL, keys, region and HALITE_TEST_BUCKET exported; without them
the case skips (77).
- template: a synthetic snapshot pushed (halite-inspect push) to
  s3://BUCKET/cloned/t.hlt; a daemon with --s3-allow BUCKET/cloned/ takes it by
  URL; 2 clones are exact; GET /templates/ID's "store" and the metrics agree,
  and every locality block came from the store once (misses == puts == LBs,
  no hit, at most one request per LB besides the open's); the host's LB cache is
  STATE/lbcache, 0700, its files 0600. The template deleted and the daemon
  restarted on the same state: the same URL again takes every LB from the cache
  (hits == LBs, no miss, no put, only the open's 2-4 requests), and a clone is exact. A
  local template's "store" is null.
- refuse: without --s3-allow an s3:// snapshot is refused naming the option;
  with one, another bucket, a key outside its prefix, a bad bucket name and a
  QEMU guest's snapshot that records disks pushed without them (no manifest
  in the store) are refused, each with its status and message (the same snapshot
  without disks is taken), and a store that does not
  answer is 502 naming the request; an unknown --cache-size and a
  relative --cache-dir stop the daemon at start (exit 2).
- qemu: the QEMU test guest (no disk) saved, pushed and its file removed; a
  template by URL; 2 clones each find the snapshot's digest from inside the
  guest. Each clone's descriptor 3 is the daemon's memfd: 0600, sealed
  (not writable), the object's size but holding under a quarter of it (no
  guest RAM), held by no QEMU; neither the clone nor its QEMU has AWS_*,
  HALITE_S3_* or HALITE_CACHE_* in its environment. Every LB came from the
  store once. A restarted daemon starts another exact clone. Skipped (77)
  without QEMU or the guest image.
- qemu_disks: the QEMU test guest with a qcow2 disk saved (its disk frozen),
  pushed with the disk, and the snapshot, its frozen image and the source's
  overlay deleted: only the store has them (before that, halite-qemu clone
  by hand refuses a --disk-copies directory others may write, and one without
  the disk's copy, naming it). A template by URL brings the disk
  into STATE/lbcache/disks/<uuid>/0.qcow2 (0600, directories 0700, the
  pushed SHA-256); its JSON says it came from the store, the pushed bytes in
  exactly the manifest's HEAD and GET and the disk's HEAD and GETs. 2 clones:
  each finds the snapshot's digest and a disk that agrees with its memory
  (disklog), each on its own overlay whose backing image is the cached copy,
  which their writes leave unchanged. The disk's object then deleted from
  the store and the daemon restarted: the template reopens on the cached
  copy (from "cache", 0 bytes, the manifest's two requests only) and a third
  clone agrees.
"""
import json
import os
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_clone as tc  # noqa: E402
from test_clone import CLONED, INSPECT, Fail, check, log, stop_daemon  # noqa: E402

BUCKET = os.environ.get("HALITE_TEST_BUCKET")
META_SET = os.environ.get("HALITE_CLONE_META_SET_BIN")


def push(e, snap, key):
    url = "s3://%s/%s" % (BUCKET, key)
    subprocess.run([INSPECT, "push", snap, url], check=True, stdout=subprocess.DEVNULL,
                   timeout=120)
    return url


def refused(e, snapshot, want, words):
    st, j = e.req("POST", "/templates", {"snapshot": snapshot, "hotset": False})
    check(st == want, "POST %s: %s, wanted %d: %s" % (snapshot, st, want, j))
    check(words in j.get("error", ""), "POST %s: error %r does not say %r" % (snapshot, j, words))
    log("  %s -> %d %s" % (snapshot, st, j["error"]))


def wait_complete(e, tid, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = e.ok("GET", "/templates/" + tid)
        if t["stats"]["complete"]:
            return t
        check(not t["stats"]["error"], "template %s: %s" % (tid, t["stats"]["error"]))
        time.sleep(0.1)
    raise Fail("template %s not complete after %d s" % (tid, timeout))


def store_metrics(e, tid):
    st, text = e.req("GET", "/metrics")
    check(st == 200, "GET /metrics: %s" % st)
    m = tc.parse_metrics(text)
    lab = (("template", tid),)
    out = {}
    for k in ("requests", "bytes", "cache_hits", "cache_misses", "cache_puts"):
        name = "halite_template_store_%s_total" % k
        check((name, lab) in m, "metrics lack %s{template=%s}" % (name, tid))
        out[k] = m[(name, lab)]
    return out


def case_template(e):
    e.start("--s3-allow", BUCKET + "/cloned/")
    snap = e.snapshot()
    want = e.extract(snap)
    url = push(e, snap, "cloned/t.hlt")

    # A local template: no store.
    local = e.template(snap, hotset=False)
    check(e.ok("GET", "/templates/" + local["id"])["store"] is None, "a local template's store is not null")
    e.ok("DELETE", "/templates/" + local["id"])

    t = e.template(url, hotset=False)
    check(t["snapshot"] == url and t["kind"] == "synthetic", "template: %s" % t)
    ids = e.clones(t["id"], 2, pattern="random")
    for cid in ids:
        e.wait_state(cid, ("done",))
        e.check_exact(cid, want)
        # The store's credentials and the cache are the daemon's: not in a clone's environment.
        pid = e.ok("GET", "/clones/" + cid)["pid"]
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = [v.split(b"=", 1)[0].decode() for v in f.read().split(b"\0") if v]
        leaked = [k for k in env if k.startswith(("AWS_", "HALITE_S3_", "HALITE_CACHE_"))]
        check(not leaked and "PATH" in env, "clone %s's environment: %s" % (cid, leaked or env))
    show = wait_complete(e, t["id"])
    s, lbs = show["store"], show["stats"]["lb_total"]
    log("  first: %d LBs, store %s" % (lbs, s))
    check(s is not None and s["cached"], "the template's store: %s" % s)
    check(lbs > 0 and s["cache_hits"] == 0 and s["cache_misses"] == lbs and s["cache_puts"] == lbs,
          "every LB of %d from the store once and kept: %s" % (lbs, s))
    # GETs of LBs that follow each other in the file may be one request: at most one per LB.
    check(s["requests"] <= 4 + lbs, "%d requests to the store for %d LBs: %s" % (s["requests"], lbs, s))
    m = store_metrics(e, t["id"])
    for k, v in m.items():
        check(v == s[k], "metrics %s %s != GET's %s" % (k, v, s[k]))

    cache = os.path.join(e.state, "lbcache")
    st = os.stat(cache)
    check(stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700,
          "%s: mode %o" % (cache, stat.S_IMODE(st.st_mode)))
    for root, _, files in os.walk(cache):
        for f in files:
            mode = stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode)
            check(mode & 0o077 == 0, "%s: mode %o" % (os.path.join(root, f), mode))

    # A restarted daemon, the template made again: every LB from the host's cache.
    for cid in ids:
        e.ok("DELETE", "/clones/" + cid)
    e.ok("DELETE", "/templates/" + t["id"])
    stop_daemon(e)
    e.start()
    t = e.template(url, hotset=False)
    cid = e.clones(t["id"], 1, pattern="random")[0]
    e.wait_state(cid, ("done",))
    e.check_exact(cid, want)
    show = wait_complete(e, t["id"])
    s = show["store"]
    log("  again: %d LBs, store %s" % (show["stats"]["lb_total"], s))
    check(show["stats"]["lb_total"] == lbs, "LBs: %d, were %d" % (show["stats"]["lb_total"], lbs))
    check(s["cache_hits"] == lbs and s["cache_misses"] == 0 and s["cache_puts"] == 0,
          "after the restart, every LB from the cache: %s" % s)
    # The open's HEAD and two or three GETs (header, tail, sections) only.
    check(2 <= s["requests"] <= 4, "after the restart, %d requests to the store, want the "
          "open's only" % s["requests"])
    m = store_metrics(e, t["id"])
    check(m["requests"] == s["requests"] and m["cache_hits"] == lbs and m["cache_misses"] == 0,
          "metrics after the restart: %s" % m)


def case_refuse(e):
    e.start()
    url = "s3://%s/cloned/t.hlt" % BUCKET
    refused(e, url, 403, "--s3-allow BUCKET[/PREFIX]")
    stop_daemon(e)
    # "cloned" and "cloned/" alike: a folder, not a text prefix of keys.
    e.start("--s3-allow", BUCKET + "/cloned", "--s3-allow", "another-bucket")
    refused(e, "s3://%s/cloned-old/t.hlt" % BUCKET, 403, "its --s3-allow options")
    # A dot segment could be resolved on the way ("cloned/../x" read as "x"): refused.
    refused(e, "s3://%s/cloned/../elsewhere/t.hlt" % BUCKET, 400, "a '..' segment")
    refused(e, "s3://not-allowed-bucket/cloned/t.hlt", 403,
            "is not in an object-store location this daemon allows (its --s3-allow options)")
    refused(e, "s3://%s/elsewhere/t.hlt" % BUCKET, 403, "its --s3-allow options")
    refused(e, "s3://Bad_Bucket/cloned/t.hlt", 400, "bad bucket name")
    refused(e, "s3://%s" % BUCKET, 400, "names no key")
    refused(e, "file:///etc/passwd", 400, "an absolute path or an s3://BUCKET/KEY URL")
    # A QEMU guest's snapshot (qemu.* metadata, no synth.args) is taken; one that
    # records disks is refused when the store holds none beside it.
    img, plain, qsnap, dsnap = (os.path.join(e.tmp, n) for n in
                                ("q.img", "q-plain.hlt", "q.hlt", "qd.hlt"))
    with open(img, "wb") as f:
        f.write(os.urandom(4 << 20))
    subprocess.run([INSPECT, "import", "--no-sync", img, "--region", "ram", "-o", plain,
                    "--codec", "none"], check=True, stdout=subprocess.DEVNULL, timeout=60)
    for src, out, key, value in ((plain, qsnap, "qemu.cmdline", b"-M q35"),
                                 (qsnap, dsnap, "qemu.disks", b'[{"device": "drive0"}]')):
        with open(img, "wb") as f:
            f.write(value)
        r = subprocess.run([META_SET, src, out, key, img], capture_output=True, text=True,
                           timeout=60)
        check(r.returncode == 0, "clone_meta_set: %s" % r)
    t = e.template(push(e, qsnap, "cloned/q.hlt"), hotset=False)
    check(t["kind"] == "qemu", "a QEMU guest's object without disks: %s" % t)
    e.ok("DELETE", "/templates/" + t["id"])
    qd = push(e, dsnap, "cloned/qd.hlt")
    refused(e, qd, 400, "is a QEMU guest's with disks (qemu.disks): its disk images do not "
            "travel with the object")
    refused(e, qd, 400, "push it with its disks")
    # An allowed key that is not there: the store's answer, named.
    refused(e, "s3://%s/cloned/missing.hlt" % BUCKET, 400, "s3://%s/cloned/missing.hlt" % BUCKET)
    stop_daemon(e)
    # A store that does not answer (nothing listens on port 9): 502, the endpoint named.
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"
    try:
        e.start()
    finally:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    refused(e, url, 502, "HEAD http://127.0.0.1:9/")
    stop_daemon(e)
    for args, words in ((["--cache-size", "lots"], "--cache-size 'lots': want bytes"),
                        (["--cache-size", "0"], "--cache-size '0'"),
                        (["--cache-dir", "rel/dir"], "must be absolute paths"),
                        (["--s3-allow", "A_B"], "--s3-allow A_B: want BUCKET or BUCKET/PREFIX")):
        r = subprocess.run([CLONED, "--socket", os.path.join(e.tmp, "x.sock"), "--state-dir",
                            e.state, "--mem-dir", e.mem] + args, capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 2 and words in r.stderr, "%s: exit %d, %r" % (args, r.returncode, r.stderr))
        log("  %s -> %s" % (" ".join(args), r.stderr.strip()))


def memfd_of(pid, name):
    """The descriptors of @pid that are the memfd @name: [(fd, its stat)]."""
    out = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("/memfd:" + name):
                out.append((int(fd), os.stat("/proc/%d/fd/%s" % (pid, fd))))
        except OSError:
            pass
    return out


def save_guest(e, src, snap, disk=False):
    """@src booted and saved to @snap (halite-qemu save), then quit: its verifier's
    digest (rewrites off, so it stays put across the snapshot) and the save's JSON."""
    src.boot()
    e.pids.add(src.pid)
    src.wait_ready()
    if disk:
        d_disk, _, _, ok = src.disklog()
        check(ok and d_disk > 0, "the source guest counts on its disk (%d)" % d_disk)
    src.rewrites(False)
    d0, _, ok0 = src.digest()
    check(ok0, "source guest digest %s as expected" % d0)
    p = subprocess.run([tc.QEMU_BIN, "save", "--qmp", src.qmp_path, "--json", "-q", snap],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p.returncode == 0, "halite-qemu save: exit %d: %s" % (p.returncode, p.stderr[-2000:]))
    src.qmp().cmd("quit")
    src.proc.wait(timeout=30)
    return d0, json.loads(p.stdout)


def case_qemu(e):
    if not tc.hg.qemu_available() or not tc.hg.image_ready() or not tc.QEMU_BIN:
        raise tc.Skip("no qemu-system-x86_64, test guest (scripts/make-guest.sh) or halite-qemu")
    snap = os.path.join(e.tmp, "guest.hlt")
    d0, _ = save_guest(e, tc.hg.Guest(e.tmp, "source"), snap)
    size = os.path.getsize(snap)
    url = push(e, snap, "cloned/guest.hlt")
    os.unlink(snap)  # the clones can only have it from the store
    log("  saved the test guest (digest %s), %d MiB pushed" % (d0, size >> 20))

    e.start("--qemu-bin", tc.QEMU_BIN, "--s3-allow", BUCKET + "/cloned/")
    t0 = time.time()
    t = e.template(url, hotset=False)
    check(t["kind"] == "qemu" and t["snapshot"] == url, "the template: %s" % t)
    log("  the template from the store, its clones' snapshot made: %.2f s" % (time.time() - t0))
    ids = e.clones(t["id"], 2)
    guests = []
    for cid in ids:
        c = e.wait_state(cid, ("running", "done"), timeout=120)
        e.pids.add(c["qemu_pid"])
        # Descriptor 3 of the clone: the daemon's sealed memfd, the object's size, with
        # the guest RAM's LBs left out; QEMU holds none of it; no credentials.
        views = memfd_of(c["pid"], "halite-clone-snapshot")
        check(len(views) == 1 and views[0][0] == 3, "clone %s's descriptors: %s" % (cid, views))
        st = views[0][1]
        check(st.st_size == size and stat.S_IMODE(st.st_mode) == 0o600,
              "clone %s's snapshot: %d bytes, mode %o (the object has %d)" %
              (cid, st.st_size, stat.S_IMODE(st.st_mode), size))
        check(st.st_blocks * 512 < size // 4, "clone %s's snapshot holds %d of %d bytes: "
              "more than the sections" % (cid, st.st_blocks * 512, size))
        log("  clone %s: descriptor 3 holds %d KiB of the object's %d MiB" %
            (cid, st.st_blocks // 2, size >> 20))
        try:
            with open("/proc/%d/fd/3" % c["pid"], "r+b") as f:
                f.write(b"x")
            raise Fail("clone %s's snapshot is writable" % cid)
        except PermissionError:
            pass
        check(not memfd_of(c["qemu_pid"], "halite-clone-snapshot"),
              "clone %s's QEMU holds the snapshot" % cid)
        for pid in (c["pid"], c["qemu_pid"]):
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = [v.split(b"=", 1)[0].decode() for v in f.read().split(b"\0") if v]
            leaked = [k for k in env if k.startswith(("AWS_", "HALITE_S3_", "HALITE_CACHE_"))]
            check(not leaked, "clone %s (pid %d)'s environment: %s" % (cid, pid, leaked))
        g = tc.hg.Guest(e.tmp, cid)
        g.adopt(c["qemu_pid"])
        g.port = c["forwards"][0]["host_port"]
        g.console = c["serial"]
        g.qmp_path = c["qmp"]
        guests.append(g)
    for g in guests:
        d, up, ok = g.digest()
        check(ok and d == d0, "clone on port %d: the verifier's digest %s is the snapshot's %s"
              % (g.port, d, d0))
        check(g.status()["mismatches"] == "0", "clone on port %d: 0 mismatches" % g.port)
        log("  clone on port %d: digest %s, uptime %.1f s" % (g.port, d, up))
    show = wait_complete(e, t["id"], timeout=300)
    s, lbs = show["store"], show["stats"]["lb_total"]
    # The device RAM's LBs are read twice on the host (the clones' snapshot, the
    # template's fill), from the store once: the second read is a cache hit.
    check(s["cache_misses"] == lbs and s["cache_puts"] == lbs,
          "every LB from the store once (the clones' device RAM too): %s" % s)
    log("  the template: %d LBs from the store, %d read again from the host's cache" %
        (lbs, s["cache_hits"]))
    for cid in ids:
        c = e.wait_state(cid, ("done",), timeout=120)
        check(not c["error"], "clone %s done: %s" % (cid, c))
    # A restarted daemon makes its clones' snapshot again and starts one more.
    stop_daemon(e)
    e.start()
    cid = e.clones(t["id"], 1)[0]
    c = e.wait_state(cid, ("running", "done"), timeout=120)
    e.pids.add(c["qemu_pid"])
    g = tc.hg.Guest(e.tmp, cid)
    g.adopt(c["qemu_pid"])
    g.port, g.console, g.qmp_path = c["forwards"][0]["host_port"], c["serial"], c["qmp"]
    d, _, ok = g.digest()
    check(ok and d == d0, "after a restart, a clone's digest %s is the snapshot's %s" % (d, d0))
    for cid in ids + [cid]:
        e.ok("DELETE", "/clones/%s" % cid)


PART = 8 << 20  # halite_s3_download_fd()'s default range


def delete(url):
    """DELETE of @url (s3://BUCKET/KEY) with curl, which signs it (SigV4)."""
    env = os.environ
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time",
                        "60", "-X", "DELETE", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                        "--aws-sigv4", "aws:amz:%s:s3" % env["AWS_REGION"],
                        "--user", "%s:%s" % (env["AWS_ACCESS_KEY_ID"],
                                             env["AWS_SECRET_ACCESS_KEY"]),
                        "%s/%s" % (env["AWS_ENDPOINT_URL"], url[5:])],
                       stdout=subprocess.PIPE, text=True, timeout=90)
    check(p.returncode == 0 and p.stdout == "204", "DELETE %s: HTTP %s" % (url, p.stdout))


def disk_clone(e, cid, d0, at):
    """Clone @cid running: its guest (memory digest @d0, disk and memory agree,
    counting on from @at) and its overlay."""
    c = e.wait_state(cid, ("running", "done"), timeout=120)
    e.pids.add(c["qemu_pid"])
    g = tc.hg.Guest(e.tmp, cid)
    g.adopt(c["qemu_pid"])
    g.port, g.console, g.qmp_path = c["forwards"][0]["host_port"], c["serial"], c["qmp"]
    d, up, ok = g.digest()
    check(ok and d == d0, "clone %s: the verifier's digest %s is the snapshot's %s" % (cid, d, d0))
    check(g.status()["mismatches"] == "0", "clone %s: 0 mismatches" % cid)
    dk, mk, _, ok = g.disklog()
    check(ok and mk >= at, "clone %s: its disk's count %d agrees with its memory's %d, counting "
          "on from the snapshot's %d" % (cid, dk, mk, at))
    check(len(c["disks"]) == 1, "clone %s runs on one overlay: %s" % (cid, c["disks"]))
    log("  clone %s: digest %s, disk %d, uptime %.1f s, overlay %s" % (cid, d, dk, up,
                                                                      c["disks"][0]))
    return g, c["disks"][0]


def case_qemu_disks(e):
    if not tc.hg.qemu_available() or not tc.hg.image_ready() or not tc.QEMU_BIN:
        raise tc.Skip("no qemu-system-x86_64, test guest (scripts/make-guest.sh) or halite-qemu")
    image = os.path.join(e.tmp, "disk.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", image, "64M"], check=True,
                   timeout=60)
    snap = os.path.join(e.tmp, "guest.hlt")
    d0, saved = save_guest(e, tc.hg.Guest(e.tmp, "source").with_disk("drive", image), snap,
                           disk=True)
    saved = saved["disks"]
    check(len(saved) == 1 and saved[0]["frozen"], "the save froze %s: %s" % (image, saved))
    # What the frozen image held at the snapshot: disklog's count in its sector 0.
    out = os.path.join(e.tmp, "sector0")
    subprocess.run(["qemu-img", "dd", "-U", "-f", "qcow2", "-O", "raw", "bs=512", "count=1",
                    "if=" + image, "of=" + out], check=True, timeout=60)
    with open(out, "rb") as f:
        at = int(f.read(512).split(b"\n")[0].split()[1])
    url = "s3://%s/cloned/dguest.hlt" % BUCKET
    p = subprocess.run([INSPECT, "push", "--json", snap, url], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300,
                       env=dict(os.environ, TMPDIR=e.tmp))
    check(p.returncode == 0, "push %s: %s" % (url, p.stderr.strip()))
    pushed = json.loads(p.stdout)["disks"]
    check(len(pushed) == 1 and pushed[0]["index"] == 0 and pushed[0]["bytes"] > 0,
          "push uploaded the disk: %s" % pushed)
    # halite-qemu clone by hand: --disk-copies must be this user's directory, writable by
    # no one else, and hold a copy of every frozen disk (refused before QEMU starts).
    copies = os.path.join(e.tmp, "copies")
    os.mkdir(copies)
    for mode, words in ((0o777, "--disk-copies %s: must be this user's and writable by no one "
                         "else" % copies),
                        (0o700, "disk disk0: its copy %s/0.qcow2: No such file or directory" %
                         copies)):
        os.chmod(copies, mode)
        p = subprocess.run([tc.QEMU_BIN, "clone", "--mem-file", "/dev/null", "--control",
                            os.path.join(e.tmp, "byhand.sock"), "--allow-dir", "/",
                            "--disk-copies", copies, snap], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        check(p.returncode == 1 and words in p.stderr, "halite-qemu clone --disk-copies (mode "
              "%o): exit %d %r (wanted: %s)" % (mode, p.returncode, p.stderr[-1000:], words))
        log("  by hand, --disk-copies mode %o: %s" % (mode, p.stderr.strip()))

    # Only the store has the snapshot and its disk from now on.
    for f in (snap, image, saved[0]["overlay"]):
        os.unlink(f)
    log("  saved the test guest with its disk (digest %s, disk at %d), pushed %d disk bytes" %
        (d0, at, pushed[0]["bytes"]))

    e.start("--qemu-bin", tc.QEMU_BIN, "--s3-allow", BUCKET + "/cloned/")
    t0 = time.time()
    t = e.template(url, hotset=False)
    log("  the template from the store with its disk: %.2f s" % (time.time() - t0))
    show = e.ok("GET", "/templates/" + t["id"])
    disks = show["disks"]
    gets = (pushed[0]["bytes"] + PART - 1) // PART
    check(disks is not None and len(disks["images"]) == 1 and
          disks["images"][0]["index"] == 0 and disks["images"][0]["from"] == "store" and
          disks["images"][0]["bytes"] == pushed[0]["bytes"] and
          disks["requests"] == 2 + 1 + gets,
          "the template's disk came from the store: the manifest's HEAD and GET, the disk's "
          "HEAD and %d GETs: %s" % (gets, disks))
    log("  its disk from the store: %d bytes in %.3f s" % (disks["images"][0]["bytes"],
                                                           disks["images"][0]["seconds"]))
    cache = os.path.join(e.state, "lbcache")
    cached = os.path.join(cache, "disks", show["uuid"], "0.qcow2")
    check(stat.S_IMODE(os.stat(cached).st_mode) == 0o600 and
          all(stat.S_IMODE(os.stat(d).st_mode) == 0o700
              for d in (os.path.dirname(cached), os.path.join(cache, "disks"))),
          "the cached disk %s is 0600, its directories 0700" % cached)
    digest = tc.hg.sha256_file(cached)
    check(digest == pushed[0]["sha256"], "the cached disk is the pushed one (SHA-256)")

    ids = e.clones(t["id"], 2)
    guests, overlays = [], []
    for cid in ids:
        g, ov = disk_clone(e, cid, d0, at)
        guests.append(g)
        overlays.append(ov)
        info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", ov],
                                         stdout=subprocess.PIPE, check=True,
                                         timeout=60).stdout)
        check(info.get("full-backing-filename", info.get("backing-filename")) == cached,
              "clone %s's overlay %s lies on the cached copy: %s" %
              (cid, ov, info.get("backing-filename")))
    check(len(set(overlays)) == 2 and all(os.path.exists(o) for o in overlays),
          "each clone runs on its own overlay: %s" % overlays)
    for g in guests:
        g.check_console()
    check(tc.hg.sha256_file(cached) == digest, "the clones' writes left the cached copy unchanged")

    # The disk's object gone from the store: a daemon that asked for it would fail.
    delete(url + ".disks/0.qcow2")
    for cid in ids:
        e.ok("DELETE", "/clones/%s" % cid)
    stop_daemon(e)
    e.start()
    show = e.ok("GET", "/templates/" + t["id"])
    check(show["state"] == "ready", "after a restart the template reopened: %s" % show)
    disks = show["disks"]
    check(disks["images"][0]["from"] == "cache" and disks["images"][0]["bytes"] == 0 and
          disks["requests"] == 2,
          "after a restart, the cached disk: the manifest's HEAD and GET only, no disk "
          "request: %s" % disks)
    log("  after a restart, the cached disk checked in %.3f s" % disks["images"][0]["seconds"])
    cid = e.clones(t["id"], 1)[0]
    g, ov = disk_clone(e, cid, d0, at)
    check(ov not in overlays, "the third clone has an overlay of its own: %s" % ov)
    g.check_console()
    check(tc.hg.sha256_file(cached) == digest, "the cached copy is still unchanged")
    e.ok("DELETE", "/clones/%s" % cid)


CASES = {"template": case_template, "refuse": case_refuse, "qemu": case_qemu,
         "qemu_disks": case_qemu_disks}


def main():
    if not BUCKET or not os.environ.get("AWS_ENDPOINT_URL"):
        print("skip: no object store (run under tests/s3/run_with_store.sh)")
        return 77
    return tc.run_cases(CASES, __doc__, prefix="s3-")


if __name__ == "__main__":
    sys.exit(main())
