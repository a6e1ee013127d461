#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Deterministic guest-memory images for the halite-inspect tests.

Each page is one of:
  r  random bytes (incompressible)
  t  text-like words (compresses well)
  m  mixed: half random, half a repeating pattern
  z  zeros, written (allocated on disk: must import as a *zero* block)
  h  a hole (never written: must import as an *untouched* block)

The kinds come from --layout, a string repeated over the pages (so the test
knows exactly which pages are what), or from --mix, weights drawn with a
seeded PRNG. The same arguments always give the same bytes.

With --expect MB_PAGES[,MB_PAGES...] it prints, as JSON, the block counts an
import must produce: a memory block whose pages are all holes is untouched,
one whose pages are all zero or holes is zero, anything else is stored.

Exit status 3 when --layout asks for holes and the file system did not keep
them (the caller skips the sparse test then).
"""
import argparse
import json
import os
import random
import sys

WORDS = [b"halite", b"locality", b"block", b"memory", b"restore", b"guest", b"page",
         b"fault", b"vcpu", b"stream", b"kernel", b"the", b"of", b"and", b"snapshot"]


def page_bytes(kind, size, rng):
    if kind == "r":
        return rng.randbytes(size)
    if kind == "t":
        out = bytearray()
        while len(out) < size:
            out += rng.choice(WORDS) + b" "
        return bytes(out[:size])
    if kind == "m":
        half = size // 2
        pat = bytes((i * 7) & 0xff for i in range(64))
        return rng.randbytes(half) + (pat * (size // 64 + 1))[:size - half]
    if kind == "z":
        return bytes(size)
    raise ValueError(kind)


def kinds_for(args):
    if args.layout:
        lay = args.layout
        return [lay[i % len(lay)] for i in range(args.pages)]
    rng = random.Random(args.seed ^ 0x5eed)
    weights = {}
    for part in args.mix.split(","):
        k, w = part.split("=")
        weights[k] = float(w)
    ks = list(weights)
    return rng.choices(ks, [weights[k] for k in ks], k=args.pages)


def holes_of(path, length):
    """Byte ranges the file system reports as holes."""
    holes = []
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < length:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                holes.append((pos, length))
                break
            if d > pos:
                holes.append((pos, d))
            h = os.lseek(fd, d, os.SEEK_HOLE)
            pos = h
    finally:
        os.close(fd)
    return holes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--pages", type=int, required=True)
    ap.add_argument("--page-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layout")
    ap.add_argument("--mix", default="r=2,t=3,m=2,z=1")
    ap.add_argument("--expect")
    args = ap.parse_args()

    kinds = kinds_for(args)
    rng = random.Random(args.seed)
    ps = args.page_size
    with open(args.out, "wb") as f:
        f.truncate(args.pages * ps)
        for i, k in enumerate(kinds):
            if k == "h":
                continue
            f.seek(i * ps)
            f.write(page_bytes(k, ps, rng))
        f.flush()
        os.fsync(f.fileno())

    if "h" in kinds:
        want = set(i for i, k in enumerate(kinds) if k == "h")
        got = set()
        for a, b in holes_of(args.out, args.pages * ps):
            got.update(range((a + ps - 1) // ps, b // ps))
        if got != want:
            print("file system did not keep the holes", file=sys.stderr)
            sys.exit(3)

    if args.expect:
        res = {}
        for mbp in (int(x) for x in args.expect.split(",")):
            c = {"stored": 0, "zero": 0, "untouched": 0, "count": 0}
            for m in range(0, args.pages, mbp):
                ks = set(kinds[m:m + mbp])
                c["count"] += 1
                if ks == {"h"}:
                    c["untouched"] += 1
                elif ks <= {"h", "z"}:
                    c["zero"] += 1
                else:
                    c["stored"] += 1
            res[str(mbp)] = c
        json.dump(res, sys.stdout)
        print()


if __name__ == "__main__":
    main()
