#!/usr/bin/env python3
"""The test guest's pages: testing/guest-image/pages.c (PAGES_BIN, run on the host)
writes exactly the bytes halite_guest.page_bytes() says, for every one of
the 2000 pages; bad arguments are refused; the Gaussian request list is the
same for a seed and stays within the pages. Exit 0 pass, 1 fail, 2 usage.

    test_pages.py PAGES_BIN
"""
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import halite_guest as hg  # noqa: E402

failed = 0


def check(cond, msg):
    global failed
    print(("  ok: " if cond else "  FAIL: ") + msg, flush=True)
    if not cond:
        failed = 1


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    pages = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="halite-pages.") as d:
        out = os.path.join(d, "p")
        p = subprocess.run([pages, out], capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"pages {out}: exit {p.returncode} {p.stderr.strip()}")
        names = sorted(os.listdir(out)) if os.path.isdir(out) else []
        check(names == sorted(f"{i}.txt" for i in range(hg.PAGES)),
              f"{len(names)} files, /p/0.txt .. /p/{hg.PAGES - 1}.txt")
        bad = [i for i in range(hg.PAGES) if f"{i}.txt" in names and
               open(os.path.join(out, f"{i}.txt"), "rb").read() != hg.page_bytes(i)]
        check(not bad, f"every page has page_bytes()'s content (wrong: {bad[:5]})")
        sizes = [len(hg.page_bytes(i)) for i in range(hg.PAGES)]
        check(min(sizes) >= 4096 and max(sizes) <= 16384,
              f"sizes {min(sizes)}..{max(sizes)} within 4-16 KiB, {sum(sizes)} bytes in all")
        check(hg.page_bytes(7).startswith(b"halite page 7\n"), "a page names its number")
        p = subprocess.run([pages, os.path.join(d, "q"), "3"], capture_output=True, timeout=60)
        check(p.returncode == 0 and sorted(os.listdir(os.path.join(d, "q"))) ==
              ["0.txt", "1.txt", "2.txt"], "COUNT 3 writes three pages")
        for args, want in (([], "usage: pages DIR [COUNT]"),
                           ([d, "x"], "COUNT 'x' is not a number up to 100000"),
                           ([d, "100001"], "COUNT '100001' is not a number up to 100000")):
            p = subprocess.run([pages, *args], capture_output=True, text=True, timeout=60)
            check(p.returncode == 2 and want in p.stderr, f"pages {args}: exit 2, {want!r}")
        p = subprocess.run([pages, os.path.join(d, "none", "p")], capture_output=True, text=True,
                           timeout=60)
        check(p.returncode == 1 and "cannot make" in p.stderr, "a directory it cannot make: exit 1")
    a, b = hg.gaussian_pages(1000, 15), hg.gaussian_pages(1000, 15)
    check(a == b and a != hg.gaussian_pages(1000, 16), "the request list is a function of the seed")
    check(all(0 <= i < hg.PAGES for i in a) and 950 < sum(a) / len(a) < 1050,
          f"within the pages, mean {sum(a) / len(a):.0f} (1000 wanted)")
    s = hg.latency_summary([0.004, 0.001, 0.003, 0.002])
    check(s == {"n": 4, "mean_s": 0.0025, "p50_s": 0.002, "p99_s": 0.004, "max_s": 0.004},
          f"latency summary by nearest rank: {s}")
    print("FAIL" if failed else "PASS")
    return failed


if __name__ == "__main__":
    sys.exit(main())
