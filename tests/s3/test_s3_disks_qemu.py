#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A snapshot's frozen disk travels with it through the store (run_with_store.sh
exports the store): the QEMU test guest with a qcow2 disk is saved, pushed
(the disk flattened beside the snapshot, then its manifest, then the
snapshot), pulled back (FILE.disks/0.qcow2 the same content as the frozen
image), and then the local snapshot, the frozen image and the source's
overlay are deleted: only the store has them. Restores from the URL, through
bench/s3_proxy.py, which counts every request:

- the first fetches the disk into CACHE/disks/<uuid>/0.qcow2 (0600, dirs
  0700): memory digest exact, disk and memory agree; beyond the snapshot's
  own requests (--json's store), exactly the manifest's HEAD and GET and the
  disk's HEAD and GETs;
- the second, its cached copy with one byte flipped, refuses the copy and
  fetches it again, with the first's requests exactly;
- the third, with the disk's object deleted from the store, uses the cached
  copy: beyond the snapshot's requests exactly the manifest's two, no disk
  request, and agrees again; its -drive names a path that exists
  nowhere, and the drive's id finds the disk;
- one without --cache-dir fetches into a private cache, removed at its end;
- a restore of the snapshot pushed with --no-disks is refused, saying why.

  test_s3_disks_qemu.py SOURCE_DIR HALITE_QEMU HALITE_INSPECT

HALITE_TEST_DISK_FILL_MIB=N fills the disk's first N MiB with random data
before the guest boots (default 0: only what the guest writes), and the
times printed (push, pull, the first fetch, the cached copy's check) are
then those of a disk of that size: docs/object-store.md quotes them.

Exit 0 pass, 1 fail, 77 skip (no QEMU, no test guest, not root).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

SRC, HQ, HI = sys.argv[1:4]
sys.path.insert(0, os.path.join(SRC, "scripts"))
sys.path.insert(0, os.path.join(SRC, "bench"))
import halite_guest as hg  # noqa: E402
import s3_proxy  # noqa: E402  (its control() client)

PROXY = os.path.join(SRC, "bench", "s3_proxy.py")
PART = 8 << 20  # halite_s3_download_fd()'s default range


def check(cond, what):
    if not cond:
        raise hg.GuestError(what)
    print(f"ok: {what}")


class Proxy:
    def __init__(self):
        self.p = subprocess.Popen([sys.executable, PROXY, "--die-with-parent", "--upstream",
                                   os.environ["AWS_ENDPOINT_URL"], "--rtt-ms", "0"],
                                  stdout=subprocess.PIPE, text=True)
        info = json.loads(self.p.stdout.readline())
        self.endpoint, self.ctl = info["endpoint"], info["control"]

    def cmd(self, line):
        return s3_proxy.control(self.ctl, line)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def restore(work, name, image, url, cache, proxy):
    """A restore of @url through @proxy with --cache-dir @cache, the command line
    naming the disk @image (the saving host's path, or any): (guest, report,
    requests through the proxy)."""
    dst = hg.Guest(work, name).private_ram().with_disk("drive", image)
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint, TMPDIR=work)
    proxy.cmd("zero")
    p = subprocess.run([HQ, "restore", "--detach", "--json", "-q",
                        *(["--cache-dir", cache] if cache else []),
                        "--disk-dir", work, url, "--", "qemu-system-x86_64", *dst.args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=600, env=env)
    if p.returncode:
        print(p.stderr, file=sys.stderr)
        raise hg.GuestError(f"{name}: halite-qemu restore {url} failed (exit {p.returncode})")
    rep = json.loads(p.stdout)
    dst.adopt(rep["qemu"]["pid"])
    rep["stderr"] = p.stderr
    return dst, rep, proxy.cmd("stats")["requests"]


def agrees(g, digest, at):
    d2, _, ok = g.digest()
    check(ok and d2 == digest, f"{g.name}: memory digest {d2} is the snapshot's {digest}")
    d, m1, m2, ok = g.disklog()
    check(ok and m1 >= at, f"{g.name}: disk {d}, memory {m1}..{m2} agree, counting on from "
          f"the snapshot's {at}")


def delete(url):
    """DELETE of @url (s3://BUCKET/KEY) with curl, which signs it (SigV4)."""
    e = os.environ
    p = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                        "--max-time", "60", "-X", "DELETE",
                        "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                        "--aws-sigv4", f"aws:amz:{e['AWS_REGION']}:s3",
                        "--user", f"{e['AWS_ACCESS_KEY_ID']}:{e['AWS_SECRET_ACCESS_KEY']}",
                        f"{e['AWS_ENDPOINT_URL']}/{url[5:]}"],
                       stdout=subprocess.PIPE, text=True, timeout=90)
    check(p.returncode == 0 and p.stdout == "204", f"DELETE {url}: HTTP {p.stdout}")


