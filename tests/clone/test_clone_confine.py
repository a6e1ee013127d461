#!/usr/bin/env python3
"""End-to-end tests of how halite-cloned confines the clones it starts (issue 24, D2).

  test_clone_confine.py CASE     CASE: synth-args, cgroup, oom, unwritable, qemu-args, qemu

- synth-args: a synthetic snapshot whose synth.args carries `--control
  /tmp/other.sock` (made by `halite-inspect import --meta` from a good
  snapshot's memory) is refused at POST /templates with 400 naming --control,
  and so are --anon and a bare path; a socket listening at /tmp/other.sock is
  untouched (same inode, still accepting). A good template's clone is exact.
  A template whose file is replaced by one recording --control is not loaded
  by a restarted daemon, which says why.
- cgroup: a clone with memory_max 256 MiB and cpu_max 0.5 runs in
  HIER/halite-cloned/CID (v2 where the unified hierarchy has the memory
  controller, else the v1 memory and cpu hierarchies): its pid is in
  cgroup.procs, the limits read back from the cgroup files are those asked,
  GET shows them; a template's memory_max is its clones' default; a bad
  value is 400; after a daemon restart and DELETE the cgroup directories are
  gone.
- oom: a clone of a 64 MiB template writing 48 MiB of it with memory_max 16 MiB
  is "failed" with the out-of-memory error naming 16 MiB (GET and its
  clone.json) within 30 s, its cgroup removed; a clone started at the same
  time without a limit finishes exact; /healthz 200.
- unwritable: the daemon in a mount namespace where every cgroup hierarchy is
  read-only: a clone without limits starts unconfined (cgroup ""), one with
  memory_max or cpu_max (or a template with one) is refused with 400 naming
  why, and --clone-memory-max makes the daemon refuse to start.
- qemu-args: the daemon refuses to start with a --qemu-system that is missing
  or not executable, a --clone-user that is root or unknown, a relative
  --qemu-dir (exit 2, the option named); a QEMU template's clone is spawned
  as `halite-qemu clone --qemu-binary QEMU --run-as USER --allow-dir DIR`
  from the daemon's options (a stand-in halite-qemu records its argv), not
  from anything the snapshot records.
- qemu: test_clone.py's qemu case with the daemon given --clone-user nobody
  and --qemu-dir: real QEMU clones run as confined. Skipped (77) until
  `halite-qemu clone --help` lists --qemu-binary (engineer D1's options), or
  without QEMU or the test guest.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_clone  # noqa: E402
import test_clone as tc  # noqa: E402
# run_cases() turns test_clone's Skip into exit 77: a class of our own would be a failure.
from test_clone import (INSPECT, Skip, check, log)  # noqa: E402

OTHER_SOCK = "/tmp/other.sock"


def hierarchy():
    """(version, memory dir, cpu dir) where the daemon puts clones' cgroups."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [l.split(" - ") for l in f.read().splitlines()]
    except OSError:
        return (0, None, None)
    v2 = mem1 = cpu1 = None
    for pre, post in mounts:
        pf, sf = pre.split(), post.split()
        if pf[3] != "/":
            continue
        if sf[0] == "cgroup2" and not v2:
            v2 = pf[4]
        elif sf[0] == "cgroup" and "memory" in sf[2].split(",") and not mem1:
            mem1 = pf[4]
        elif sf[0] == "cgroup" and "cpu" in sf[2].split(",") and not cpu1:
            cpu1 = pf[4]
    if v2:
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                if "memory" in f.read().split():
                    return (2, v2, v2)
        except OSError:
            pass
    return (1, mem1, cpu1) if mem1 else (0, None, None)


def read(path):
    with open(path) as f:
        return f.read().strip()


