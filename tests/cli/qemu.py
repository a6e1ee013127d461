#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""halite-qemu's command line against docs/cli.md, with no guest booted.

- --help and --version on the top level and every command;
- options checked when parsed, against the writer's own limits
  (halite_writer_opts_check): exit 2, one sentence on stderr naming the
  option, and nothing touched: the --qmp socket this test listens on
  accepts no connection, no file is created;
- getopt's own messages off: unknown options named with the program, QEMU's
  arguments without '--' told where they go;
- --json: exactly one object on stdout on every failure path, usage errors
  included ("ok": false, "error" the stderr sentence without its prefix,
  "exit"), the keys a success has with null for what is not known, and
  "qemu_error" with QEMU's own words when its QMP answer is the cause (a
  stand-in QMP server);
- the work directories a killed halite-qemu left in /tmp are removed by the
  next restore, and only those (hq_tmpdirs_prune).

Exit 0 pass, 1 fail.
"""
import json
import os
import random
import re
import shutil
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import halite_guest as hg  # noqa: E402

HQ = os.environ.get("HALITE_QEMU_BIN") or os.path.join(
    os.environ.get("HALITE_BINARY_DIR", "build"), "tools", "halite-qemu", "halite-qemu")
VERSION = re.compile(r"^halite-qemu \d+\.\d+\.\d+ \(file format \d+\.\d+\)\n$")

# Keys a success report has (tests/qemu, bench/*.py and scripts/demo_qemu.py read them).
SAVE_KEYS = ["ok", "file", "error", "qemu", "run_state", "pause_ms", "arm_ms", "save_s",
             "memory_bytes", "file_bytes", "ratio", "device_state_bytes", "faults",
             "faults_vcpu", "faults_other", "fault_p50_us", "fault_p99_us", "fault_max_us",
             "fault_realtime", "mb_total", "mb_stored", "mb_zero", "mb_untouched",
             "mb_background", "root_samples", "device_ram", "device_ram_bytes",
             "device_ram_copied_bytes", "device_ram_ms", "device_ram_skipped", "disks_frozen",
             "libvirt_domain", "disks", "bypass_cache"]
RESTORE_KEYS = ["ok", "file", "error", "qemu", "qmp_ready_ms", "engine_ready_ms",
                "devices_loaded_ms", "resumed_ms", "ready_to_resume_ms", "done_s",
                "memory_bytes", "faults", "faults_vcpu", "faults_zero", "faults_cached",
                "fault_p50_us", "fault_p99_us", "lb_total", "lb_demand", "lb_prefetch",
                "lb_retries", "bytes_read", "mb_total", "mb_fault", "mb_pool", "mb_prefetch",
                "mb_zero", "mb_present", "attached", "vm_access_pct", "paused", "run_state",
                "saved_run_state", "detached", "cmdline", "forwards", "forwarded_ms",
                "device_ram_bytes", "device_ram_written_bytes", "device_ram_ms", "disks",
                "bypass_cache", "learn_trace", "learn_window_ms", "lb_hot", "store"]
QEMU_KEYS = ["pid", "version", "machine", "vcpus"]

failures = []


def check(cond, msg):
    if cond:
        print(f"  ok: {msg}", flush=True)
    else:
        print(f"  FAIL: {msg}", flush=True)
        failures.append(msg)


def run(args, timeout=60):
    return subprocess.run([HQ, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


def one_error(p, cmd):
    """The one sentence on stderr, without its 'halite-qemu: CMD: ' prefix (None if not so)."""
    lines = p.stderr.splitlines()
    prefix = f"halite-qemu: {cmd}: " if cmd else "halite-qemu: "
    if len(lines) != 1 or not lines[0].startswith(prefix):
        return None
    return lines[0][len(prefix):]




def fake_qmp(path, version, errors=None):
    """A QMP server greeting as QEMU @version, for one client: @errors maps a
    command to the error reply's desc; query-commands lists every command asked
    for; the rest get {"return": {}}."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    errors = errors or {}
    names = ["query-cpus-fast", "human-monitor-command", "xen-save-devices-state", "stop",
             "cont", "query-status", "qom-get", "migrate-incoming", "query-migrate"]

    def serve():
        c, _ = srv.accept()
        hg.qmp_greet(c, version)
        for line in c.makefile("rb"):
            req = json.loads(line)
            cmd = req.get("execute")
            if cmd in errors:
                rep = {"error": {"class": "GenericError", "desc": errors[cmd]}}
            elif cmd == "query-commands":
                rep = {"return": [{"name": n} for n in names]}
            else:
                rep = {"return": {}}
            rep["id"] = req.get("id")
            c.sendall(json.dumps(rep).encode() + b"\r\n")
        c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def json_failure(p, cmd, rc, keys):
    """--json on a failure: one object, ok false, the stderr sentence, exit, keys; the object."""
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        check(False, f"{cmd}: stdout is one JSON object: {p.stdout[:200]!r}")
        return None
    sentence = one_error(p, cmd)
    check(isinstance(rep, dict) and rep.get("ok") is False and rep.get("exit") == rc and
          sentence is not None and rep.get("error") == sentence,
          f"{cmd}: one object, ok false, exit {rc}, error as on stderr: {rep.get('error')!r}")
    missing = [k for k in keys + ["exit", "qemu_error"] if k not in rep]
    check(not missing, f"{cmd}: the report's keys are all there (missing {missing})")
    q = rep.get("qemu") or {}
    check(all(k in q for k in QEMU_KEYS), f"{cmd}: qemu: {{{', '.join(QEMU_KEYS)}}}")
    return rep


