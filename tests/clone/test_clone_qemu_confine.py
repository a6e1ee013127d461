#!/usr/bin/env python3
"""A QEMU clone runs nothing its snapshot file names, and its QEMU is confined
(issue 24). End-to-end through halite-cloned with the QEMU test guest
(scripts/make-guest.sh); skipped (77) without QEMU, the image or root.

  test_clone_qemu_confine.py confine

- confine: the test guest (-netdev user with a host forward, -kernel and
  -initrd from the image directory) is saved by halite-qemu save while its
  verifier runs. Two files are crafted from the snapshot with the public
  reader and writer API (clone_meta_set), each with one metadata entry
  changed, as anyone who may write a snapshot can:
  (a) qemu.cmdline's binary is a script that writes a marker file. The
      template is made and a clone started: it runs --qemu-binary's QEMU
      (its /proc/PID/exe), the marker never appears. The same line with
      smb=/ on its -netdev: the clone request fails naming "smb=", and no
      QEMU was started (none has the template memory file mapped, no
      marker). halite-qemu clone run without --qemu-binary: the crafted
      binary is refused by name, the marker never appears.
  (b) that clone's QEMU, started with --run-as nobody: /proc/PID/status says
      Uid 65534 and Seccomp 2, none of its descriptors is the template
      memory file (its private mapping stays), the snapshot reached
      halite-qemu clone as /proc/self/fd/3, QEMU booted from /proc/self/fd/N
      (-kernel, -initrd opened beneath --allow-dir), and the verifier inside the
      guest finds the snapshot's digest.
The daemon is started with --qemu-system, --clone-user nobody and
--qemu-dir (the image directory): it passes halite-qemu clone
--qemu-binary, --run-as and --allow-dir, and the snapshot as its open
descriptor 3.
"""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_clone as tc  # noqa: E402
from test_clone import Skip, check, log, hg  # noqa: E402

META_SET = os.environ.get("HALITE_CLONE_META_SET_BIN")
QEMU_SYSTEM = shutil.which("qemu-system-x86_64")

EVIL = """#!/bin/sh
echo "$$ $*" >> {marker}
exec {qemu} "$@"
"""


