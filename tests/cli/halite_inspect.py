#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""halite-inspect against docs/cli.md, from outside (issue 16): test cli_inspect.

Not named inspect.py: that would be the standard library's inspect for
every script in this directory (unittest imports it).

Each check runs the real binary and asserts its exit code, the exact error
sentence ("halite-inspect: COMMAND: ...", one line on stderr), and with
--json that stdout is exactly one JSON object, on success ("ok": true) and
on every failure path ("ok": false, "error", "exit", the success keys with
null for what is not known). Parse-time refusals must leave nothing behind
and must not even open the files named (a missing IMAGE is not what they
report).

Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HI = os.environ.get("HALITE_INSPECT_BIN")
PROG = "halite-inspect"
COMMANDS = ["info", "verify", "blocks", "map", "extract", "import", "restore"]
# The top-level keys each command's success prints (its failures print them too).
KEYS = {
    "info": ["file", "version", "uuid", "created", "created_ns", "incompat_flags",
             "compat_flags", "codec", "codec_level", "page_size", "mb_pages", "mb_size",
             "lb_size", "data_offset", "file_size", "memory_bytes", "regions", "mbs",
             "file_memory_ratio", "lbs", "streams", "sections", "metadata", "save_stats"],
    "verify": ["file", "summary", "sections", "lbs", "mbs", "problems"],
    "blocks": ["file", "lb_size", "lb_count", "lbs"],
    "map": ["file", "mb_size", "mb_count", "mbs"],
    "extract": ["file", "region", "output", "bytes", "lbs_read", "mbs"],
    "import": ["file", "order", "codec", "mbs", "raw_bytes", "stored_bytes",
               "compression_ratio"],
    "restore": ["file", "trace", "uuid", "lb_count", "mb_count", "stats", "error_text",
                "totals", "streams"],
}
PAGE = 4096