def test_help_version():
    for args in (["--version"], ["-V"], ["save", "--version"], ["restore", "--version"],
                 ["clone", "--version"]):
        p = run(args)
        check(p.returncode == 0 and VERSION.match(p.stdout) and not p.stderr,
              f"{' '.join(args)}: exit 0, {p.stdout.strip()!r}")
    for args in (["--help"], ["-h"], ["help"], ["save", "--help"], ["restore", "-h"],
                 ["clone", "--help"], ["help", "save"], ["help", "restore"]):
        p = run(args)
        check(p.returncode == 0 and p.stdout.startswith("Usage: halite-qemu") and not p.stderr,
              f"{' '.join(args)}: usage on stdout, exit 0")
    for cmd in ("save", "restore"):
        h = run([cmd, "--help"]).stdout
        for opt in ("--json", "--progress[=MODE]", "--bypass-cache", "--version", "--help"):
            check(opt in h, f"{cmd} --help describes {opt}")
    h = run(["save", "--help"]).stdout
    # The ranges the parser enforces are the ones the help states.
    for text in ("8K..4M", "zstd -128..22", "zlib 0..9", "lz4 -128..12", "1..256",
                 "1..60000"):
        check(text in h, f"save --help states {text}")
    h = run(["restore", "--help"]).stdout
    for text in ("0..1000000", "1..10000000"):
        check(text in h, f"restore --help states {text}")
    p = run(["help", "nope"])
    check(p.returncode == 2 and one_error(p, "help") is not None, "help nope: exit 2")


