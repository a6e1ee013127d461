#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""halite-qemu restore of a snapshot at s3://BUCKET/KEY (run_with_store.sh
exports the store): the QEMU test guest is saved to a local file, pushed,
and restored lazily from the URL into a new QEMU; the restored guest's
memory digest equals the snapshot's and its verifier keeps passing. The
local file is removed before the restore: every byte comes from the store.

  test_s3_read_qemu.py SOURCE_DIR HALITE_QEMU HALITE_INSPECT

Exit 0 pass, 1 fail, 77 skip (no QEMU, no test guest, not root).
"""
import json
import os
import shutil
import subprocess
import sys

SRC, HQ, HI = sys.argv[1:4]
sys.path.insert(0, os.path.join(SRC, "scripts"))
import halite_guest as hg  # noqa: E402


def main():
    os.environ["HALITE_QEMU_BIN"] = HQ
    why = hg.bench_prerequisites(None, [HQ, HI])
    if why:
        print(f"SKIP: {why}")
        return 77
    url = f"s3://{os.environ['HALITE_TEST_BUCKET']}/s3read-qemu-{os.getpid()}.hlt"
    work = hg.make_workdir("halite-s3-qemu.")
    path = os.path.join(work, "guest.hlt")
    src = dst = None
    try:
        src = hg.Guest(work, "source").private_ram()
        src.boot().wait_ready()
        src.rewrites(False)
        digest, _, ok = src.digest()
        if not ok:
            src.fail("the verifier's digest differs before the save")
        subprocess.run([HQ, "save", "--qmp", src.qmp_path, "-q", path], check=True, timeout=600)
        src.kill()
        subprocess.run([HI, "push", path, url], check=True, timeout=600,
                       stderr=subprocess.DEVNULL)
        os.unlink(path)  # what is restored can only come from the store
        dst = hg.Guest(work, "restored").private_ram()
        p = subprocess.run([HQ, "restore", "--detach", "--json", "-q", url, "--",
                            "qemu-system-x86_64", *dst.args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=600)
        if p.returncode:
            print(p.stderr, file=sys.stderr)
            raise hg.GuestError(f"halite-qemu restore {url} failed (exit {p.returncode})")
        rest = json.loads(p.stdout)
        dst.adopt(rest["qemu"]["pid"])
        d2, _, ok2 = dst.digest()
        st = dst.status()
        print(f"restored from {url}: digest {d2} (snapshot {digest}), "
              f"{rest['lb_demand']} demand + {rest['lb_prefetch']} prefetched LBs, "
              f"first resume {rest['resumed_ms']:.0f} ms")
        if not ok2 or d2 != digest:
            raise hg.GuestError(f"restored digest {d2}, the snapshot's was {digest}")
        if st["ok"] != "1" or st["mismatches"] != "0":
            raise hg.GuestError(f"the verifier fails after the restore: {st}")
        if rest["lb_demand"] + rest["lb_prefetch"] == 0:
            raise hg.GuestError("the restore read no locality block")
        # --json's store: every LB came from the store (no cache: null), and the
        # prefetcher's came several to a GET.
        store = rest["store"]
        lbs = rest["lb_demand"] + rest["lb_prefetch"]
        print(f"store: {store}")
        if not store or store["cache"] is not None or not 0 < store["requests"] < lbs + 4:
            raise hg.GuestError(f"--json's store for {lbs} LBs read: {store}")
        if store["bytes"] < lbs * 4096:
            raise hg.GuestError(f"--json's store: {store['bytes']} bytes for {lbs} LBs")
        print("PASS")
        return 0
    except (hg.GuestError, subprocess.SubprocessError, KeyError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        for g in (src, dst):
            if g is not None:
                g.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