def status_fields(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.split()
    return out


def qemu_fds(pid):
    d = "/proc/%d/fd" % pid
    out = []
    for n in os.listdir(d):
        try:
            out.append(os.readlink(os.path.join(d, n)))
        except OSError:
            pass
    return out


def mappers(path):
    """Pids with @path mapped."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/maps" % p) as f:
                if any(l.rstrip("\n").endswith(" " + path) for l in f):
                    out.append(int(p))
        except OSError:
            pass
    return out


def craft(snap, out, argv):
    val = out + ".cmdline"
    with open(val, "wb") as f:
        f.write(b"".join(a.encode() + b"\0" for a in argv))
    p = subprocess.run([META_SET, snap, out, "qemu.cmdline", val], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    check(p.returncode == 0, "clone_meta_set: %s" % p.stdout)


def case_confine(e):
    if not hg.qemu_available() or not hg.image_ready() or not tc.QEMU_BIN or not META_SET:
        raise Skip("no qemu-system-x86_64, test guest (scripts/make-guest.sh), halite-qemu or "
                   "clone_meta_set")
    image = os.path.realpath(os.path.join(hg.ROOT, "build", "guest-image"))
    marker = os.path.join(e.tmp, "MARKER")
    evil = os.path.join(e.tmp, "evil-qemu.sh")
    with open(evil, "w") as f:
        f.write(EVIL.format(marker=marker, qemu=QEMU_SYSTEM))
    os.chmod(evil, 0o755)

    # the daemon's options themselves: never root, QEMU an absolute executable
    for opts, want in ((["--run-as", "root"], "--run-as: QEMU would run as root (uid or gid 0); "
                        "name an unprivileged user: root"),
                       (["--run-as", "0"], "--run-as: QEMU would run as root (uid or gid 0); "
                        "name an unprivileged user: 0"),
                       (["--run-as", "no-such-user-x"], "--run-as: no such user: no-such-user-x"),
                       (["--qemu-binary", "qemu-system-x86_64"],
                        "--qemu-binary: an absolute path please: qemu-system-x86_64"),
                       (["--qemu-binary", evil + ".nx"],
                        "--qemu-binary: not an executable file: %s.nx" % evil)):
        p = subprocess.run([tc.QEMU_BIN, "clone", "--mem-file", "/dev/null", "--control",
                            os.path.join(e.tmp, "c.sock")] + opts + ["/nonexistent.hlt"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        check(p.returncode == 1 and p.stderr.strip() == "halite-qemu: clone: " + want,
              "halite-qemu clone %s: exit %d, %r (wanted %r)" % (" ".join(opts), p.returncode,
                                                                  p.stderr.strip(), want))

    src = hg.Guest(e.tmp, "source", netdev=True)
    src.boot()
    e.pids.add(src.pid)
    src.wait_ready()
    src.rewrites(False)
    d0, _, ok0 = src.digest()
    check(ok0, "source guest digest %s as expected" % d0)
    with open("/proc/%d/cmdline" % src.pid, "rb") as f:
        recorded = [a.decode() for a in f.read().split(b"\0")[:-1]]
    snap = os.path.join(e.tmp, "guest.hlt")
    p = subprocess.run([tc.QEMU_BIN, "save", "--qmp", src.qmp_path, "--json", "-q", snap],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p.returncode == 0, "halite-qemu save: exit %d: %s" % (p.returncode, p.stderr[-2000:]))
    q = src.qmp()
    q.cmd("quit")
    src.proc.wait(timeout=30)
    log("  saved the test guest (digest %s); recorded %s" % (d0, " ".join(recorded[:3])))

    evil_snap = os.path.join(e.tmp, "evil.hlt")
    craft(snap, evil_snap, [evil] + recorded[1:])
    smb = list(recorded)
    i = next(k for k, a in enumerate(smb) if a == "-netdev")
    smb[i + 1] += ",smb=/"
    smb_snap = os.path.join(e.tmp, "smb.hlt")
    craft(snap, smb_snap, smb)

    # The daemon's configuration decides QEMU's binary, user and boot files.
    e.start("--qemu-bin", tc.QEMU_BIN, "--qemu-system", QEMU_SYSTEM, "--clone-user", "nobody",
            "--qemu-dir", image)
    # (a) the recorded binary is never run
    t = e.template(evil_snap)
    check(t["kind"] == "qemu", "the crafted file is a qemu template: %s" % t)
    mem_file = os.path.join(e.mem, t["id"] + ".mem")
    ids = e.clones(t["id"], 1)
    c = e.wait_state(ids[0], ("running", "done"), timeout=120)
    qpid = c["qemu_pid"]
    e.pids.add(qpid)
    exe = os.readlink("/proc/%d/exe" % qpid)
    check(exe == os.path.realpath(QEMU_SYSTEM), "the clone's QEMU is %s, not %s" % (
        exe, QEMU_SYSTEM))
    check(not os.path.exists(marker), "the recorded binary ran: %s exists" % marker)
    log("  (a) the crafted binary did not run; the clone's QEMU is %s" % exe)

    # (b) QEMU as nobody, sandboxed, without the template memory file open
    st = status_fields(qpid)
    check(st["Uid"] == ["65534"] * 4 and st["Gid"] == ["65534"] * 4,
          "QEMU runs as nobody: Uid %s Gid %s" % (st["Uid"], st["Gid"]))
    check(st["Seccomp"] == ["2"], "QEMU is under a seccomp filter: Seccomp %s" % st["Seccomp"])
    fds = qemu_fds(qpid)
    check(mem_file not in fds, "QEMU holds a descriptor of the template memory file: %s" % fds)
    check(not any(f.endswith(".hlt") for f in fds), "QEMU holds the snapshot: %s" % fds)
    with open("/proc/%d/maps" % qpid) as f:
        check(any(l.split()[1].startswith("rw-p") and l.split()[-1] == mem_file
                  for l in f if len(l.split()) >= 6),
              "QEMU maps the template memory file privately")
    with open("/proc/%d/cmdline" % c["pid"], "rb") as f:
        hq_args = f.read().split(b"\0")
    check(b"/proc/self/fd/3" in hq_args, "halite-qemu clone read the snapshot through fd 3: %s"
          % hq_args)
    with open("/proc/%d/cmdline" % qpid, "rb") as f:
        qargs = [a.decode() for a in f.read().split(b"\0")]
    for opt in ("-kernel", "-initrd"):
        v = qargs[qargs.index(opt) + 1]
        check(v.startswith("/proc/self/fd/"), "QEMU's %s is %s, not the file opened beneath "
              "--allow-dir" % (opt, v))
    g = hg.Guest(e.tmp, ids[0])
    g.adopt(qpid)
    g.port = c["forwards"][0]["host_port"]
    g.console = c["serial"]
    d, up, ok = g.digest()
    check(ok and d == d0, "the clone's verifier digest %s is the snapshot's %s" % (d, d0))
    log("  (b) QEMU pid %d: Uid %s, Seccomp %s, %d descriptors, none the template's; digest %s"
        % (qpid, st["Uid"][0], st["Seccomp"][0], len(fds), d))
    e.ok("DELETE", "/clones/%s" % ids[0])

    # (a) a recorded line with smb=: refused, nothing spawned
    t2 = e.template(smb_snap)
    mem2 = os.path.join(e.mem, t2["id"] + ".mem")
    st_, j = e.req("POST", "/templates/%s/clones" % t2["id"], {"count": 1, "write_pct": 0})
    check(st_ == 500 and "smb=" in j.get("error", ""),
          "a clone of the smb= file: %s %s (wanted 500 naming smb=)" % (st_, j))
    time.sleep(0.5)
    others = [p for p in mappers(mem2) if p != e.daemon.pid]
    check(not others, "a process other than the daemon maps the refused template's memory: "
          "%s" % others)
    check(not os.path.exists(marker), "the marker appeared")
    log("  (a) the smb= file: %d %s" % (st_, j["error"]))

    # (a) halite-qemu clone run by hand without --qemu-binary: the recorded
    # binary is refused by name, still never run
    e.kill_daemon()
    p = subprocess.run([tc.QEMU_BIN, "clone", "--mem-file", mem_file, "--control",
                        os.path.join(e.tmp, "byhand.sock"), evil_snap],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    want = ("the recorded QEMU binary %s is not named qemu-system-*; a clone runs QEMU only "
            "(--qemu-binary names the one to run)" % evil)
    check(p.returncode == 1 and want in p.stderr,
          "halite-qemu clone of the crafted file without --qemu-binary: exit %d %r (wanted: %s)"
          % (p.returncode, p.stderr[-1000:], want))
    check(not os.path.exists(marker), "the recorded binary ran: %s exists" % marker)
    log("  (a) without --qemu-binary: exit %d, %s" % (p.returncode, want))


CASES = {"confine": case_confine}


def main():
    return tc.run_cases(CASES, __doc__, "qconfine-")


if __name__ == "__main__":
    sys.exit(main())
