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

FORBIDDEN = ("qemu", "reliability")


def props(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def label_problems(build):
    """What is wrong with the quick label in @build's tests, one line each."""
    r = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    if r.returncode != 0:
        return ["ctest --show-only=json-v1: " + r.stderr.strip()]
    tests = json.loads(r.stdout)["tests"]
    quick = [t for t in tests if "quick" in props(t).get("LABELS", [])]
    print(f"{len(quick)} of {len(tests)} tests labelled quick")
    found = [] if quick else ["no test is labelled quick"]
    for t in quick:
        p = props(t)
        found += [f"{t['name']} is labelled quick and {bad}"
                  for bad in FORBIDDEN if bad in p.get("LABELS", [])]
        if "hugepages" in p.get("RESOURCE_LOCK", []):
            found.append(f"{t['name']} is labelled quick but takes the hugepages lock")
        if p.get("RUN_SERIAL", False):
            found.append(f"{t['name']} is labelled quick but runs alone (RUN_SERIAL)")
    return found


def help_problems(src):
    """What scripts/test.sh --help fails to say."""
    r = subprocess.run(["bash", os.path.join(src, "scripts", "test.sh"), "--help"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    found = [] if r.returncode == 0 else [f"scripts/test.sh --help exits {r.returncode}"]
    return found + [f"scripts/test.sh --help does not name {flag}"
                    for flag in ("--quick", "--release") if flag not in r.stdout]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.environ.get("HALITE_SOURCE_DIR") or os.path.dirname(os.path.dirname(here))
    build = os.environ.get("HALITE_BINARY_DIR") or os.path.join(src, "build")
    found = label_problems(build) + help_problems(src)
    for what in found:
        print("FAIL:", what)
    print(f"{len(found)} failure(s)" if found else "ok")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