def main():
    os.environ["HALITE_QEMU_BIN"] = HQ
    why = hg.bench_prerequisites(None, [HQ, HI])
    if why:
        print(f"SKIP: {why}")
        return 77
    url = f"s3://{os.environ['HALITE_TEST_BUCKET']}/s3disks-qemu-{os.getpid()}.hlt"
    work = hg.make_workdir("halite-s3-disks.")
    path = os.path.join(work, "guest.hlt")
    image = os.path.join(work, "disk.qcow2")
    cache = os.path.join(work, "cache")
    guests, proxy = [], None
    try:
        fill = int(os.environ.get("HALITE_TEST_DISK_FILL_MIB", "0"))
        vsize = max(64, fill + 64) << 20
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", image, str(vsize)],
                       check=True)
        if fill:
            # Random past the guest's sector 0, which disklog writes.
            raw = os.path.join(work, "fill.raw")
            with open(raw, "wb") as f:
                for _ in range(fill):
                    f.write(os.urandom(1 << 20))
            subprocess.run(["qemu-img", "convert", "-n", "-f", "raw", "--target-image-opts",
                            raw,
                            f"driver=raw,offset={1 << 20},size={fill << 20},"
                            f"file.driver=qcow2,file.file.filename={image}"], check=True)
            os.unlink(raw)
        src = hg.Guest(work, "source").private_ram().with_disk("drive", image)
        guests.append(src)
        src.boot().wait_ready()
        src.rewrites(False)
        d0, _, _, ok = src.disklog()
        check(ok and d0 > 0, f"the source counts on its disk ({d0})")
        digest, _, ok = src.digest()
        check(ok, "the verifier's digest before the save")
        p = subprocess.run([HQ, "save", "--json", "--qmp", src.qmp_path, "-q", path],
                           stdout=subprocess.PIPE, check=True, timeout=600, text=True)
        saved = json.loads(p.stdout)["disks"]
        check(len(saved) == 1 and saved[0]["frozen"], f"the save froze {image}")
        src.kill()
        # What the frozen image held at the snapshot: disklog's count in its sector 0.
        out = os.path.join(work, "sector0")
        subprocess.run(["qemu-img", "dd", "-U", "-f", "qcow2", "-O", "raw", "bs=512",
                        "count=1", f"if={image}", f"of={out}"], check=True)
        with open(out, "rb") as f:
            at = int(f.read(512).split(b"\n")[0].split()[1])

        t = time.monotonic()
        p = subprocess.run([HI, "push", "--json", path, url], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600,
                           env=dict(os.environ, TMPDIR=work))
        check(p.returncode == 0, f"push {url}: {p.stderr.strip()}")
        pushed = json.loads(p.stdout)["disks"]
        print(f"time: push {time.monotonic() - t:.2f} s (the disk {pushed[0]['bytes']} bytes "
              f"flattened, hashed and uploaded, and the snapshot)")
        check(len(pushed) == 1 and pushed[0]["index"] == 0 and pushed[0]["bytes"] > 0,
              f"push uploaded the disk: {pushed}")
        check(not glob.glob(os.path.join(work, "halite-push-*")),
              "push left no flattened copy behind")

        pulled = os.path.join(work, "pulled.hlt")
        t = time.monotonic()
        p = subprocess.run([HI, "pull", "--json", url, pulled], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600)
        check(p.returncode == 0, f"pull {url}: {p.stderr.strip()}")
        print(f"time: pull {time.monotonic() - t:.2f} s")
        pdisk = os.path.join(pulled + ".disks", "0.qcow2")
        check(os.stat(pdisk).st_mode & 0o777 == 0o600 and
              os.stat(pulled + ".disks").st_mode & 0o777 == 0o700,
              "pull wrote FILE.disks/0.qcow2 0600 in a 0700 directory")
        with open(os.path.join(pulled + ".disks", "manifest.json")) as f:
            man = json.load(f)
        check(man["disks"][0]["sha256"] == hg.sha256_file(pdisk) == pushed[0]["sha256"] and
              int(man["disks"][0]["size"]) == os.path.getsize(pdisk),
              "the pulled disk is the manifest's (size, SHA-256)")
        info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", pdisk],
                                         stdout=subprocess.PIPE, check=True).stdout)
        check("backing-filename" not in info and info["virtual-size"] == vsize,
              f"the pushed disk is self-contained (no backing file), {vsize >> 20} MiB to the "
              "guest")
        r = subprocess.run(["qemu-img", "compare", "-U", "-f", "qcow2", "-F", "qcow2", image,
                            pdisk], stdout=subprocess.PIPE, text=True)
        check(r.returncode == 0, "the pushed disk holds what the frozen image held")

        # The snapshot alone (--no-disks), for a restore elsewhere to refuse below.
        alone = url + ".alone"
        p = subprocess.run([HI, "push", "--json", "--no-disks", path, alone],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=600)
        check(p.returncode == 0 and json.loads(p.stdout)["disks"] == [],
              f"push --no-disks sent the snapshot alone: {p.stderr.strip()}")

        # Only the store has the snapshot and its disk from now on.
        for f in (path, pulled, image, saved[0]["overlay"]):
            os.unlink(f)
        shutil.rmtree(pulled + ".disks")

        proxy = Proxy()
        dst, rep, req = restore(work, "r1", image, url, cache, proxy)
        guests.append(dst)
        disk = rep["disks"][0]
        cached = glob.glob(os.path.join(cache, "disks", "*", "0.qcow2"))
        check(len(cached) == 1 and disk["cached_image"] == cached[0] and
              disk["source"] == "store" and disk["bytes_fetched"] == pushed[0]["bytes"],
              f"r1 fetched the disk from the store into {cached}: {disk}")
        st = os.stat(cached[0])
        check(st.st_mode & 0o777 == 0o600 and
              os.stat(os.path.dirname(cached[0])).st_mode & 0o777 == 0o700 and
              os.stat(os.path.join(cache, "disks")).st_mode & 0o777 == 0o700,
              "the cached disk is 0600, its directories 0700")
        gets = (pushed[0]["bytes"] + PART - 1) // PART
        extra1 = req - rep["store"]["requests"]
        check(extra1 == 2 + 1 + gets, f"r1: {extra1} requests beyond the snapshot's: the "
              f"manifest's HEAD and GET, the disk's HEAD and {gets} GETs")
        print(f"time: r1 fetched and checked the disk in {disk['fetch_s']:.3f} s; resumed at "
              f"{rep['resumed_ms']:.0f} ms")
        agrees(dst, digest, at)
        dst.kill()

        # One byte flipped in the cached copy: refused, fetched again (the same requests).
        with open(cached[0], "r+b") as f:
            f.seek(os.path.getsize(cached[0]) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x40]))
        dst, rep, req = restore(work, "r2", image, url, cache, proxy)
        guests.append(dst)
        disk = rep["disks"][0]
        check(disk["source"] == "store" and disk["cache_damaged"] and
              "failed its check" in rep["stderr"] and hg.sha256_file(cached[0]) == pushed[0]["sha256"]
              and req - rep["store"]["requests"] == extra1,
              f"r2 refused the damaged copy and fetched it again: {disk}")
        agrees(dst, digest, at)
        dst.kill()

        # No cache named: a private one, gone once the restore is over (QEMU keeps the
        # image it opened).
        dst, rep, req = restore(work, "nocache", image, url, None, proxy)
        guests.append(dst)
        disk = rep["disks"][0]
        check(disk["source"] == "store" and not glob.glob(os.path.join(work, "halite-disks-*")),
              f"without --cache-dir the disk came from the store into a private cache, "
              f"removed at the end: {disk['cached_image']}")
        agrees(dst, digest, at)
        dst.kill()

        # The disk's object gone from the store: a restore that asked for it would fail.
        delete(url + ".disks/0.qcow2")
        # Its command line names another path, nowhere: the drive's id finds the disk.
        dst, rep, req = restore(work, "r3", os.path.join(work, "nowhere", "other.qcow2"), url,
                                cache, proxy)
        guests.append(dst)
        disk = rep["disks"][0]
        extra3 = req - rep["store"]["requests"]
        print(f"time: r3 checked the cached disk in {disk['fetch_s']:.3f} s; resumed at "
              f"{rep['resumed_ms']:.0f} ms")
        check(disk["source"] == "cache" and disk["bytes_fetched"] == 0 and extra3 == 2,
              f"r3 used the cached disk: {extra3} requests beyond the snapshot's, the "
              f"manifest's HEAD and GET, no disk request; the store no longer has it: {disk}")
        agrees(dst, digest, at)
        dst.kill()

        # Without disks in the store, and the frozen image gone: refused, saying why.
        g = hg.Guest(work, "alone").private_ram().with_disk("drive", image)
        p = subprocess.run([HQ, "restore", "--detach", "-q", "--cache-dir", cache, alone, "--",
                            "qemu-system-x86_64", *g.args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600)
        check(p.returncode != 0 and "pushed with --no-disks?" in p.stderr and
              "disk.qcow2" in p.stderr, f"a restore of {alone} is refused: {p.stderr.strip()}")
        for g in guests:
            g.check_console()
        print("PASS")
        return 0
    except (hg.GuestError, subprocess.SubprocessError, KeyError, ValueError, OSError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        for g in guests:
            g.kill()
        if proxy:
            proxy.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
