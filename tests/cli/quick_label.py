#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The quick label keeps its promise: `ctest -L quick` (scripts/test.sh
--quick) runs only tests that need no root, QEMU, huge pages or network.

- some tests are labelled quick, and none of them is also labelled qemu or
  reliability (those boot guests, kill handlers or need root);
- none of them takes the huge-page lock or runs alone (RUN_SERIAL): both
  mark tests that reserve huge pages or boot guests;
- `scripts/test.sh --help` names --quick, and --release for the old meaning.
"""
import json
import os
import subprocess
import sys

SRC = os.environ.get("HALITE_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("HALITE_BINARY_DIR", os.path.join(SRC, "build"))
FORBIDDEN = ("qemu", "reliability")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def props(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def main():
    r = subprocess.run(["ctest", "--test-dir", BUILD, "--show-only=json-v1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if r.returncode != 0:
        print("ctest --show-only=json-v1 failed:", r.stderr.strip())
        return 1
    tests = json.loads(r.stdout)["tests"]
    quick = [t for t in tests if "quick" in props(t).get("LABELS", [])]
    check(quick, "no test is labelled quick")
    for t in quick:
        p = props(t)
        labels = p.get("LABELS", [])
        for bad in FORBIDDEN:
            check(bad not in labels, f"{t['name']} is labelled quick and {bad}")
        check("hugepages" not in p.get("RESOURCE_LOCK", []),
              f"{t['name']} is labelled quick but takes the hugepages lock")
        check(not p.get("RUN_SERIAL", False),
              f"{t['name']} is labelled quick but runs alone (RUN_SERIAL)")
    print(f"{len(quick)} of {len(tests)} tests labelled quick")

    r = subprocess.run(["bash", os.path.join(SRC, "scripts", "test.sh"), "--help"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(r.returncode == 0, f"scripts/test.sh --help exits {r.returncode}")
    for flag in ("--quick", "--release"):
        check(flag in r.stdout, f"scripts/test.sh --help does not name {flag}")

    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
