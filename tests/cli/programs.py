#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""docs/cli.md for halite-synth, halite-cloned, halite-clone and the benchmarks
(halite-bench, halite-cycle, halite-bench-save, halite-bench-open,
halite-trace-lackey), checked from outside: for every program and
subcommand --help and --version, an unknown option and a missing value named
with the program (exit 2, nothing on stdout), values out of the range the
help states refused when parsed (exit 2, nothing made), and with --json
exactly one object on stdout on a failure ("ok", "error", "exit"). Only one
case needs userfaultfd (a small halite-cycle that succeeds; skipped without
it): every other fails before a guest or an engine starts, or talks to a
daemon that serves no clone.

Exit 0 pass, 1 fail, 77 skip (the programs' paths not in the environment).
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
import time
import unittest

ENV = {
    "halite-synth": "HALITE_SYNTH_BIN",
    "halite-bench": "HALITE_BENCH_BIN",
    "halite-cycle": "HALITE_CYCLE_BIN",
    "halite-bench-save": "HALITE_BENCH_SAVE_BIN",
    "halite-bench-open": "HALITE_BENCH_OPEN_BIN",
    "halite-trace-lackey": "HALITE_TRACE_LACKEY_BIN",
    "halite-cloned": "HALITE_CLONED_BIN",
    "halite-clone": "HALITE_CLONE_BIN",
}
BIN = {name: os.environ.get(var) for name, var in ENV.items()}

# Every program and its subcommands (None: the program alone).
COMMANDS = {
    "halite-synth": [None, "run", "save", "clone", "trace-dump"],
    "halite-bench": [None, "micro", "fault", "clones"],
    "halite-cycle": [None],
    "halite-bench-save": [None],
    "halite-bench-open": [None],
    "halite-trace-lackey": [None],
    "halite-cloned": [None],
    "halite-clone": [None, "template", "clone", "list", "show", "delete", "metrics", "health"],
}

# An option that takes a value, per command, given last with none.
NEEDS_VALUE = {
    ("halite-synth", "run"): ["--mem"],
    ("halite-synth", "save"): ["--out"],
    ("halite-synth", "clone"): ["--control"],
    ("halite-bench", "micro"): ["--dir"],
    ("halite-bench", "fault"): ["--dir"],
    ("halite-bench", "clones"): ["--dir"],
    ("halite-cycle", None): ["--dir"],
    ("halite-bench-save", None): ["--dir"],
    ("halite-bench-open", None): ["--dir"],
    ("halite-trace-lackey", None): ["out.trace", "--window"],
    ("halite-cloned", None): ["--socket"],
    ("halite-clone", None): ["--socket"],
    ("halite-clone", "clone"): ["t-00000000", "--count"],
}

# Values out of the range the help states: (command, arguments, the option named).
OUT_OF_RANGE = [
    (("halite-synth", "run"), ["--vcpus", "17"], "--vcpus"),
    (("halite-synth", "run"), ["--mem", "3"], "--mem"),
    (("halite-synth", "run"), ["--write", "101"], "--write"),
    (("halite-synth", "run"), ["--levels", "3"], "--levels"),
    (("halite-synth", "save"), ["--out", "@T/x.hlt", "--codec", "zstd9"], "--codec"),
    (("halite-synth", "save"), ["--out", "@T/x.hlt", "--mem", "8", "--ws", "8"], "working set"),
    (("halite-synth", "clone"), ["--anon", "--control", "@T/c.sock", "--mem-offset", "100"],
     "--mem-offset"),
    (("halite-bench", "micro"), ["--vcpus", "0"], "--vcpus"),
    (("halite-bench", "micro"), ["--compress", "95"], "--compress"),
    (("halite-bench", "micro"), ["--codec", "zstd9"], "--codec"),
    (("halite-bench", "fault"), ["--mem-mib", "8"], "--mem-mib"),
    (("halite-bench", "fault"), ["--readers", "300"], "--readers"),
    (("halite-bench", "clones"), ["--counts", "4,2"], "--counts"),
    (("halite-bench", "clones"), ["--vcpus", "17"], "--vcpus"),
    (("halite-cycle", None), ["--size", "3"], "--size"),
    (("halite-cycle", None), ["--timeout", "0"], "--timeout"),
    (("halite-cycle", None), ["--vcpus", "17"], "--vcpus"),
    (("halite-bench-save", None), ["--mem-mib", "3"], "--mem-mib"),
    (("halite-bench-save", None), ["--duration", "0"], "--duration"),
    (("halite-bench-save", None), ["--io", "nope"], "--io"),
    (("halite-bench-open", None), ["--runs", "16"], "--runs"),
    (("halite-bench-open", None), ["--sizes", "0"], "--sizes"),
    (("halite-bench-open", None), ["--stored-every", "0"], "--stored-every"),
    (("halite-trace-lackey", None), ["@T/o.trace", "--window", "0"], "--window"),
    (("halite-trace-lackey", None), ["@T/o.trace", "--vcpu", "16"], "--vcpu"),
    (("halite-cloned", None), ["--readers", "0"], "--readers"),
    (("halite-cloned", None), ["--log-level", "loud"], "--log-level"),
    (("halite-cloned", None), ["--hot-window-ms", "3600001"], "--hot-window-ms"),
    (("halite-cloned", None), ["--listen", "10.0.0.1:8080"], "--listen"),
    (("halite-cloned", None), ["--listen", "127.0.0.1:0"], "--listen"),
    (("halite-clone", "clone"), ["t-00000000", "--write", "101"], "--write"),
    (("halite-clone", "clone"), ["t-00000000", "-n", "65"], "-n"),
    (("halite-clone", "clone"), ["t-00000000", "--pattern", "zigzag"], "--pattern"),
]

# The programs that take --json: a usage error prints the object too.
JSON_CMDS = {("halite-bench", "micro"), ("halite-bench", "fault"), ("halite-bench", "clones"),
             ("halite-cycle", None), ("halite-bench-save", None), ("halite-bench-open", None),
             ("halite-clone", None), ("halite-clone", "clone")}

VERSION = r"^{} \d+\.\d+\.\d+ \(file format \d+\.\d+\)\n$"


def argv_of(cmd, args, tmp, json_flag=False):
    prog, sub = cmd
    # halite-clone: never the system daemon's socket.
    pre = ["--socket", os.path.join(tmp, "none.sock")] if prog == "halite-clone" else []
    sub = [sub] if sub else []
    # --json before the arguments: after them it could be a missing value's value
    return [BIN[prog]] + pre + sub + (["--json"] if json_flag else []) + \
        [a.replace("@T", tmp) for a in args]


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def one_object(tc, out, what):
    """stdout is exactly one JSON object."""
    try:
        obj = json.loads(out)
    except ValueError as e:
        tc.fail(f"{what}: stdout is not one JSON object ({e}): {out!r}")
    tc.assertIsInstance(obj, dict, what)
    return obj


class Programs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="halite-cli-programs.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def each(self):
        for prog, subs in COMMANDS.items():
            for sub in subs:
                yield prog, sub

    def test_help(self):
        for cmd in self.each():
            with self.subTest(cmd=cmd):
                for h in ("--help", "-h"):
                    p = run(argv_of(cmd, [h], self.tmp))
                    self.assertEqual(p.returncode, 0, f"{cmd} {h}: {p.stderr}")
                    self.assertRegex(p.stdout, r"(?m)^Usage: " + cmd[0], f"{cmd} {h}")
                    self.assertEqual(p.stderr, "", f"{cmd} {h}")

    def test_version(self):
        for cmd in self.each():
            with self.subTest(cmd=cmd):
                p = run(argv_of(cmd, ["--version"], self.tmp))
                self.assertEqual(p.returncode, 0, f"{cmd}: {p.stderr}")
                self.assertRegex(p.stdout, VERSION.format(re.escape(cmd[0])), str(cmd))
                self.assertEqual(p.stderr, "", str(cmd))

    def check_usage_error(self, cmd, args, named, words=None):
        p = run(argv_of(cmd, args, self.tmp))
        what = f"{cmd} {args}"
        self.assertEqual(p.returncode, 2, f"{what}: {p.stderr}")
        prefix = cmd[0] + ": " + (cmd[1] + ": " if cmd[1] else "")
        self.assertTrue(p.stderr.startswith(prefix), f"{what}: {p.stderr!r} (want {prefix!r})")
        self.assertIn(named, p.stderr, what)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, f"{what}: {p.stderr!r}")
        if words:
            self.assertIn(words, p.stderr, what)
        # getopt's own words are off: no path, no "unrecognized"
        self.assertNotIn("unrecognized", p.stderr, what)
        self.assertNotIn("/", p.stderr.split(":")[0], what)
        if cmd in JSON_CMDS and cmd[0] != "halite-bench-save":
            self.assertEqual(p.stdout, "", what)
        if cmd in JSON_CMDS:
            # the same with --json: one object, the sentence without the prefix
            pj = run(argv_of(cmd, args, self.tmp, json_flag=True))
            self.assertEqual(pj.returncode, 2, what + " --json")
            obj = one_object(self, pj.stdout, what + " --json")
            self.assertIs(obj["ok"], False, what)
            self.assertEqual(obj["exit"], 2, what)
            self.assertIn(named, obj["error"], what)
            self.assertFalse(obj["error"].startswith(cmd[0]), what)
        return p

    def test_unknown_option(self):
        for cmd in self.each():
            with self.subTest(cmd=cmd):
                args = ["t-00000000"] if cmd == ("halite-clone", "clone") else []
                self.check_usage_error(cmd, args + ["--no-such-option"], "'--no-such-option'",
                                       "unknown option")
                self.check_usage_error(cmd, args + ["--no-such-option=1"],
                                       "'--no-such-option'", "unknown option")

    def test_missing_value(self):
        for cmd, args in NEEDS_VALUE.items():
            with self.subTest(cmd=cmd):
                opt = args[-1]
                self.check_usage_error(cmd, args, f"'{opt}'", "needs a value")

    def test_takes_no_value(self):
        self.check_usage_error(("halite-synth", "run"), ["--loop=1"], "'--loop'", "takes no value")
        self.check_usage_error(("halite-cycle", None), ["--keep=yes"], "'--keep'", "takes no value")

    def test_out_of_range(self):
        for cmd, args, named in OUT_OF_RANGE:
            with self.subTest(cmd=cmd, args=args):
                self.check_usage_error(cmd, args, named)
                # found when parsed: nothing made
                self.assertEqual(os.listdir(self.tmp), [], f"{cmd} {args} made files")

    def test_unknown_command(self):
        for prog in ("halite-synth", "halite-bench", "halite-clone"):
            with self.subTest(prog=prog):
                self.check_usage_error((prog, None), ["frobnicate"], "'frobnicate'",
                                       "unknown command")

    def test_missing_operand(self):
        self.check_usage_error(("halite-synth", "save"), ["--mem", "8"], "--out", "missing")
        self.check_usage_error(("halite-synth", "clone"), ["--anon"], "--control", "missing")
        self.check_usage_error(("halite-synth", "trace-dump"), [], "FILE", "missing")
        self.check_usage_error(("halite-trace-lackey", None), [], "OUT", "missing")
        self.check_usage_error(("halite-clone", "show"), [], "ID", "missing")
        self.check_usage_error(("halite-clone", "clone"), [], "TEMPLATE", "missing")
        self.check_usage_error(("halite-clone", None), [], "COMMAND", "missing")
        self.check_usage_error(("halite-bench", None), [], "COMMAND", "missing")

    def test_bad_dir_json(self):
        """A --dir that is not a writable directory: exit 2, one object, before uffd."""
        bad = os.path.join(self.tmp, "no", "such")
        for cmd in (("halite-cycle", None), ("halite-bench", "micro"), ("halite-bench", "fault"),
                    ("halite-bench", "clones"), ("halite-bench-save", None),
                    ("halite-bench-open", None)):
            with self.subTest(cmd=cmd):
                p = run(argv_of(cmd, ["--json", "--dir", bad], self.tmp))
                self.assertEqual(p.returncode, 2, f"{cmd}: {p.stderr}")
                obj = one_object(self, p.stdout, str(cmd))
                self.assertEqual(obj, {"ok": False, "exit": 2,
                                       "error": f"--dir {bad}: not a writable directory"})
                self.assertIn(f"--dir {bad}: not a writable directory", p.stderr)

    def test_cycle_json_success(self):
        """The other side: a run that works is one object with "ok": true, "exit": 0."""
        p = run([BIN["halite-cycle"], "--size", "16", "--json", "--dir", self.tmp])
        if p.returncode == 77:
            self.skipTest(p.stderr.strip())
        self.assertEqual(p.returncode, 0, p.stderr)
        obj = one_object(self, p.stdout, "halite-cycle --json")
        self.assertEqual((obj["ok"], obj["exit"], obj["error"]), (True, 0, None))
        self.assertEqual(os.listdir(self.tmp), [], "the snapshot file was not removed")

    def test_synth_trace_dump_bad_file(self):
        junk = os.path.join(self.tmp, "junk")
        with open(junk, "wb") as f:
            f.write(b"not a trace at all, no")
        p = run([BIN["halite-synth"], "trace-dump", junk])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertTrue(p.stderr.startswith("halite-synth: trace-dump: " + junk), p.stderr)
        self.assertEqual(p.stdout, "")

    def test_cloned_parse_before_bind(self):
        """A bad option: exit 2 with no directory made and no socket bound."""
        base = os.path.join(self.tmp, "d")
        common = ["--state-dir", base + "/state", "--mem-dir", base + "/mem",
                  "--socket", base + "/api.sock"]
        for bad in (["--readers", "65"], ["--listen", "192.168.1.1:9000"], ["--listen", "nope"],
                    ["--prefetch-rate", "fast"], ["--frobnicate"], ["stray"],
                    ["--state-dir", "relative"],
                    ["--socket", base + "/" + "x" * 120 + ".sock"]):
            with self.subTest(bad=bad):
                p = run([BIN["halite-cloned"]] + common + bad)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertTrue(p.stderr.startswith("halite-cloned: "), p.stderr)
                self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
                self.assertFalse(os.path.exists(base), str(bad))

    # --- halite-clone against no daemon, a dead socket, and a daemon ---

    def clone_json(self, sock, *args, code=1):
        p = run([BIN["halite-clone"], "--socket", sock, "--json"] + list(args))
        self.assertEqual(p.returncode, code, p.stderr)
        return one_object(self, p.stdout, f"halite-clone {args}"), p

    def test_clone_no_socket(self):
        sock = os.path.join(self.tmp, "missing.sock")
        for args in (["health"], ["list"], ["template", "list"], ["show", "c-00000000"]):
            with self.subTest(args=args):
                obj, p = self.clone_json(sock, *args)
                self.assertEqual(set(obj), {"ok", "error", "exit", "http_status"})
                self.assertIs(obj["ok"], False)
                self.assertEqual(obj["exit"], 1)
                self.assertIsNone(obj["http_status"])
                self.assertIn(sock, obj["error"])
                self.assertIn("halite-cloned running", obj["error"])
                self.assertTrue(p.stderr.startswith(f"halite-clone: {args[0]}: {sock}"),
                                p.stderr)
        # the same without --json: the sentence, nothing on stdout
        p = run([BIN["halite-clone"], "--socket", sock, "health"])
        self.assertEqual((p.returncode, p.stdout), (1, ""))
        self.assertIn("does not exist", p.stderr)

    def test_clone_refused(self):
        """A socket file nobody listens on (a daemon that died): connection refused."""
        sock = os.path.join(self.tmp, "dead.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(sock)  # bound, never listening: connect() is refused
        try:
            obj, _ = self.clone_json(sock, "health")
        finally:
            s.close()
        self.assertEqual((obj["ok"], obj["exit"], obj["http_status"]), (False, 1, None))
        self.assertIn("nothing listens on " + sock, obj["error"])

    def test_clone_http_error(self):
        """A daemon that answers 404: the one object carries the status and its message."""
        base = os.path.join(self.tmp, "daemon")
        sock = os.path.join(base, "api.sock")
        # template memory must be on tmpfs (the daemon checks)
        shm = tempfile.mkdtemp(prefix="halite-cli-programs.", dir="/dev/shm")
        self.addCleanup(shutil.rmtree, shm, True)
        log = open(os.path.join(self.tmp, "cloned.log"), "w")
        d = subprocess.Popen([BIN["halite-cloned"], "--socket", sock, "--state-dir",
                              base + "/state", "--mem-dir", shm + "/mem",
                              "--synth-bin", BIN["halite-synth"], "--log-level", "warn"],
                             stdout=log, stderr=log)
        try:
            for _ in range(200):
                if os.path.exists(sock) or d.poll() is not None:
                    break
                time.sleep(0.05)
            if d.poll() is not None:
                self.fail("halite-cloned exited %s: %s" % (
                    d.returncode, open(os.path.join(self.tmp, "cloned.log")).read()))
            obj, _ = self.clone_json(sock, "health", code=0)
            self.assertNotIn("error", obj)
            obj, p = self.clone_json(sock, "show", "c-00000000")
            self.assertEqual(set(obj), {"ok", "error", "exit", "http_status"})
            self.assertEqual((obj["ok"], obj["exit"], obj["http_status"]), (False, 1, 404))
            self.assertIn("no clone", obj["error"])
            self.assertTrue(p.stderr.startswith("halite-clone: show: no clone"), p.stderr)
            obj, _ = self.clone_json(sock, "template", "show", "t-00000000")
            self.assertEqual(obj["http_status"], 404)
            obj, _ = self.clone_json(sock, "metrics", code=0)
            self.assertIs(obj["ok"], True)
            self.assertIn("halite_", obj["metrics"])
            # --json after the command works the same
            p = run([BIN["halite-clone"], "--socket", sock, "list", "--json"])
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("clones", one_object(self, p.stdout, "list --json"))
        finally:
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(timeout=20)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
            log.close()


if __name__ == "__main__":
    missing = [v for n, v in ENV.items() if not BIN[n]]
    if missing:
        print("skipped: %s not set" % ", ".join(missing), file=sys.stderr)
        sys.exit(77)
    res = unittest.main(exit=False, verbosity=1).result
    sys.exit(0 if res.wasSuccessful() else 1)