def test_save_parse(work):
    """Every bad option: exit 2 before QMP is reached or any file is created."""
    sock = os.path.join(work, "qmp.sock")
    srv = hg.unix_listener(sock)
    out = os.path.join(work, "out.hlt")
    cases = [
        (["--lb-size", "8M"], "--lb-size: locality-block size 8 MiB: a power of two"),
        (["--lb-size", "1G"], "--lb-size: locality-block size 1024 MiB"),
        (["--lb-size", "4K"], "does not fit a locality block of 4 KiB"),
        (["--lb-size", "48K"], "--lb-size: locality-block size 48 KiB: a power of two"),
        (["--lb-size", "big"], "--lb-size 'big'"),
        (["--codec", "zstd", "--level", "23"], "--level: zstd level 23: -128 to 22"),
        (["--level", "10", "--codec", "zlib"], "--level: zlib level 10: 0 to 9"),
        (["--level", "13"], "--level: lz4 level 13: -128 to 12"),
        (["--level", "x"], "--level 'x'"),
        (["--codec", "brotli"], "--codec 'brotli': none, lz4, zlib or zstd"),
        (["--workers", "0"], "--workers '0': 1..256"),
        (["--workers", "257"], "--workers '257': 1..256"),
        (["--bg-rate", "512K"], "--bg-rate '512K': at least 1M"),
        (["--root-interval", "0"], "--root-interval '0': 1..60000 ms"),
        (["--progress=xml"], "--progress 'xml': text, json or none"),
        (["--frobnicate"], "unknown option '--frobnicate' (halite-qemu save --help)"),
        (["-Z"], "unknown option '-Z' (halite-qemu save --help)"),
    ]
    for extra, text in cases:
        for js in (False, True):
            args = ["save", "--qmp", sock, *extra, *(["--json"] if js else []), out]
            p = run(args)
            sentence = one_error(p, "save")
            check(p.returncode == 2 and sentence is not None and text in sentence,
                  f"save {' '.join(extra)}{' --json' if js else ''}: exit 2, {sentence!r}")
            check("invalid option" not in p.stderr and "unrecognized" not in p.stderr,
                  "  getopt's own message is off")
            if js:
                rep = json_failure(p, "save", 2, SAVE_KEYS)
                if rep:
                    nulls = [k for k in ("pause_ms", "file_bytes", "faults", "mb_total",
                                         "run_state", "memory_bytes", "save_s", "ratio")
                             if rep[k] is not None]
                    check(not nulls and all(rep["qemu"][k] is None for k in QEMU_KEYS),
                          f"  nothing known is null (not: {nulls})")
            else:
                check(p.stdout == "", "  nothing on stdout without --json")
    # A missing value, a missing FILE, no --qmp: usage too.
    for args, text in ((["save", "--json", out, "--qmp"], "option '--qmp' needs a value"),
                       (["save", "--json", "--qmp", sock], "FILE missing"),
                       (["save", "--json", out], "--qmp SOCKET is required"),
                       (["save", "--json", "--qmp", sock, out, out], "one FILE only"),
                       (["save", "--json", "--qmp", sock, ""], "no file name given")):
        p = run(args)
        rep = json_failure(p, "save", 2, SAVE_KEYS)
        check(p.returncode == 2 and rep and text in rep["error"], f"{args[2:]}: {text}")
    check(not hg.accepted(srv), "no bad option made halite-qemu connect to QMP")
    check(os.listdir(work) == ["qmp.sock"], f"no file created ({os.listdir(work)})")
    srv.close()
    os.unlink(sock)


def test_save_limits_taken(work):
    """The limits themselves pass the parse: the save goes on to QMP (a QEMU too old: 77)."""
    for extra in (["--lb-size", "4M"], ["--lb-size", "8K"], ["--codec", "zstd", "--level", "22"],
                  ["--codec", "zstd", "--level", "-5"], ["--codec", "zlib", "--level", "9"],
                  ["--workers", "256"], ["--root-interval", "60000"], ["--bypass-cache"],
                  ["--progress=json"], ["--progress"]):
        sock = os.path.join(work, "old.sock")
        t = fake_qmp(sock, (6, 2, 0))
        p = run(["save", "--qmp", sock, "--json", *extra, os.path.join(work, "x.hlt")])
        t.join(5)
        rep = json_failure(p, "save", 77, SAVE_KEYS)
        check(p.returncode == 77 and rep and "is too old" in rep["error"] and
              rep["qemu"]["version"] == "6.2.0" and rep["qemu"]["pid"] == os.getpid() and
              rep["qemu"]["machine"] is None and rep["run_state"] is None,
              f"save {' '.join(extra)}: parsed, QEMU reached: exit 77, what was learnt "
              f"(version, pid) and null for the rest")
        os.unlink(sock)
    check(not os.path.exists(os.path.join(work, "x.hlt")), "no file left behind")


