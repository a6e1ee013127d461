#!/usr/bin/env python3
"""The main job on a real VM: boot the QEMU test guest as most VMs run (QEMU's
default RAM, -m alone, and a qcow2 disk it keeps writing), save it lazily while
it runs (halite-qemu save, which freezes the disk at the same instant), restore
it lazily into a new QEMU with the same command line (halite-qemu restore, on
a new overlay of the frozen disk), measure what a client sees (the first
answer on a connection held from the restore's start, then 1000 requests for
the guest's pages, spread as a Gaussian over its 2000, every answer checked),
check the guest from inside, and print a short report.

  scripts/demo_qemu.py [--keep DIR] [--codec NAME] [--requests N] [--json]

Run through scripts/demo.sh, which builds everything and the guest first.
Exit 0 when the restored guest's memory digest equals the snapshot's, its
verifier keeps passing, and its disk agrees with its memory; 1 otherwise.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import halite_guest as hg  # noqa: E402


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", metavar="DIR", help="keep the snapshot and consoles in DIR")
    ap.add_argument("--codec", default="lz4", help="none, lz4 (default), zlib, zstd")
    ap.add_argument("--requests", type=int, default=1000,
                    help="page requests after the first answer (1000; seed 15, sigma 300 "
                    "over the guest's 2000 pages, as bench/qemu.py)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    a = ap.parse_args()
    work = a.keep or hg.make_workdir("halite-demo.")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "guest.hlt")
    src = dst = None
    try:
        disk = os.path.join(work, "disk.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "64M"], check=True)
        say("demo: booting the test guest (TCG, 2 vCPUs, -m 512M, a qcow2 disk)")
        t = time.monotonic()
        src = hg.Guest(work, "source").private_ram().with_disk("drive", disk)
        src.boot().wait_ready()
        say(f"demo: guest up in {time.monotonic() - t:.1f} s; verifier passing, HTTP answering, "
            "disklog writing its disk")
        src.rewrites(False)
        digest, uptime, ok = src.digest()
        if not ok:
            src.fail("the verifier's digest differs before the save")
        say(f"demo: memory digest {digest} (rewrites frozen); saving while the verifier runs")
        p = subprocess.run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "--codec", a.codec,
                            "--json", path], stdout=subprocess.PIPE, text=True, timeout=600)
        if p.returncode:
            raise hg.GuestError(f"halite-qemu save failed (exit {p.returncode})")
        save = json.loads(p.stdout)
        frozen = save["disks"][0]
        if not frozen["frozen"]:
            raise hg.GuestError("halite-qemu save did not freeze the disk")
        src.kill()
        say("demo: restoring into a new QEMU, with the same command line")
        dst = hg.Guest(work, "restored").private_ram().with_disk("drive", disk)
        t0 = time.monotonic()
        proc = subprocess.Popen([hg.halite_qemu(), "restore", "--detach", "--track-access",
                                 "--json", path, "--", "qemu-system-x86_64", *dst.args],
                                stdout=subprocess.PIPE, text=True)
        # One connection opened as soon as the port accepts it and held, the
        # request sent once, as bench/qemu.py measures it: what a client of the
        # restored guest sees.
        _, t_ans, status, _ = hg.held_get(
            dst.port, "/hello.txt", t0 + 120,
            alive=lambda: None if proc.poll() in (None, 0) else "halite-qemu restore failed")
        if status != 200:
            raise hg.GuestError(f"GET /hello.txt: HTTP {status}")
        first_http = t_ans - t0
        # Then the client's requests, each page's bytes checked; the restore
        # may still be bringing memory in.
        pages = hg.gaussian_pages(a.requests, 15)
        t_req = time.monotonic()
        got = hg.page_requests(dst.port, pages, t_req + 600)
        requests = hg.latency_summary(got["latencies_s"]) if pages else None
        if requests:
            requests.update(start_s=round(t_req - t0, 3),
                            end_s=round(time.monotonic() - t0, 3), bytes=got["bytes"])
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise hg.GuestError(f"halite-qemu restore failed (exit {proc.returncode})")
        rest = json.loads(out)
        dst.adopt(rest["qemu"]["pid"])
        d2, up2, ok2 = dst.digest()
        dcount, m1, m2, disk_ok = dst.disklog()
        dst.rewrites(True)
        time.sleep(1.5)
        st = dst.status()
        dst.check_console()
        overlay = rest["disks"][0]["overlay"] if rest["disks"] else None
        good = (ok2 and d2 == digest and st["ok"] == "1" and st["mismatches"] == "0" and
                disk_ok and overlay is not None)
        res = {"ok": good, "save": save, "restore": rest, "first_http_s": first_http,
               "requests": requests,
               "disk_count": dcount, "disk_memory_count": [m1, m2], "disk_ok": disk_ok,
               "digest_before": digest, "digest_after": d2, "uptime_before": uptime,
               "uptime_after": up2, "verifier_passes": int(st["passes"])}
        if a.json:
            print(json.dumps(res, indent=1))
        else:
            mib = save["memory_bytes"] >> 20
            print(f"halite-qemu: lazy save and lazy restore of a running QEMU guest "
                  f"(QEMU {save['qemu']['version']}, {save['qemu']['machine']}, "
                  f"{save['qemu']['vcpus']} vCPUs, {mib} MiB)")
            print(f"  pause            {save['pause_ms']:.1f} ms (the guest ran on while saved)")
            print(f"  save time        {save['save_s']:.2f} s, {save['faults']} first-touch faults "
                  f"saved {save['faults_vcpu'] + save['faults_other']} blocks "
                  f"({save['faults_vcpu']} by vCPUs)")
            print(f"  file             {save['file_bytes'] / 2**20:.1f} MiB, "
                  f"{100 * save['ratio']:.1f}% of memory ({save['mb_stored']} blocks stored, "
                  f"{save['mb_zero'] + save['mb_untouched']} zero or never touched)")
            print(f"  time to resume   {rest['ready_to_resume_ms']:.1f} ms after QEMU was ready "
                  f"({rest['resumed_ms']:.0f} ms after the command started)")
            print(f"  first HTTP reply {first_http:.2f} s after the command started (one connection "
                  f"opened at once and held)")
            if requests:
                print(f"  page requests    {requests['n']} from {requests['start_s']:.2f} s to "
                      f"{requests['end_s']:.2f} s, each on a new connection, every page's bytes "
                      f"checked: mean {requests['mean_s'] * 1e3:.1f} ms, p50 "
                      f"{requests['p50_s'] * 1e3:.1f} ms, p99 {requests['p99_s'] * 1e3:.1f} ms, "
                      f"max {requests['max_s'] * 1e3:.1f} ms")
            print(f"  all memory in    {rest['done_s']:.2f} s after resume; {rest['faults']} "
                  f"faults ({rest['faults_vcpu']} vCPU), {rest['lb_demand']} demand + "
                  f"{rest['lb_prefetch']} prefetched LBs")
            va = rest["vm_access_pct"]
            print(f"  VM access        {va:.1f}% of the other blocks of demand-read LBs were used"
                  if va is not None and va >= 0 else "  VM access        not measured")
            print(f"  disk             {os.path.basename(frozen['image'])} frozen at the snapshot; the "
                  f"restore runs on {os.path.basename(overlay or '(none)')}")
            print(f"  guest check      digest {d2} {'equals' if d2 == digest else 'DIFFERS from'} "
                  f"the snapshot's; uptime {uptime:.1f} -> {up2:.1f} s; verifier "
                  f"{'passing' if st['ok'] == '1' else 'FAILING'}, {st['mismatches']} mismatches; "
                  f"disk count {dcount} {'agrees with' if disk_ok else 'DIFFERS from'} memory's "
                  f"{m2}")
            print("  result           " + ("ok" if good else "FAILED"))
        return 0 if good else 1
    except (hg.GuestError, subprocess.TimeoutExpired) as e:
        say(f"demo: FAILED: {e}")
        return 1
    finally:
        for g in (src, dst):
            if g is not None:
                g.kill()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