def import_with_args(e, snap, name, args):
    """A copy of @snap's memory as a snapshot whose synth.args is @args."""
    img = snap + ".img"
    e.extract(snap)
    out = os.path.join(e.tmp, name)
    subprocess.run([INSPECT, "import", "--region", "pc.ram=" + img, "-o", out, "--no-sync",
                    "--meta", "synth.args=" + args], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    return out


def case_synth_args(e):
    try:
        os.unlink(OTHER_SOCK)
    except FileNotFoundError:
        pass
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(OTHER_SOCK)
    ls.listen(8)
    try:
        ino = os.stat(OTHER_SOCK).st_ino
        e.start()
        snap = e.snapshot()
        want = e.extract(snap)
        good = e.template(snap)
        args = good["synth_args"]
        check("--mem 64" in args, "the good template's synth_args: %r" % args)
        for extra, word in (("--control " + OTHER_SOCK, "--control"), ("--anon", "--anon"),
                            ("/tmp/x.img", "/tmp/x.img"), ("--mem-offset 0", "--mem-offset")):
            bad = import_with_args(e, snap, "bad.hlt", args + " " + extra)
            st, j = e.req("POST", "/templates", {"snapshot": bad})
            check(st == 400, "synth.args with %r: POST /templates %d, wanted 400: %s" % (extra, st, j))
            check(("'%s'" % word) in j.get("error", ""), "the 400 does not name %s: %s" % (word, j))
            if st == 201:  # the old daemon: what the clone does to the other socket
                e.clones(j["id"], 1)
        _, lst = e.req("GET", "/templates")
        check(len(lst["templates"]) == 1, "templates after the refusals: %s" % lst)
        # A value of the wrong shape is refused as well.
        bad = import_with_args(e, snap, "bad.hlt", args.replace("--seed ", "--seed /x"))
        st, j = e.req("POST", "/templates", {"snapshot": bad})
        check(st == 400 and "--seed" in j.get("error", ""), "--seed /x...: %d %s" % (st, j))
        # The other service's socket: the same file, still accepting.
        check(os.stat(OTHER_SOCK).st_ino == ino, "%s was replaced" % OTHER_SOCK)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(5)
        c.connect(OTHER_SOCK)
        ls.settimeout(5)
        a, _ = ls.accept()
        a.close()
        c.close()
        # The good template still clones exactly.
        cid = e.clones(good["id"], 1, pattern="random")[0]
        e.wait_state(cid, ("done",))
        e.check_exact(cid, want)
        # At reload too: a template whose file now records --control is not loaded
        # (listed unavailable, naming the word: records survive, docs/security.md).
        other = os.path.join(e.tmp, "other.hlt")
        shutil.copy(snap, other)
        t2 = e.template(other)
        bad = import_with_args(e, snap, "bad.hlt", args + " --control " + OTHER_SOCK)
        os.replace(bad, other)
        e.kill_daemon()
        e.start()
        _, lst = e.req("GET", "/templates")
        states = {t["id"]: (t.get("state"), t.get("error", "")) for t in lst["templates"]}
        check(states.get(good["id"], ("",))[0] == "ready" and
              states.get(t2["id"], ("",))[0] == "unavailable" and
              "'--control'" in states[t2["id"]][1] and len(states) == 2,
              "templates after the reload: %s" % lst)
        check(re.search(r"template %s .*unavailable: .*'--control'" % t2["id"], e.log_text()),
              "the daemon's log does not say why %s was not loaded" % t2["id"])
        check(os.stat(OTHER_SOCK).st_ino == ino, "%s was replaced" % OTHER_SOCK)
    finally:
        ls.close()
        try:
            os.unlink(OTHER_SOCK)
        except FileNotFoundError:
            pass


def need_cgroups():
    ver, mem, cpu = hierarchy()
    if not ver or not mem or not os.access(mem, os.W_OK):
        raise Skip("no writable cgroup hierarchy with the memory controller")
    return ver, mem, cpu


def case_cgroup(e):
    ver, mem, cpu = need_cgroups()
    if ver == 1 and not cpu:
        raise Skip("no cgroup v1 cpu hierarchy")
    e.start()
    snap = e.snapshot()
    t = e.template(snap)
    for body, words in (({"memory_max": -1}, "memory_max"), ({"memory_max": "1G"}, "memory_max"),
                        ({"cpu_max": 0}, "cpu_max"), ({"cpu_max": "half"}, "cpu_max")):
        body["count"] = 1
        st, j = e.req("POST", "/templates/%s/clones" % t["id"], body)
        check(st == 400 and words in j.get("error", ""), "%s: %d %s" % (body, st, j))
    cid = e.clones(t["id"], 1, memory_max=256 << 20, cpu_max=0.5)[0]
    c = e.clone(cid)
    pid = c["pid"]
    mdir = os.path.join(mem, "halite-cloned", cid)
    cdir = os.path.join(cpu, "halite-cloned", cid)
    check(c.get("memory_max") == 256 << 20 and c.get("cpu_max") == 0.5,
          "GET shows memory_max %s, cpu_max %s" % (c.get("memory_max"), c.get("cpu_max")))
    check(c.get("cgroup") == mdir, "GET shows cgroup %r, wanted %r" % (c.get("cgroup"), mdir))
    for d in {mdir, cdir}:
        procs = [int(x) for x in read(os.path.join(d, "cgroup.procs")).split()]
        check(pid in procs, "pid %d not in %s/cgroup.procs: %s" % (pid, d, procs))
    if ver == 2:
        check(read(os.path.join(mdir, "memory.max")) == str(256 << 20), "memory.max")
        check(read(os.path.join(mdir, "cpu.max")) == "50000 100000",
              "cpu.max: %s" % read(os.path.join(mdir, "cpu.max")))
        if os.path.exists(os.path.join(mdir, "memory.swap.max")):
            check(read(os.path.join(mdir, "memory.swap.max")) == "0", "memory.swap.max")
    else:
        got = int(read(os.path.join(mdir, "memory.limit_in_bytes")))
        check(got == 256 << 20, "memory.limit_in_bytes %d, wanted %d" % (got, 256 << 20))
        if os.path.exists(os.path.join(mdir, "memory.memsw.limit_in_bytes")):
            got = int(read(os.path.join(mdir, "memory.memsw.limit_in_bytes")))
            check(got == 256 << 20, "memory.memsw.limit_in_bytes %d" % got)
        check(read(os.path.join(cdir, "cpu.cfs_quota_us")) == "50000", "cpu.cfs_quota_us: %s"
              % read(os.path.join(cdir, "cpu.cfs_quota_us")))
        check(read(os.path.join(cdir, "cpu.cfs_period_us")) == "100000", "cpu.cfs_period_us")
    e.wait_state(cid, ("done",))
    # A template's limit is its clones' default.
    t2 = e.ok("POST", "/templates", {"snapshot": snap, "memory_max": 128 << 20, "cpu_max": 1.5},
              201)
    cid2 = e.clones(t2["id"], 1)[0]
    c2 = e.clone(cid2)
    check(c2.get("memory_max") == 128 << 20 and c2.get("cpu_max") == 1.5,
          "the template's limits not applied: %s %s" % (c2.get("memory_max"), c2.get("cpu_max")))
    mdir2 = os.path.join(mem, "halite-cloned", cid2)
    key = "memory.max" if ver == 2 else "memory.limit_in_bytes"
    check(int(read(os.path.join(mdir2, key))) == 128 << 20, "%s of %s" % (key, cid2))
    # A restarted daemon finds them in their cgroups, and DELETE (of clones not
    # its children any more) still removes the cgroups.
    e.kill_daemon()
    e.start()
    c = e.clone(cid)
    check(c["cgroup"] == mdir and c["state"] in ("running", "done"),
          "after a restart: %s" % c)
    for i in (cid, cid2):
        e.ok("DELETE", "/clones/%s" % i)
    for d in (mdir, cdir, mdir2, os.path.join(cpu, "halite-cloned", cid2)):
        check(not os.path.exists(d), "%s still there after DELETE" % d)


def case_oom(e):
    ver, mem, _ = need_cgroups()
    e.start()
    # A clone writes its vCPUs' working sets: 2 x 24 MiB of 64, well past 16 MiB.
    snap = e.snapshot("t.hlt", "--ws", "24")
    want = e.extract(snap)
    t = e.template(snap, hotset=False)
    check(" --ws 24 " in t["synth_args"], "the template's synth_args: %s" % t["synth_args"])
    out = {}

    def start(name, **opts):
        try:
            out[name] = e.clones(t["id"], 1, **opts)[0]
        except Exception as x:  # noqa: BLE001: reported below
            out[name] = x

    ths = [threading.Thread(target=start, args=("a",), kwargs={"write_pct": 100,
                                                              "memory_max": 16 << 20}),
           threading.Thread(target=start, args=("b",), kwargs={"pattern": "random"})]
    t0 = time.time()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    for k in ("a", "b"):
        check(isinstance(out.get(k), str), "clone %s did not start: %s" % (k, out.get(k)))
    a, b = out["a"], out["b"]
    # "done" (every page served) may come before the kill: wait for the process's end
    c = e.wait_state(a, ("failed", "exited"), timeout=30)
    check(time.time() - t0 < 30 + 5, "the limited clone took %.0f s" % (time.time() - t0))
    want_err = "out of memory: the clone exceeded its memory limit of 16 MiB (memory_max)"
    check(c["state"] == "failed" and c["error"] == want_err,
          "the limited clone: state %s, error %r" % (c["state"], c["error"]))
    with open(os.path.join(e.state, "clones", a, "clone.json")) as f:
        rec = json.load(f)
    check(rec.get("state") == "failed" and rec.get("error") == want_err,
          "its clone.json: %s" % rec)
    check(not os.path.exists(os.path.join(mem, "halite-cloned", a)),
          "the failed clone's cgroup is still there")
    e.wait_state(b, ("done",))
    e.check_exact(b, want)
    st, _ = e.req("GET", "/healthz")
    check(st == 200, "/healthz %d after the out-of-memory kill" % st)
    e.ok("DELETE", "/clones/%s" % a)


def case_unwritable(e):
    if not shutil.which("unshare"):
        raise Skip("no unshare(1)")
    wrapper = os.path.join(e.tmp, "cloned-ro-cgroups")
    with open(wrapper, "w") as f:
        f.write("""#!/bin/sh
# halite-cloned with every cgroup mount read-only, in a mount namespace of its own
exec unshare --mount --propagation private sh -c '
for m in $(grep -E " - cgroup2? " /proc/self/mountinfo | cut -d" " -f5); do
    mount -o remount,bind,ro "$m" || exit 99
done
exec "$0" "$@"' %s "$@"
""" % test_clone.CLONED)
    os.chmod(wrapper, 0o755)
    real = test_clone.CLONED
    test_clone.CLONED = wrapper
    try:
        e.start()
        snap = e.snapshot()
        t = e.template(snap)
        cid = e.clones(t["id"], 1)[0]
        c = e.wait_state(cid, ("done",))
        check(c["cgroup"] == "" and c["memory_max"] == 0, "an unconfined clone: %s" % c)
        for body in ({"count": 1, "memory_max": 64 << 20}, {"count": 1, "cpu_max": 0.5}):
            st, j = e.req("POST", "/templates/%s/clones" % t["id"], body)
            field = "memory_max" if "memory_max" in body else "cpu_max"
            check(st == 400 and j.get("error", "").startswith(field + " cannot be applied: no "
                                                              "writable cgroup"),
                  "%s without a writable cgroup: %d %s" % (body, st, j))
        st, j = e.req("POST", "/templates", {"snapshot": snap, "memory_max": 64 << 20})
        check(st == 400 and "memory_max cannot be applied" in j.get("error", ""),
              "a template with memory_max: %d %s" % (st, j))
        _, lst = e.req("GET", "/clones")
        check(len(lst["clones"]) == 1, "clones after the refusals: %s" % lst)
        e.kill_daemon()
        p = subprocess.run([wrapper, "--socket", e.sock + "2", "--state-dir", e.state,
                            "--mem-dir", e.mem, "--clone-memory-max", "64M"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        check(p.returncode == 1 and "memory_max cannot be applied" in p.stdout,
              "--clone-memory-max without a writable cgroup: exit %d: %s" % (p.returncode, p.stdout))
    finally:
        test_clone.CLONED = real


def case_qemu_args(e):
    base = [test_clone.CLONED, "--socket", e.sock, "--state-dir", e.state, "--mem-dir", e.mem]
    notexec = os.path.join(e.tmp, "not-exec")
    with open(notexec, "w") as f:
        f.write("#!/bin/sh\n")
    for args, words in ((["--qemu-system", "/nonexistent/qemu"], "--qemu-system /nonexistent/qemu"),
                        (["--qemu-system", notexec], "not an executable file"),
                        (["--clone-user", "root"], "uid 0 is refused"),
                        (["--clone-user", "no-such-user-h24"], "no such user"),
                        (["--qemu-dir", "relative/dir"], "not an absolute path")):
        p = subprocess.run(base + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        check(p.returncode == 2 and words in p.stdout,
              "%s: exit %d, wanted 2 naming %r: %s" % (args, p.returncode, words, p.stdout))
        check(not os.path.exists(e.sock), "%s: the socket was bound" % args)
    # A stand-in halite-qemu records its arguments and fails; a stand-in QEMU.
    argv_file = os.path.join(e.tmp, "argv")
    fake = os.path.join(e.tmp, "fake-halite-qemu")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > %s\nexit 3\n" % argv_file)
    qsys = os.path.join(e.tmp, "bin", "qemu-system-x86_64")
    os.makedirs(os.path.dirname(qsys))
    with open(qsys, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(fake, 0o755)
    os.chmod(qsys, 0o755)
    kdir = os.path.join(e.tmp, "kernels")
    os.makedirs(kdir)
    e.start("--qemu-bin", fake, "--qemu-system", qsys, "--clone-user", "nobody",
            "--qemu-dir", kdir, "--qemu-dir", "/usr/share")
    # A QEMU snapshot (metadata qemu.*) that names a binary of its own.
    synth = e.snapshot()
    img = synth + ".img"
    e.extract(synth)
    snap = os.path.join(e.tmp, "q.hlt")
    subprocess.run([INSPECT, "import", "--region", "pc.ram=" + img, "-o", snap, "--no-sync",
                    "--meta", "qemu.binary=/tmp/evil-qemu",
                    "--meta", "qemu.cmdline=/tmp/evil-qemu -m 64"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    t = e.template(snap)
    check(t["kind"] == "qemu", "the template is of kind qemu: %s" % t)
    st, j = e.req("POST", "/templates/%s/clones" % t["id"], {"count": 1})
    check(st == 500, "the stand-in halite-qemu fails: %d %s" % (st, j))
    with open(argv_file) as f:
        argv = f.read().split("\n")[:-1]
    log("  halite-qemu %s" % " ".join(argv))
    check(argv[0] == "clone", "argv: %s" % argv)

    def after(opt):
        vals = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == opt]
        return vals
    check(after("--qemu-binary") == [qsys], "--qemu-binary %s, wanted [%s]" % (after("--qemu-binary"), qsys))
    check(after("--run-as") == ["nobody"], "--run-as %s" % after("--run-as"))
    check(after("--allow-dir") == [kdir, "/usr/share"], "--allow-dir %s" % after("--allow-dir"))
    check(not any("evil" in a for a in argv), "the snapshot's binary is on the command line: %s" % argv)
    # The snapshot the daemon opened once, as its descriptor 3 (never re-read by path).
    check(argv[-1] == "/proc/self/fd/3", "the snapshot last, as /proc/self/fd/3: %s" % argv)


def case_qemu(e):
    qbin = test_clone.QEMU_BIN
    if not qbin:
        raise Skip("no halite-qemu")
    p = subprocess.run([qbin, "clone", "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    if "--qemu-binary" not in p.stdout:
        raise Skip("halite-qemu clone has no --qemu-binary yet (engineer D1's options): "
                   "the daemon's QEMU clones need it")
    start = e.start
    # the guest's kernel and initrd come from the image directory
    dirs = ["--qemu-dir", os.path.join(test_clone.hg.ROOT, "build", "guest-image")]

    def confined_start(*args):
        start(*(list(args) + ["--clone-user", "nobody"] + dirs))
    e.start = confined_start
    test_clone.case_qemu(e)


CASES = {"synth-args": case_synth_args, "cgroup": case_cgroup, "oom": case_oom,
         "unwritable": case_unwritable,
         "qemu-args": case_qemu_args, "qemu": case_qemu}


def teardown(e):
    """The case's daemon and processes, then a failed case's cgroups (the
    daemon removes its own clones')."""
    cdir = os.path.join(e.state, "clones")
    cids = os.listdir(cdir) if os.path.isdir(cdir) else []
    e.cleanup()
    _, mem, cpu = hierarchy()
    for cid in cids:
        for d in {mem, cpu} - {None}:
            for _ in range(50):
                try:
                    os.rmdir(os.path.join(d, "halite-cloned", cid))
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
                    continue
                break


def main():
    return tc.run_cases(CASES, __doc__, "confine-", teardown=teardown)


if __name__ == "__main__":
    sys.exit(main())