def test_qemu_error(work):
    """QEMU's error reply is the cause: its words in "qemu_error"."""
    sock = os.path.join(work, "err.sock")
    desc = "Property 'type' not found (a stand-in's refusal)"
    t = fake_qmp(sock, (7, 2, 0), errors={"qom-get": desc})
    p = run(["save", "--qmp", sock, "--json", os.path.join(work, "x.hlt")])
    t.join(5)
    rep = json_failure(p, "save", 1, SAVE_KEYS)
    check(p.returncode == 1 and rep and rep["qemu_error"] == desc and desc in rep["error"],
          f"qemu_error is QEMU's own message: {rep and rep['qemu_error']!r}")
    os.unlink(sock)
    # Not QEMU's doing: null.
    p = run(["save", "--qmp", os.path.join(work, "none.sock"), "--json",
             os.path.join(work, "x.hlt")])
    rep = json_failure(p, "save", 1, SAVE_KEYS)
    check(rep and rep["qemu_error"] is None and "No such file or directory" in rep["error"],
          "no QMP socket: exit 1, qemu_error null")
    # save --recover: the same conventions.
    p = run(["save", "--recover", "--json", "--qmp", os.path.join(work, "none.sock")])
    rep = json_failure(p, "save", 1, ["ok", "error", "qemu", "pages_given_back", "run_state"])
    check(rep and rep["run_state"] is None, "save --recover failing: run_state null")


def test_restore_parse(work):
    hint = ("QEMU's arguments go after '--' (halite-qemu restore FILE -- "
            "qemu-system-x86_64 ...)")
    f = os.path.join(work, "x.hlt")
    cases = [
        ([f, "-m", "1G"], "unknown option '-m': " + hint),
        ([f, "-machine", "q35"], "unknown option '-machine': " + hint),
        ([f, "qemu-system-x86_64"], "one FILE only: " + hint),
        (["--frobnicate", f], "unknown option '--frobnicate' (halite-qemu restore --help)"),
        ([f, "--"], "QEMU's command line missing after '--'"),
        ([f, "--", "-incoming", "defer"], "-incoming is halite-qemu's to give"),
        (["--running", "--paused", f], "--running or --paused, not both"),
        (["--read-latency", "2000000", f], "--read-latency '2000000': 0..1000000 us"),
        (["--prefetch-idle", "0", f], "--prefetch-idle '0': 1..10000000 us"),
        (["--prefetch-rate", "lots", f], "--prefetch-rate 'lots': 1..1000000 MiB/s"),
        (["--progress=loud", f], "--progress 'loud': text, json or none"),
        (["--attach", "x", f], "--attach 'x': the pid of a QEMU"),
        ([f, "--trace"], "option '--trace' needs a value"),
        (["--learn", "l", "--trace", "t", f],
         "--learn FILE writes the restore trace itself: --learn or --trace, not both"),
        (["--learn-window", "5", f],
         "--learn-window is for a learning restore: give --learn FILE too"),
        (["--learn", "l", "--learn-window", "3600001", f], "--learn-window '3600001': 0..3600000 ms"),
        (["--hot-prefix", "lots", f], "--hot-prefix 'lots': a size in bytes (K, M, G "
         "suffixes), 0 for off"),
        (["--hot-prefix", "-1", f], "--hot-prefix '-1'"),
        (["--attach", "5", "--learn", "l", f], "--attach takes over a restore whose guest ran "
         "already: no --learn"),
    ]
    for args, text in cases:
        for js in (False, True):
            a = ["restore", *(["--json"] if js else []), *args]
            p = run(a)
            sentence = one_error(p, "restore")
            check(p.returncode == 2 and sentence is not None and text in sentence,
                  f"restore {' '.join(args)[:50]}{' --json' if js else ''}: exit 2, {sentence!r}")
            if js:
                rep = json_failure(p, "restore", 2, RESTORE_KEYS)
                check(rep and rep["qemu"]["pid"] is None and rep["resumed_ms"] is None and
                      rep["devices_loaded_ms"] is None, "  null for what is not known")
            else:
                check(p.stdout == "", "  nothing on stdout without --json")
    # QEMU's arguments after '--' are QEMU's, not ours: the file is what fails.
    p = run(["restore", "--json", os.path.join(work, "none.hlt"), "--", "-m", "1G"])
    rep = json_failure(p, "restore", 1, RESTORE_KEYS)
    check(rep and "none.hlt" in rep["error"] and rep["qemu"]["pid"] is None and
          rep["memory_bytes"] is None and rep["cmdline"] == "given",
          "a missing file: exit 1, one object, the file named, pid null")
    with open(os.path.join(work, "empty.hlt"), "wb"):
        pass
    p = run(["restore", "--json", "--bypass-cache", os.path.join(work, "empty.hlt")])
    rep = json_failure(p, "restore", 1, RESTORE_KEYS)
    check(rep and rep["bypass_cache"] is True and rep["cmdline"] == "recorded",
          "an empty file: exit 1, one object, what the options chose")