def run(*args):
    p = subprocess.run([HI, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def slurp(path):
    with open(path, "rb") as f:
        return f.read()


def spit(path, data):
    with open(path, "wb") as f:
        f.write(data)


def image(path, pages, seed=1, holes=False):
    """Pages of pseudo-random but compressible bytes; with holes, only every 8th page written."""
    with open(path, "wb") as f:
        for i in range(pages):
            if holes and i % 8:
                continue
            f.seek(i * PAGE)
            word = (seed * 1000003 + i * 7919).to_bytes(8, "little")
            f.write((word + bytes(56)) * (PAGE // 64))
        f.truncate(pages * PAGE)


class Inspect(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tempfile.mkdtemp(prefix="halite-cli-inspect.")
        cls.img = cls.p("mem0.img")
        cls.vga = cls.p("vga.img")
        image(cls.img, 64)
        image(cls.vga, 16, seed=2)
        cls.good = cls.p("good.hlt")
        rc, _, err = run("import", "--no-sync", "-j", "2", "--region", f"mem0={cls.img}",
                         "--region", f"vga.vram={cls.vga}@0x100000000", "-o", cls.good)
        assert rc == 0, err
        cls.empty = cls.p("empty.hlt")
        spit(cls.empty, b"")
        data = slurp(cls.good)
        cls.trunc = cls.p("trunc.hlt")
        spit(cls.trunc, data[:len(data) - 100])
        cls.corrupt = cls.p("corrupt.hlt")
        bad = bytearray(data)
        bad[40] ^= 0xff             # in the header, under its checksum
        spit(cls.corrupt, bytes(bad))
        cls.missing = cls.p("missing.hlt")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.d)

    @classmethod
    def p(cls, name):
        return os.path.join(cls.d, name)

    # ---- helpers ----

    def one_error(self, err, cmd):
        """The one line on stderr, its prefix checked; returns the sentence after it."""
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, f"not one line on stderr: {err!r}")
        prefix = f"{PROG}: {cmd}: " if cmd else f"{PROG}: "
        self.assertTrue(lines[0].startswith(prefix), lines[0])
        return lines[0][len(prefix):]

    def fails(self, want_rc, cmd, args, sentence=None, contains=()):
        """Text and --json runs of a failure: same code, one sentence, one object."""
        rc, out, err = run(cmd, *args)
        self.assertEqual(rc, want_rc, f"{cmd} {args}: {err}")
        self.assertEqual(out, "", f"{cmd} {args}: stdout on failure")
        msg = self.one_error(err, cmd)
        if sentence is not None:
            self.assertEqual(msg, sentence)
        for c in contains:
            self.assertIn(c, msg)
        rc, out, err = run(cmd, "--json", *args)
        self.assertEqual(rc, want_rc)
        obj = json.loads(out)   # the whole of stdout: exactly one object
        self.assertIsInstance(obj, dict)
        self.assertIs(obj["ok"], False)
        self.assertEqual(obj["exit"], want_rc)
        self.assertEqual(obj["error"], self.one_error(err, cmd))
        for k in KEYS.get(cmd, []):
            self.assertIn(k, obj, f"{cmd}: key {k} missing on failure")
        for k, v in obj.items():
            self.assertNotIn(v, ("", -1), f"{cmd}: {k} is a stand-in, not null")
        return msg, obj

    def succeeds_json(self, *args):
        rc, out, err = run(*args)
        self.assertEqual(rc, 0, err)
        obj = json.loads(out)
        self.assertIs(obj["ok"], True)
        self.assertNotIn("error", obj)
        return obj, err

    # ---- 6: --version and --help everywhere ----

    def test_version_help(self):
        rc, out, _ = run("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^halite-inspect \d+\.\d+\.\d+ \(file format 1\.1\)\n$")
        version = out
        for c in COMMANDS + ["help"]:
            rc, o, e = run(c, "--version")
            self.assertEqual((rc, o, e), (0, version, ""), c)
            rc, o, _ = run(c, "--help")
            self.assertEqual(rc, 0, c)
            self.assertTrue(o.startswith(f"Usage: {PROG} {c}"), c)
            # --help with --json is still the help: no JSON object after it.
            rc, o2, _ = run(c, "--help", "--json")
            self.assertEqual((rc, o2), (0, o), c)

    def test_help_states_ranges(self):
        _, h, _ = run("import", "--help")
        for words in ("zstd -128 to 22", "zlib 0 to 9", "lz4 -128 to 12", "4K to 4M",
                      "1 to 1024", "1 to 256", "--progress", "--version"):
            self.assertIn(words, " ".join(h.split()), words)
        for c in ("verify", "extract"):
            _, h, _ = run(c, "--help")
            self.assertIn("--progress", h, c)

    # ---- 1, 5: a file that does not open, each command ----

    def test_open_failures(self):
        cases = [
            # Does not open: the command failed (1). Cannot be a snapshot: usage (2).
            (self.missing, 1, f"{self.missing}: cannot open: No such file or directory"),
            (self.empty, 1, f"{self.empty}: not a Halite snapshot (empty file)"),
            (self.trunc, 1, f"{self.trunc}: incomplete: the save that wrote it did not "
             "finish, or the file was cut short (no valid footer); it cannot be restored"),
            (self.corrupt, 1, f"{self.corrupt}: header checksum mismatch"),
            ("/dev/null", 2, "/dev/null: not a regular file (a character device)"),
            (self.d, 2, f"{self.d}: not a regular file (a directory)"),
        ]
        for path, code, sentence in cases:
            for cmd in ("info", "verify", "blocks", "map"):
                with self.subTest(cmd=cmd, path=path):
                    _, obj = self.fails(code, cmd, [path], sentence)
                    self.assertEqual(obj["file"], path)
            with self.subTest(cmd="extract", path=path):
                out = self.p("never.img")
                self.fails(code, "extract", ["-o", out, path], sentence)
                self.assertFalse(os.path.exists(out))
            with self.subTest(cmd="restore", path=path):
                self.fails(code, "restore", [path, self.p("no.trace")], sentence)

    def test_verify_one_place(self):
        # The sentence once, on stderr only (it was on stdout too).
        rc, out, err = run("verify", self.trunc)
        self.assertEqual((rc, out), (1, ""))
        self.assertEqual(len(err.splitlines()), 1)

    # ---- 3, 5: usage errors name the program and the command ----

    def test_bad_options(self):
        for c in COMMANDS:
            with self.subTest(c=c):
                self.fails(2, c, ["--foo", self.good],
                           f"unknown option '--foo' ({PROG} {c} --help)")
                self.fails(2, c, ["--foo=1", self.good],
                           f"unknown option '--foo' ({PROG} {c} --help)")
        self.fails(2, "map", [self.good, "--region"],
                   f"option '--region' requires an argument ({PROG} map --help)")
        self.fails(2, "info", [], f"expected exactly one FILE ({PROG} info --help)")
        self.fails(2, "verify", ["-j", "0", self.good], "--jobs: 1 to 256, not '0'")
        self.fails(2, "verify", ["--progress=loud", self.good],
                   "--progress: text, json or none, not 'loud'")

    def test_top_level(self):
        rc, out, err = run()
        self.assertEqual((rc, out), (2, ""))
        self.assertIn(f"{PROG}: no command given", err)
        rc, out, err = run("frobnicate")
        self.assertEqual((rc, out), (2, ""))
        self.assertEqual(self.one_error(err, None),
                         f"unknown command 'frobnicate'; '{PROG} help' lists them")
        rc, out, err = run("--frobnicate")
        self.assertEqual(self.one_error(err, None),
                         f"unknown option '--frobnicate' ({PROG} --help)")
        for args in (["--json", "frobnicate"], ["frobnicate", "--json"], ["--json"]):
            rc, out, err = run(*args)
            obj = json.loads(out)
            self.assertEqual((rc, obj["ok"], obj["exit"]), (2, False, 2), args)
            self.assertEqual(obj["error"], self.one_error(err, None))

    # ---- 2: import's options, checked when parsed: nothing opened or created ----

    def test_import_parse_time(self):
        out = self.p("refused.hlt")
        nothing = self.p("no-such-image.img")     # never opened: not what is reported
        base = [nothing, "--region", "r", "-o", out]
        cases = [
            (["--codec", "zstd", "--level", "23"],
             "--level 23: zstd levels are -128 to 22 (0: the codec's default)"),
            (["--level", "23", "--codec", "zstd"],
             "--level 23: zstd levels are -128 to 22 (0: the codec's default)"),
            (["--codec", "zlib", "--level", "10"],
             "--level 10: zlib levels are 0 to 9 (0: the codec's default)"),
            (["--level", "13"], "--level 13: lz4 levels are -128 to 12 (0: the codec's default)"),
            (["--codec", "none", "--level", "1"],
             "--level 1: none levels are 0 to 0 (0: the codec's default)"),
            (["--level", "200"], "--level: a number from -128 to 127, not '200'"),
            (["--codec", "lzma"], "--codec: none, lz4, zlib or zstd, not 'lzma'"),
            (["--lb-size", "8M"], "--lb-size: a power of two from 4K to 4M, not '8M'"),
            (["--lb-size", "3K"], "--lb-size: a power of two from 4K to 4M, not '3K'"),
            (["--page-size", "2K"], "--page-size: a power of two from 4K to 4M, not '2K'"),
            (["--mb-pages", "0"], "--mb-pages: 1 to 1024, not '0'"),
            (["--mb-pages", "1025"], "--mb-pages: 1 to 1024, not '1025'"),
            (["--page-size", "8K", "--mb-pages", "16"],
             "a memory block of 128 KiB (16 pages of 8 KiB) does not fit a locality block "
             "of 64 KiB"),
            (["-j", "0"], "--jobs: 1 to 256, not '0'"),
            (["-j", "257"], "--jobs: 1 to 256, not '257'"),
            (["--seed", "x"], "--seed: a number from 0 to 2^64-1, not 'x'"),
            (["--seed", "-1"], "--seed: a number from 0 to 2^64-1, not '-1'"),
            (["--order", "sideways"], "--order: physical or random, not 'sideways'"),
            (["--progress=loud"], "--progress: text, json or none, not 'loud'"),
            (["--gpa", "0x1001"], "region r: GPA 0x1001 is not a multiple of the page size 4096"),
            (["--meta", "source=me"], "--meta source: import records that key itself"),
        ]
        for extra, sentence in cases:
            with self.subTest(extra=extra):
                self.fails(2, "import", base + extra, sentence)
                self.assertFalse(os.path.exists(out))
        # The edges are accepted.
        for extra in (["--codec", "zstd", "--level", "22"], ["--codec", "zstd", "--level", "-5"],
                      ["--codec", "zlib", "--level", "9"],
                      ["--lb-size", "4M", "--mb-pages", "1024"],
                      ["--page-size", "8K", "--mb-pages", "8"]):
            with self.subTest(extra=extra):
                self.succeeds_json("import", "--json", "--no-sync", self.img, "--region", "r",
                                   "-o", out, *extra)
                os.unlink(out)

    # ---- 4: overlapping guest-physical ranges ----

    def test_import_overlap(self):
        out = self.p("overlap.hlt")
        msg, obj = self.fails(2, "import", ["--region", f"mem0={self.img}",
                                            "--region", f"vga.vram={self.vga}@0x10000",
                                            "-o", out],
                              "regions mem0 (0x0-0x3ffff) and vga.vram (0x10000-0x1ffff) "
                              "overlap in guest-physical memory: give each its own @GPA")
        self.assertEqual(obj["file"], out)
        self.assertFalse(os.path.exists(out))
        # Touching is not overlapping.
        self.succeeds_json("import", "--json", "--no-sync", "--region", f"a={self.img}",
                           "--region", f"b={self.vga}@0x40000", "-o", out)
        os.unlink(out)

    # ---- 3: hints where the user can act ----

    def test_unknown_region(self):
        sentence = f"{self.good}: no region 'nope'; the file has: mem0, vga.vram"
        self.fails(2, "map", ["--region", "nope", self.good], sentence)
        out = self.p("nope.img")
        self.fails(2, "extract", ["--region", "nope", "-o", out, self.good], sentence)
        self.assertFalse(os.path.exists(out))
        self.fails(2, "extract", ["-o", out, self.good],
                   f"{self.good} has 2 regions: name one with --region (mem0, vga.vram)")

    def test_ragged_image(self):
        ragged = self.p("ragged.img")
        spit(ragged, slurp(self.img)[:10000])
        out = self.p("ragged.hlt")
        self.fails(2, "import", [ragged, "--region", "r", "-o", out],
                   f"{ragged}: length 10000 is not a multiple of the page size 4096; pad it "
                   f"with zeros to 12288 bytes: truncate -s 12288 {ragged}")
        self.assertFalse(os.path.exists(out))
        # The hint works as given.
        subprocess.run(["truncate", "-s", "12288", ragged], check=True)
        obj, _ = self.succeeds_json("import", "--json", "--no-sync", ragged, "--region", "r",
                                    "-o", out)
        self.assertEqual(obj["mbs"]["count"], 2)

    def test_import_missing_and_dir(self):
        out = self.p("x.hlt")
        self.fails(1, "import", [self.missing, "--region", "r", "-o", out],
                   f"{self.missing}: cannot open: No such file or directory")
        self.fails(2, "import", [self.d, "--region", "r", "-o", out],
                   f"{self.d}: not a regular file or block device (a directory)")
        self.fails(1, "import", [self.img, "--region", "r", "-o", "/nonexistent/x.hlt"],
                   "/nonexistent/x.hlt: directory /nonexistent: No such file or directory")
        # An output that cannot be one is a wrong argument: 2, nothing read or written.
        self.fails(2, "import", [self.missing, "--region", "r", "-o", self.d],
                   f"{self.d} is a directory")
        self.fails(2, "extract", ["-o", self.d, self.good],
                   f"{self.d}: not a regular file (a directory): give -o the image's file name")
        self.fails(2, "restore", [self.good, self.d], f"{self.d}: not a regular file (a directory)")
        self.assertFalse(os.path.exists(out))

    # ---- 5: success objects, and verify's failing-LB report ----

    def test_json_success(self):
        for c in ("info", "verify", "blocks", "map"):
            obj, _ = self.succeeds_json(c, "--json", self.good)
            for k in KEYS[c]:
                self.assertIn(k, obj, f"{c}: {k}")
        out = self.p("ok.img")
        obj, _ = self.succeeds_json("extract", "--json", "--region", "vga.vram", "-o", out,
                                    self.good)
        self.assertEqual((obj["region"], obj["bytes"]), ("vga.vram", 16 * PAGE))
        self.assertEqual(slurp(out), slurp(self.vga))

    def test_verify_bad_lb(self):
        info, _ = self.succeeds_json("info", "--json", self.good)
        bad = self.p("badlb.hlt")
        data = bytearray(slurp(self.good))
        data[info["data_offset"] + 100] ^= 0x01     # LB 0's bytes: its checksum fails
        spit(bad, bytes(data))
        rc, out, err = run("verify", "--json", bad)
        self.assertEqual(rc, 1)
        obj = json.loads(out)
        self.assertEqual((obj["ok"], obj["exit"]), (False, 1))
        self.assertEqual(obj["lbs"]["bad"], 1)
        self.assertEqual(obj["summary"], f"BAD: 1 of {info['lbs']['count']} locality blocks failed")
        self.assertEqual(obj["error"], f"{bad}: 1 of {info['lbs']['count']} locality blocks failed")
        (p,) = obj["problems"]
        self.assertEqual(sorted(p), ["error", "lb", "message", "offset", "seq", "stream", "what"])
        self.assertEqual((p["what"], p["lb"], p["error"]),
                         ("lb", 0, "locality block checksum mismatch"))
        self.assertTrue(err.startswith(f"{PROG}: verify: {bad}: LB 0 "), err)
        rc, out, _ = run("verify", bad)
        self.assertEqual((rc, out),
                         (1, f"BAD: 1 of {info['lbs']['count']} locality blocks failed\n"))

    # ---- 7: --progress ----

    def progress_lines(self, err, op):
        lines = [json.loads(l) for l in err.splitlines() if l.startswith("{")]
        self.assertTrue(lines, err)
        for l in lines:
            self.assertEqual((l["type"], l["op"]), ("progress", op))
            for k in ("elapsed_s", "percent", "bytes", "total_bytes", "faults",
                      "rate_bytes_per_s", "done"):
                self.assertIn(k, l)
        self.assertIs(lines[-1]["done"], True)
        self.assertEqual(lines[-1]["percent"], 100.0)
        self.assertEqual(lines[-1]["bytes"], lines[-1]["total_bytes"])
        self.assertIsNone(lines[-1]["faults"])
        self.assertEqual(sum(l["done"] for l in lines), 1)
        return lines

    def test_progress(self):
        rc, out, err = run("verify", "--progress=json", self.good)
        self.assertEqual(rc, 0)
        self.assertTrue(out.startswith("OK: "))
        self.progress_lines(err, "verify")
        # Default: quiet when stderr is not a terminal, as before.
        rc, _, err = run("verify", self.good)
        self.assertEqual((rc, err), (0, ""))
        rc, _, err = run("verify", "--progress=none", self.good)
        self.assertEqual((rc, err), (0, ""))
        out = self.p("p.hlt")
        rc, o, err = run("import", "--json", "--no-sync", "--progress=json", self.img,
                         "--region", "r", "-o", out)
        self.assertEqual(rc, 0, err)
        self.assertIs(json.loads(o)["ok"], True)
        self.assertEqual(self.progress_lines(err, "import")[-1]["total_bytes"], 64 * PAGE)
        rc, _, err = run("extract", "--progress=json", "-o", self.p("p.img"), out)
        self.assertEqual(rc, 0, err)
        self.progress_lines(err, "extract")
        rc, _, err = run("extract", "--progress", "-o", self.p("p.img"), out)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{PROG}: extract: {out}: 100.0% (", err)
        # Without --progress import and extract stay quiet but for their summary line.
        rc, _, err = run("extract", "-o", self.p("p.img"), out)
        self.assertEqual(len(err.splitlines()), 1)

    # ---- 8: the README's words ----

    def test_words(self):
        sparse = self.p("sparse.img")
        image(sparse, 64, holes=True)
        out = self.p("sparse.hlt")
        rc, _, err = run("import", "--no-sync", sparse, "--region", "r", "-o", out)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("untouched", err)
        self.assertIn("never touched", err)
        obj, _ = self.succeeds_json("info", "--json", out)
        if obj["mbs"]["untouched"] == 0:
            self.skipTest("this file system does not keep holes")
        for args in (["info", out], ["map", out], ["extract", "-o", self.p("s.img"), out]):
            rc, o, e = run(*args)
            self.assertEqual(rc, 0, e)
            self.assertNotIn("untouched", o + e, args)
            self.assertRegex(o + e, "never[ -]touched", args)
        for c in ("info", "map", "extract", "import"):
            _, h, _ = run(c, "--help")
            self.assertRegex(h, "never[ -]touched", c)


if __name__ == "__main__":
    if not HI or not os.access(HI, os.X_OK):
        print("SKIP: HALITE_INSPECT_BIN is not set", file=sys.stderr)
        sys.exit(77)
    r = unittest.main(exit=False, verbosity=1).result
    sys.exit(0 if r.wasSuccessful() else 1)
