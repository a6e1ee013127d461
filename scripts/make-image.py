#!/usr/bin/env python3
"""Write a guest-memory-like raw image for demos and experiments.

Memory is laid out in runs of 2 MiB "regions of use", each one of: never
touched (a hole in a sparse file), zeroed, machine code (bytes of the host's
shared libraries), text, page-table-like structures, or random (already
compressed) data. Deterministic for a given --seed.
"""
import argparse
import glob
import os
import random

PAGE = 4096
RUN = 2 << 20


def code_source():
    data = bytearray()
    for path in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*"))[:40]:
        try:
            with open(path, "rb") as f:
                data += f.read(4 << 20)
        except OSError:
            continue
        if len(data) >= 32 << 20:
            break
    return bytes(data) or os.urandom(1 << 20)


def text_page(rng):
    words = ("the guest kernel maps memory pages into virtual address spaces and "
             "restores them lazily from locality blocks on demand while vcpus run").split()
    out = []
    n = 0
    while n < PAGE:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return (" ".join(out)).encode()[:PAGE]


def pt_page(rng):
    # 512 entries: mostly empty, some present entries pointing at nearby frames.
    out = bytearray(PAGE)
    base = rng.randrange(1 << 20) << 12
    for i in range(512):
        if rng.random() < 0.3:
            v = (base + i * PAGE) | 0x63
            out[i * 8:i * 8 + 8] = v.to_bytes(8, "little")
    return bytes(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=256, help="MiB (default 256)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    code = code_source()
    total = a.size << 20
    kinds = ["hole", "zero", "code", "text", "pagetable", "random"]
    weights = [25, 15, 25, 15, 5, 15]
    with open(a.output, "wb") as f:
        f.truncate(total)
        for run in range(0, total, RUN):
            kind = rng.choices(kinds, weights)[0]
            if kind == "hole":
                continue
            f.seek(run)
            for off in range(0, min(RUN, total - run), PAGE):
                if kind == "zero":
                    page = bytes(PAGE)
                elif kind == "code":
                    s = rng.randrange(0, len(code) - PAGE)
                    page = code[s:s + PAGE]
                elif kind == "text":
                    page = text_page(rng)
                elif kind == "pagetable":
                    page = pt_page(rng)
                else:
                    page = rng.randbytes(PAGE)
                f.write(page)


if __name__ == "__main__":
    main()