FAKE_QEMU = """#!/bin/sh
echo "a stand-in QEMU's line on its stdout"
echo "qemu-system-x86_64: -m 512M: a stand-in refuses this command line" >&2
exit 1
"""


def test_restore_qemu_error(work):
    """QEMU refusing its command line: its last words in "qemu_error" when its log is a file
    (--detach: ours; --qemu-log), from what this QEMU wrote only; without a log QEMU writes
    to the terminal itself (its stdout to our stderr: our stdout is the report's)."""
    mkfile = os.environ.get("HALITE_QEMU_MKFILE") or os.path.join(
        os.environ.get("HALITE_BINARY_DIR", "build"), "tests", "qemu", "qemu_mkfile")
    fake = os.path.join(work, "fake-qemu")
    with open(fake, "w") as f:
        f.write(FAKE_QEMU)
    os.chmod(fake, 0o755)
    snap = os.path.join(work, "rec.hlt")
    subprocess.run([mkfile, snap, "--cwd", work, "--", fake, "-machine", "q35", "-smp", "2",
                    "-m", "512M"], check=True)
    # Nothing starts on a usage error: a stand-in QEMU after '--' leaves a mark when it runs.
    mark = os.path.join(work, "qemu-ran")
    marker = os.path.join(work, "marker-qemu")
    with open(marker, "w") as fh:
        fh.write(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    os.chmod(marker, 0o755)
    line = [marker, "-machine", "q35", "-smp", "2", "-m", "512M"]
    for bad in (["--read-latency", "2000000"], ["--progress=loud"], ["--frobnicate"],
                ["--prefetch-rate", "0"], ["--running", "--paused"], ["--attach", "0"]):
        p = run(["restore", "--json", *bad, snap, "--", *line])
        check(p.returncode == 2 and not os.path.exists(mark),
              f"restore {' '.join(bad)} FILE -- QEMU: exit 2, QEMU never started")
    p = run(["restore", "--json", "--read-latency", "1000000", snap, "--", *line])
    check(p.returncode == 1 and os.path.exists(mark),
          "with good options the same command line starts QEMU (the check above can tell)")
    words = "qemu-system-x86_64: -m 512M: a stand-in refuses this command line"
    log = os.path.join(work, "qemu.log")
    with open(log, "w") as f:
        f.write("an older QEMU's line\n")
    for opts, where in ((["--detach"], "its messages below"), (["--qemu-log", log], log)):
        p = run(["restore", "--json", *opts, snap])
        try:
            rep = json.loads(p.stdout)
        except ValueError:
            rep = None
        check(p.returncode == 1 and rep and rep["ok"] is False and rep["exit"] == 1 and
              "QEMU exited (status 1) before its QMP socket came up" in rep["error"] and
              where in rep["error"] and rep["qemu_error"].endswith(words) and
              "an older QEMU's line" not in rep["qemu_error"],
              f"restore {' '.join(opts)}: qemu_error {rep and rep['qemu_error']!r}")
        check(rep and rep["memory_bytes"] == 65536 and rep["qmp_ready_ms"] is None and
              rep["qemu"]["pid"] is None, "  what the file says is known, QEMU's is null")
    # QEMU writing to the terminal (no log): its stdout goes to stderr, ours is the report's.
    p = run(["restore", "--json", snap])
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = None
    check(p.returncode == 1 and rep and rep["qemu_error"] is None and
          "a stand-in QEMU's line on its stdout" in p.stderr and words in p.stderr,
          "restore --json, QEMU's output on the terminal: stdout one object, QEMU's lines on "
          "stderr, qemu_error null (not captured)")


def test_top_level(work):
    for args, text in ((["bogus"], "unknown command 'bogus' (halite-qemu --help)"),
                       (["--frobnicate"], "unknown option '--frobnicate' (halite-qemu --help)")):
        p = run(args)
        check(p.returncode == 2 and one_error(p, None) == text, f"{args}: exit 2, {text}")
        p = run([*args, "--json"])
        try:
            rep = json.loads(p.stdout)
        except ValueError:
            rep = None
        check(p.returncode == 2 and rep and rep["ok"] is False and rep["exit"] == 2 and
              rep["error"] == text, f"{args} --json: one object")
    p = run(["clone", "--frobnicate"])
    check(p.returncode == 2 and one_error(p, "clone") ==
          "unknown option '--frobnicate' (halite-qemu clone --help)", "clone --frobnicate")
    p = run(["clone", "x.hlt"])
    check(p.returncode == 2 and "--mem-file and --control are needed" in p.stderr,
          "clone without --mem-file: exit 2")


def test_tmpdirs_prune(work):
    """Four /tmp/halite-qemu.XXXXXX of ours, made to look left behind: one
    whose QEMU is gone (a dead qmp.sock) and one that never had a socket, both
    untouched for 10 minutes, go at the next restore, even one that fails
    at once; one whose QMP socket still listens, one touched just now and
    one holding a file not halite-qemu's stay."""
    old = time.time() - 600
    dirs = {}
    for k in ("dead", "nosock", "live", "fresh", "foreign"):
        while k not in dirs:  # as mkdtemp(3) names them: six characters after the dot
            d = "/tmp/halite-qemu." + "".join(random.choice(string.ascii_letters)
                                              for _ in range(6))
            try:
                os.mkdir(d, 0o700)
                dirs[k] = d
            except FileExistsError:
                pass
    live = None
    try:
        for k in ("dead", "live", "fresh"):
            s = socket.socket(socket.AF_UNIX)
            s.bind(os.path.join(dirs[k], "qmp.sock"))
            if k == "live":
                s.listen(1)
                live = s
            else:
                s.close()  # the file stays, nobody listens: refused
        open(os.path.join(dirs["dead"], "qemu.log"), "w").close()
        open(os.path.join(dirs["foreign"], "notes.txt"), "w").close()
        for k in ("dead", "nosock", "live", "foreign"):
            os.utime(dirs[k], (old, old))
        p = run(["restore", os.path.join(work, "missing.hlt")])
        check(p.returncode == 1, f"restore of a missing file: exit 1 ({p.returncode})")
        for k, gone in (("dead", True), ("nosock", True), ("live", False), ("fresh", False),
                        ("foreign", False)):
            check(os.path.exists(dirs[k]) != gone,
                  f"tmpdirs prune: the {k} directory {'removed' if gone else 'kept'}")
    finally:
        if live:
            live.close()
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)


def main():
    if not os.path.exists(HQ):
        print(f"halite-qemu not built: {HQ}")
        return 1
    work = tempfile.mkdtemp(prefix="halite-cli-qemu.")
    try:
        for t in (test_help_version, test_save_parse, test_save_limits_taken, test_qemu_error,
                  test_restore_parse, test_restore_qemu_error, test_top_level,
                  test_tmpdirs_prune):
            print(t.__name__, flush=True)
            d = os.path.join(work, t.__name__)
            os.mkdir(d)
            if t.__code__.co_argcount:
                t(d)
            else:
                t()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failed:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
