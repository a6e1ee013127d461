#!/usr/bin/env python3
"""End-to-end tests of halite-qemu on the real test guest (issue 6).

  test_qemu.py CASE      CASE: cli, save-restore, exact, kill, errors, 4g, backends,
                               runstate, discard, attach, private, disks,
                               network, recorded, libvirt, video, enospc, bypass,
                               learn

Each case boots its own guest (scripts/make-guest.sh built it: Debian's
kernel, busybox initramfs, the memory verifier, httpd; 2 vCPUs, TCG,
512 MiB on a shared memfd) and checks, from inside the guest and from
outside:
- save-restore: a guest saved while its verifier runs, restored in a new
  QEMU (the file records QEMU's command line and devices): the verifier
  keeps passing, uptime continues from the snapshot, the
  digest of its memory after the restore equals the one at the snapshot
  instant (rewrites frozen around it); the file's per-vCPU streams are
  non-empty for both vCPUs and its guest-virtual stream exists; the source
  guest runs on unharmed after the save.
- exact: a restore left paused (nothing but the restore writes guest RAM):
  every byte of QEMU's RAM equals the file's memory once done.
- kill: halite-qemu save killed (SIGKILL) or cancelled (SIGINT) halfway: the
  guest runs on with its memory unchanged (an older file at the path is
  unchanged, the partial file removed);
  halite-qemu killed (SIGKILL) during a restore: QEMU lives, its vCPU
  threads sit blocked in userfaultfd, the guest answers nothing and its
  console reports no bad data; SIGTERM during a restore stops it and QEMU.
- 4g: 4 GiB of RAM, split by q35 below and above 4 GiB: two regions, the
  digest after the restore equals the snapshot's.
- backends: guest RAM on a file on tmpfs, saved and restored; on 2 MiB huge
  pages (memfd hugetlb=on), saved and restored onto a memfd (a restore onto
  huge pages is refused, exit 77); each time the digest survives.
- cli: wrong arguments, files that are not halite-qemu snapshots, a QEMU
  older than 7.2 (exit 77); a recorded command line replayed, compared and
  refused for sockets, host ports and memory files in use, all before any
  QEMU starts (a stand-in binary records what it was given).
- errors: a private mapping of a file (memory-backend-file share=off), and
  ptrace refused (another tracer holds QEMU), are refused with a clear error
  and the guest runs on; a restore with other memory or devices is refused
  by the command-line check before QEMU starts, and without it by QEMU's RAM
  or devices, and that QEMU is gone; QEMU's own refusal of its command line
  is shown; a locality block with a flipped byte fails the restore naming it
  and QEMU is killed, never running on bad data; so does one that QEMU reads
  while it loads the device state, at once (the engine's error, not a QMP
  timeout).
- network: a connection held from the restore's start is answered within a
  second of the resume (e1000, e1000e, virtio-net-pci; -nic and -netdev
  forms); a udp forward reaches the guest.
- recorded: the command line, directory and devices a save records; restores
  that run them with no QEMU arguments; a restored QEMU's save records the
  user's command line; a differing one refused before QEMU starts; a device
  hot-plugged at the source named, and restored when given.
- video: the guest writes patterns into its VGA's video memory (outside the
  memory backends); a save copies it at the snapshot instant (a region of
  its own, named in qemu.device-ram); what the source writes after the save
  is not in the file; a paused restore's QEMU holds the file's video memory
  byte for byte before the guest runs, and the guest reads it; the memory
  digest survives; -vga none or other video memory is refused; a -vga none
  VM's file (no video memory) restores as before.
- enospc: a save onto a file system that fills up (a 2 MiB tmpfs): exit 1,
  one sentence on stderr naming the file once (and the same in --json's
  "error"), no partial file, the guest running on with its memory digest
  unchanged.
- bypass: save and restore --bypass-cache: the file's pages stay out of the
  page cache (fincore), where a save or restore without it leaves them in;
  the success reports are one JSON object with "ok" true and every value
  known; --progress=json lines on stderr, the last "done".

- learn: the learning loop (issue 17). A restore with --learn (a 4 s
  window) while a client fetches known pages (every byte checked): a
  version 2 trace of first touches, the digest intact; halite-inspect
  relayout of the file from it: metadata traces=1, the source's uuid, the
  same extracted image; the relayouted file restored while the client
  fetches the pages again: the digest intact, lb_hot > 0: the hot-prefix
  LBs its trace says were prefetched, bar those readahead read (exactly
  them when no fault read an LB; halite-inspect restore agrees); restored
  with --hot-prefix 0: lb_hot 0, the digest intact.

- runstate: every way out of a save leaves the guest in the run state it
  had (query-status), its memory digest unchanged, whatever became of stop
  and cont (HALITE_QEMU_TEST_FAULT: QEMU hung at the stop, a stop's or
  cont's reply lost, a cont that never arrived, a failure before arm); a
  QEMU hung past halite-qemu's patience is reported ("the guest may be left
  paused"); a restore whose cont is lost still runs the guest. A guest
  saved paused: no pause in the report, qemu.run-state paused in the file,
  restored paused by default and running with --running; a running guest's
  file restored with --paused stays paused; each time the digest survives.
  A save onto the file a running restore reads is refused without touching
  QEMU.
- discard: a second save of a VM being saved is refused at once; a balloon
  giving memory back during a save cannot turn unsaved blocks into zeros.
- attach: halite-qemu restore killed mid-restore, 'restore --attach' takes
  over and finishes it: the digest survives.
- private: QEMU's default RAM (-m alone, memory-backend-ram, private
  anonymous memory) saved while the guest runs and restored, running and
  paused (every byte), and across the two; a save of it killed after it
  moved RAM aside leaves the guest waiting, and 'save --recover' gives the
  memory back: the digest survives.
- disks: a qcow2 disk (-drive) and a raw one (-blockdev) frozen by the save
  while the guest writes them; restores while the source runs each get their
  own overlay and agree with the guest's memory; a frozen image written after
  the snapshot, and a disk QEMU shares (share-rw), are refused; --no-disks
  shows what goes wrong without it. A save failing after the freeze commits
  the overlay back into the image right below, never further down.
- libvirt: a domain libvirt runs (QEMU as libvirt-qemu under seccomp, its
  default RAM, a qcow2 disk as -blockdev nodes; libvirtd started if it is not
  running) saved through a second QMP socket: refused naming
  vm.unprivileged_userfaultfd while it is 0, then saved with the disk frozen
  through libvirt (virsh domblklist names the overlay); a failed save thaws
  through libvirt too.

Exit 0 pass, 1 fail, 77 skip (no QEMU or guest image, or not root; with
HALITE_REQUIRE_QEMU=1 those fail instead).
"""
import contextlib
import fcntl
import hashlib
import json
import re
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import halite_guest as hg  # noqa: E402

INSPECT = os.environ.get("HALITE_INSPECT_BIN") or os.path.join(
    hg.ROOT, "build", "tools", "halite-inspect", "halite-inspect")


def log(msg):
    print(msg, flush=True)


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    log(f"  ok: {msg}")


def run(cmd, timeout=300, check_rc=None, fault=None):
    """Run @cmd; @fault sets HALITE_QEMU_TEST_FAULT (halite/qemu/fault.c)."""
    env = dict(os.environ, HALITE_QEMU_TEST_FAULT=fault) if fault else None
    t = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       text=True, env=env)
    dt = time.monotonic() - t
    if check_rc is not None and p.returncode != check_rc:
        raise Fail(f"{' '.join(cmd[:3])}...: exit {p.returncode}, want {check_rc}\n"
                   f"stdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}")
    return p, dt


def save(guest, path, extra=()):
    p, dt = run([hg.halite_qemu(), "save", "--qmp", guest.qmp_path, "--json", "-q", *extra,
                 path], check_rc=0)
    rep = json.loads(p.stdout)
    log(f"  save: pause {rep['pause_ms']:.1f} ms, {rep['save_s']:.2f} s, "
        f"{rep['file_bytes'] >> 20} MiB file, {rep['faults']} faults "
        f"({rep['faults_vcpu']} vCPU), roots sampled {rep['root_samples']} times")
    return rep


def restore_cmd(path, guest, *opts):
    return [hg.halite_qemu(), "restore", "--json", "-q", *opts, path, "--",
            "qemu-system-x86_64", *guest.args]


def restore(path, guest, *opts):
    """Restore detached; returns the report once all memory is in."""
    p, dt = run(restore_cmd(path, guest, "--detach", *opts), check_rc=0)
    rep = json.loads(p.stdout)
    guest.adopt(rep["qemu"]["pid"])
    log_restore(rep)
    return rep


def log_restore(rep):
    log(f"  restore: QEMU ready {rep['qmp_ready_ms']:.0f} ms, guest "
        f"{'loaded, paused,' if rep.get('paused') else 'resumed'} "
        f"{rep['ready_to_resume_ms']:.1f} ms after, all in {rep['done_s']:.2f} s later, "
        f"{rep['faults']} faults ({rep['faults_vcpu']} vCPU), {rep['lb_demand']} demand / "
        f"{rep['lb_prefetch']} prefetched LBs")


def ram_bytes(rep):
    """Guest RAM a save report's blocks cover: all but the device RAM (video memory)."""
    return rep["mb_total"] * 8192 - rep["device_ram_bytes"]


def inspect_info(path):
    p, _ = run([INSPECT, "info", "--json", path], check_rc=0)
    return json.loads(p.stdout)


def ram_regions(info):
    """{name: region} of guest RAM from halite-inspect info --json: without device RAM."""
    dev = info["metadata"].get("qemu.device-ram", [])
    return {r["name"]: r for r in info["regions"] if r["name"] not in dev}


def stream_blocks(info):
    """{stream name: memory blocks stored} from halite-inspect info --json."""
    out = {}
    for s in info.get("streams", []):
        out[s["name"]] = s["mbs"]
    return out


# --- cases -----------------------------------------------------------------

def case_save_restore(work):
    src = hg.Guest(work, "source").boot().wait_ready()
    qmp = src.qmp()
    tids = [c["thread-id"] for c in qmp.cmd("query-cpus-fast")]
    qmp.close()
    # Freeze the verifier's rewrites: the memory digest then stays put across the
    # snapshot instant, while the verifier keeps reading all of it.
    src.rewrites(False)
    d0, up0, ok0 = src.digest()
    check(ok0, f"source guest digest {d0} as expected before the save (uptime {up0:.1f})")
    path = os.path.join(work, "guest.hlt")
    lines_before = len(src.verifier_lines())
    rep = save(src, path)
    check(rep["ok"] and rep["qemu"]["vcpus"] == 2, "save reports 2 vCPUs")
    check(rep["faults_vcpu"] > 0, f"vCPU first touches were trapped ({rep['faults_vcpu']})")
    check(rep["mb_total"] == rep["mb_stored"] + rep["mb_zero"] + rep["mb_untouched"],
          "every memory block is stored, zero or untouched")
    check(ram_bytes(rep) == rep["memory_bytes"] == 512 << 20,
          "the file covers 512 MiB of guest RAM (and the VGA's video memory)")
    # The source guest ran through the save and runs on.
    src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
    check(len(src.verifier_lines()) > lines_before, "the source guest's verifier kept passing")
    d1, up1, ok1 = src.digest()
    check(ok1 and d1 == d0, f"source guest memory digest unchanged by the save ({d1})")
    check(src.status()["mismatches"] == "0", "source verifier: 0 mismatches")

    info = inspect_info(path)
    meta = info["metadata"]
    check(meta["qemu.cmdline"] == ["qemu-system-x86_64", *src.args] and
          meta["qemu.cwd"] == os.getcwd() and meta["qemu.machine"] == "pc-q35-7.2" and
          "virtio-net-pci addr=02.0" in meta["qemu.devices"],
          "the file records QEMU's command line, directory, machine and devices")
    streams = stream_blocks(info)
    log(f"  streams: {streams}")
    for i in range(2):
        check(streams.get(f"vcpu{i}", 0) > 0, f"stream vcpu{i} is not empty")
    check(streams.get("virtual", 0) > 0, "the guest-virtual stream exists (page tables walked)")
    p, _ = run([INSPECT, "verify", path], check_rc=0)
    check(True, "halite-inspect verify: every checksum and block decodes")
    qmp = src.qmp()
    qmp.cmd("quit")
    src.proc.wait(timeout=30)

    dst = hg.Guest(work, "restored")
    rrep = restore(path, dst, "--track-access")
    check(rrep["ok"], "restore completed")
    check(rrep["faults_vcpu"] > 0, "the guest ran (vCPU faults) while memory came in")
    check(rrep["mb_total"] == rrep["mb_fault"] + rrep["mb_pool"] + rrep["mb_prefetch"] +
          rrep["mb_zero"], "every block installed exactly once: fault {mb_fault} + pool {mb_pool}"
          " + prefetch {mb_prefetch} + zero {mb_zero} = total {mb_total}".format(**rrep))
    check(rrep["lb_total"] == rrep["lb_demand"] + rrep["lb_prefetch"], "every LB read once")
    check(rrep["vm_access_pct"] >= 0, f"VM access measured ({rrep['vm_access_pct']:.1f}%)")
    m = dst.wait_console(r"^verifier: pass (\d+) ok, uptime ([0-9.]+)", 60)
    up_r = float(m.group(2))
    check(up0 <= up_r < up1 + 30, f"uptime continues from the snapshot ({up0:.1f} before the "
          f"save, {up_r:.1f} after the restore)")
    d2, up2, ok2 = dst.digest()
    check(ok2 and d2 == d0, f"memory digest after the restore equals the snapshot's ({d2})")
    dst.rewrites(True)
    n = len(dst.verifier_lines())
    dst.wait_console(r"^verifier: pass \d+ ok", 30, after=len(dst.console_text()))
    time.sleep(1.5)
    st = dst.status()
    check(st["ok"] == "1" and st["mismatches"] == "0" and int(st["rewrites"]) > 0,
          f"after the restore the verifier keeps passing with rewrites on "
          f"({st['passes']} passes, {st['rewrites']} rewrites, 0 mismatches)")
    check(len(dst.verifier_lines()) > n, "verifier ok lines keep coming")
    dst.check_console()
    q = dst.qmp()
    q.cmd("quit")
    dst.kill()


def qemu_ram(pid):
    """QEMU's guest RAM (the memfd mapping), read through /proc/PID/map_files."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and "memory-backend-memfd" in parts[5]:
                with open(f"/proc/{pid}/map_files/{parts[0]}", "rb") as m:
                    return m.read()
    raise Fail(f"no memfd mapping in QEMU {pid}")


def case_exact(work):
    src = hg.Guest(work, "source").boot().wait_ready()
    path = os.path.join(work, "guest.hlt")
    save(src, path)
    src.kill()
    raw = os.path.join(work, "mem0.raw")
    run([INSPECT, "extract", "--region", "mem0", "-o", raw, path], check_rc=0)
    dst = hg.Guest(work, "paused")
    rep = restore(path, dst, "--paused")
    check(rep["paused"] and rep["ok"], "paused restore completed")
    ram = qemu_ram(dst.pid)
    with open(raw, "rb") as f:
        want = f.read()
    check(len(ram) == len(want) == 512 << 20, "QEMU's RAM and the file's region are 512 MiB")
    if ram != want:
        pages = [i for i in range(0, len(ram), 4096) if ram[i:i + 4096] != want[i:i + 4096]]
        raise Fail(f"{len(pages)} pages differ between QEMU's RAM and the file, first at "
                   f"0x{pages[0]:x}")
    check(True, "every byte of QEMU's RAM equals the snapshot")
    q = dst.qmp()
    check(q.cmd("query-status")["status"] == "paused", "the guest is still paused")
    q.cmd("cont")
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    check(True, "after cont the verifier passes")
    dst.kill()


# Guest RAM as QEMU makes it by default (halite_guest.py).
private_ram = hg.Guest.private_ram


def qemu_private_ram(guest):
    """QEMU's private guest RAM, read through /proc/PID/mem at its host address."""
    q = guest.qmp()
    text = q.cmd("human-monitor-command", **{"command-line": "gpa2hva 0"})
    q.close()
    m = re.search(r"is (0x[0-9a-f]+)", text)
    if not m:
        raise Fail(f"gpa2hva 0: {text!r}")
    with open(f"/proc/{guest.pid}/mem", "rb") as f:
        f.seek(int(m.group(1), 16))
        return f.read(guest.mem_mib << 20)


def uffds(pid):
    """How many userfaultfds process @pid holds (an fd closed meanwhile: not one)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[userfaultfd]"
    return n


def recover_killed_save(work, src, d0):
    """A save of private RAM killed once it moved pages aside: the guest waits,
    'save --recover' gives them back and it runs on with its memory."""
    rec = f"/run/halite-qemu/qemu-{src.pid}.save"
    killed = os.path.join(work, "killed.hlt")
    proc = subprocess.Popen([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q", killed],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HALITE_QEMU_TEST_FAULT="hold-after-arm:20000"))
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(FileNotFoundError):
            with open(rec) as f:
                if "\naside " in f.read():
                    break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise Fail(f"the save never recorded pages moved aside in {rec} "
                       f"(exit {proc.wait()}: {proc.stderr.read().strip()})")
        time.sleep(0.005)
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    n = len(src.verifier_lines())
    time.sleep(2)
    check(uffds(src.pid) == 1 and len(src.verifier_lines()) == n,
          f"save killed after it moved RAM aside: QEMU keeps the userfaultfd, the verifier "
          f"waits ({n} lines, none since)")
    r, _ = run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q",
                os.path.join(work, "again.hlt")], check_rc=1)
    check("save --recover" in r.stderr, "a new save is refused and names 'save --recover': "
          + r.stderr.strip().splitlines()[-1])
    r, _ = run([hg.halite_qemu(), "save", "--recover", "--json", "--qmp", src.qmp_path],
               check_rc=0)
    rep = json.loads(r.stdout)
    check(rep["ok"] and rep["pages_given_back"] > 0 and rep["run_state"] == "running"
          and uffds(src.pid) == 0 and not os.path.exists(rec),
          f"save --recover: {rep['pages_given_back']} pages given back, no userfaultfd left, "
          "record removed")
    src.wait_console(r"^verifier: pass \d+ ok", 60, after=len(src.console_text()))
    d1, _, ok = src.digest()
    check(ok and d1 == d0, f"the guest runs on, verifier passing, digest {d1} unchanged")
    r, _ = run([hg.halite_qemu(), "save", "--recover", "--qmp", src.qmp_path], check_rc=1)
    check("no save of private RAM to recover" in r.stderr,
          "a second --recover says there is nothing to recover")


def case_private(work):
    """QEMU's default RAM (-m alone, memory-backend-ram): saved and restored."""
    src = private_ram(hg.Guest(work, "plain")).boot().wait_ready()
    src.rewrites(False)
    d0, _, ok = src.digest()
    check(ok, f"plain -m guest, digest {d0}")
    path = os.path.join(work, "plain.hlt")
    rep = save(src, path)
    check(rep["faults_vcpu"] > 0 and ram_bytes(rep) == 512 << 20,
          f"saved {rep['mb_total']} blocks of plain -m RAM while the verifier ran, "
          f"{rep['faults_vcpu']} vCPU first touches")
    d1, _, ok = src.digest()
    check(ok and d1 == d0 and uffds(src.pid) == 0,
          f"the source runs on with its memory (digest {d1}), no userfaultfd left in QEMU")
    recover_killed_save(work, src, d0)
    src.kill()
    dst = private_ram(hg.Guest(work, "plain-dst"))
    restore(path, dst)
    d2, _, ok = dst.digest()
    check(ok and d2 == d0, f"restored onto plain -m: digest {d2} equals the snapshot's")
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.rewrites(True)
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.check_console()
    check(True, "its verifier keeps passing, rewrites on again")
    dst.kill()
    # memory-backend-ram, and a paused restore: every byte.
    src = private_ram(hg.Guest(work, "ram"), "memory-backend-ram").boot().wait_ready()
    path = os.path.join(work, "ram.hlt")
    save(src, path)
    src.kill()
    raw = os.path.join(work, "ram.raw")
    run([INSPECT, "extract", "--region", "mem0", "-o", raw, path], check_rc=0)
    dst = private_ram(hg.Guest(work, "ram-paused"), "memory-backend-ram")
    rep = restore(path, dst, "--paused")
    ram = qemu_private_ram(dst)
    with open(raw, "rb") as f:
        want = f.read()
    if ram != want:
        pages = [i for i in range(0, min(len(ram), len(want)), 4096)
                 if ram[i:i + 4096] != want[i:i + 4096]]
        raise Fail(f"{len(pages)} pages of memory-backend-ram differ from the file "
                   f"(lengths {len(ram)}, {len(want)}), first at 0x{pages[0] if pages else 0:x}")
    check(True, "memory-backend-ram, paused restore: every byte of QEMU's RAM equals the file")
    q = dst.qmp()
    q.cmd("cont")
    q.close()
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    check(True, "after cont the verifier passes")
    dst.kill()
    # Across backends: the same guest-physical RAM, another backend's name.
    dst = private_ram(hg.Guest(work, "ram-to-plain"))
    restore(path, dst)
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.check_console()
    check(True, "the memory-backend-ram file restored onto plain -m: the verifier passes")
    dst.kill()


# The guest's disk count against its memory's (halite_guest.py).
disklog = hg.Guest.disklog


def image_count(work, image, fmt):
    """The count disklog left in sector 0 of @image (qemu-img reads any format)."""
    out = os.path.join(work, "sector0")
    run(["qemu-img", "dd", "-U", "-f", fmt, "-O", "raw", "bs=512", "count=1", f"if={image}",
         f"of={out}"], check_rc=0)
    with open(out, "rb") as f:
        head = f.read(512).split(b"\n")[0].split()
    os.unlink(out)
    return int(head[1]) if len(head) == 2 and head[0] == b"disklog" else 0


# The guest's virtio disk: -drive or -blockdev (halite_guest.py).
with_disk = hg.Guest.with_disk


def disk_restore(work, path, name, how, image, at):
    """Restore @path with the source's disk arguments; the guest's disk and memory
    agree, and it counts on from the snapshot's @at."""
    dst = with_disk(private_ram(hg.Guest(work, name)), how, image)
    rep = restore(path, dst)
    disks = rep.get("disks", [])
    check(len(disks) == 1 and disks[0]["overlay"] and os.path.exists(disks[0]["overlay"]),
          f"{name}: the restore runs on a new overlay {disks and disks[0]['overlay']}")
    d, m1, m2, ok = disklog(dst)
    check(ok and m1 >= at, f"{name}: disk {d}, memory {m1}..{m2}: they agree, counting on from "
          f"the snapshot's {at}")
    return dst, disks[0]["overlay"]


def case_disks(work):
    """A guest's disk frozen with its memory: restores agree, twice, while the source runs."""
    for how, fmt in (("drive", "qcow2"), ("blockdev", "raw")):
        image = os.path.join(work, f"disk-{how}.{fmt}")
        run(["qemu-img", "create", "-q", "-f", fmt, image, "64M"], check_rc=0)
        src = with_disk(private_ram(hg.Guest(work, f"{how}-src")), how, image).boot().wait_ready()
        d0, m0, _, ok = disklog(src)
        check(ok and d0 > 0, f"{how} {fmt}: disklog counts on the source's disk ({d0})")
        path = os.path.join(work, f"{how}.hlt")
        rep = save(src, path)
        disks = rep["disks"]
        check(rep["disks_frozen"] and len(disks) == 1 and disks[0]["frozen"]
              and disks[0]["image"] == os.path.realpath(image)
              and os.path.exists(disks[0]["overlay"]),
              f"the save froze {image}; the source writes to {disks[0]['overlay']} now")
        frozen = os.stat(image)
        info = inspect_info(path)
        rec = json.loads(info["metadata"]["qemu.disks"])
        check(rec[0]["image"] == os.path.realpath(image) and rec[0]["format"] == fmt and
              rec[0]["virtual_size"] == 64 << 20, "the file records the frozen image, its "
              "format and virtual size")
        time.sleep(1)
        d1, _, _, ok = disklog(src)
        check(ok and d1 > d0, f"the source counts on ({d1}) on its overlay")
        at = image_count(work, image, fmt)
        check(d0 <= at <= d1, f"the frozen image holds count {at}, the snapshot's")
        dst1, ov1 = disk_restore(work, path, f"{how}-r1", how, image, at)
        time.sleep(1)
        dst2, ov2 = disk_restore(work, path, f"{how}-r2", how, image, at)
        check(ov1 != ov2, "each restore has its own overlay")
        for g in (src, dst1, dst2):
            d, m1, m2, ok = disklog(g)
            check(ok, f"{g.name}: disk {d}, memory {m1}..{m2} agree")
            g.check_console()
        st = os.stat(image)
        check(st.st_mtime_ns == frozen.st_mtime_ns and st.st_size == frozen.st_size,
              f"the frozen image {os.path.basename(image)} was never written again")
        for g in (dst1, dst2):
            g.kill()
        if how == "drive":
            # A second snapshot of the same source: its frozen image is the first
            # overlay, which the command line does not name; the restore finds it.
            path2 = os.path.join(work, "drive2.hlt")
            rep2 = save(src, path2)
            check(rep2["disks"][0]["image"] == disks[0]["overlay"],
                  f"the second save froze the first overlay {disks[0]['overlay']}")
            dst3, _ = disk_restore(work, path2, "drive-r3", how, image, d1)
            dst3.kill()
            # A save that fails after freezing: the new overlay's writes go back into
            # the image right below it, the one the source wrote, never further down
            # (that is the first snapshot's frozen image), and the overlay goes.
            top = rep2["disks"][0]["overlay"]
            below = [os.stat(f).st_mtime_ns for f in (image, disks[0]["overlay"])]
            p = subprocess.run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q",
                                os.path.join(work, "thaw.hlt")], capture_output=True, text=True,
                               env=dict(os.environ, HALITE_QEMU_TEST_FAULT="fail-before-arm"))
            check(p.returncode == 1 and "test fault fail-before-arm" in p.stderr,
                  "a save failing after the freeze: " + p.stderr.strip().splitlines()[-1])
            q = src.qmp()
            files = [b["inserted"]["file"] for b in q.cmd("query-block")
                     if b.get("inserted") and b["device"] == "disk0"]
            q.close()
            check(files == [top], f"the source writes its own overlay again ({files})")
            check([os.stat(f).st_mtime_ns for f in (image, disks[0]["overlay"])] == below,
                  "the images below it, frozen by the two snapshots, were not written")
            left = [n for n in os.listdir(work) if ".thaw-" in n]
            check(not left, f"the failed save's overlay is gone ({left})")
            time.sleep(0.5)
            d, m1, m2, ok = disklog(src)
            check(ok, f"the source's disk and memory agree (disk {d}, memory {m1}..{m2})")
            # A frozen image written after the snapshot: refused, QEMU never runs.
            os.utime(disks[0]["overlay"])
            p, _ = run(restore_cmd(path2, with_disk(private_ram(hg.Guest(work, "stale")),
                                                     how, image), "--detach"))
            check(p.returncode == 1 and "written after the snapshot" in p.stderr,
                  "a frozen image written after the snapshot is refused: "
                  + p.stderr.strip().splitlines()[-1])
        src.kill()
        # No QEMU arguments: the command line the file records (the source's,
        # its ports and sockets free now), pointed at a new overlay too.
        p, _ = run([hg.halite_qemu(), "restore", "--detach", "--json", "-q", path], check_rc=0)
        rep = json.loads(p.stdout)
        src.adopt(rep["qemu"]["pid"])
        check(rep["cmdline"] == "recorded" and len(rep["disks"]) == 1 and
              rep["disks"][0]["overlay"] not in (ov1, ov2) and
              os.path.exists(rep["disks"][0]["overlay"]),
              f"the recorded command line runs on a new overlay {rep['disks'][0]['overlay']}")
        d, m1, m2, ok = disklog(src)
        check(ok and m1 >= at, f"disk {d}, memory {m1}..{m2}: they agree, counting on from "
              f"the snapshot's {at}")
        src.kill()
    # Memory only (--no-disks): the disk moves on, and a restore runs on it as it
    # is, with a warning: the guest then writes its older counts over newer ones.
    image = os.path.join(work, "nodisks.qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", image, "64M"], check_rc=0)
    src = with_disk(private_ram(hg.Guest(work, "nd-src")), "drive", image).boot().wait_ready()
    path = os.path.join(work, "nodisks.hlt")
    rep = save(src, path, ("--no-disks",))
    check(not rep["disks_frozen"] and not rep["disks"][0]["frozen"] and
          inspect_info(path)["metadata"]["qemu.disks-frozen"] == "no",
          "--no-disks: the disk is not frozen; the report and the file say so")
    _, at, _, _ = disklog(src)
    time.sleep(2)
    src.kill()
    later = image_count(work, image, "qcow2")
    check(later > at + 20, f"the source wrote on: the disk holds {later}, the snapshot {at}")
    dst = with_disk(private_ram(hg.Guest(work, "nd-dst")), "drive", image)
    p, _ = run(restore_cmd(path, dst, "--detach"), check_rc=0)
    rep = json.loads(p.stdout)
    dst.adopt(rep["qemu"]["pid"])
    check(rep["disks"] == [] and "the snapshot was saved with --no-disks" in p.stderr,
          "the restore runs on the disk as it is, and warns: " + p.stderr.strip())
    time.sleep(0.5)
    d, m1, m2, _ = disklog(dst)
    check(d < later and m1 < later, f"the restored guest counts on from its memory ({m1}), "
          f"over the disk's later {later}: disk {d} (what --no-disks warns of)")
    dst.kill()
    # What cannot be frozen is refused before the guest is touched.
    image = os.path.join(work, "shared.qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", image, "64M"], check_rc=0)
    g = private_ram(hg.Guest(work, "shared"))
    g.args += ["-drive", f"file={image},if=none,id=shared0",
               "-device", "virtio-blk-pci,drive=shared0,share-rw=on"]
    g.boot().wait_ready()
    p, _ = run([hg.halite_qemu(), "save", "--qmp", g.qmp_path, "-q",
                os.path.join(work, "shared.hlt")])
    check(p.returncode == 1 and "share-rw" in p.stderr and
          not [n for n in os.listdir(work) if n.startswith("shared.shared")],
          "a shared disk is refused, no overlay left: " + p.stderr.strip().splitlines()[-1])
    q = g.qmp()
    check(q.cmd("query-status")["status"] == "running", "that guest runs on")
    q.close()
    g.kill()


LIBVIRT_XML = """<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>2</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{dir}/vmlinux</kernel>
    <initrd>{dir}/initrd.img</initrd>
    <cmdline>{append}</cmdline>
  </os>
  <on_reboot>destroy</on_reboot>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{dir}/disk.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'><source path='{dir}/console.log'/></serial>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-qmp'/>
    <qemu:arg value='unix:{qmp},server=on,wait=off'/>
  </qemu:commandline>
</domain>
"""


@contextlib.contextmanager
def libvirt_running():
    """libvirtd (and virtlogd) up, started here if they were not, stopped after."""
    def pid_of(daemon):
        """The daemon's pid, from its pid file, if it runs (not a zombie)."""
        try:
            with open(f"/run/{daemon}.pid") as f:
                pid = int(f.read())
            with open(f"/proc/{pid}/stat") as f:
                return pid if f.read().rsplit(")", 1)[1].split()[0] != "Z" else None
        except (OSError, ValueError, IndexError):
            return None

    started = []
    for daemon in ("virtlogd", "libvirtd"):
        if not pid_of(daemon):
            subprocess.run([daemon, "-d"], check=True)
            started.append(daemon)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["virsh", "-c", "qemu:///system", "version"],
                             capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise Fail("libvirtd did not answer within 30 s")
            time.sleep(0.2)
        yield
    finally:
        for daemon in reversed(started):
            pid = pid_of(daemon)
            if pid:
                os.kill(pid, signal.SIGTERM)


@contextlib.contextmanager
def sysctl(name, value):
    path = "/proc/sys/" + name.replace(".", "/")
    with open(path) as f:
        old = f.read().strip()
    with open(path, "w") as f:
        f.write(value)
    try:
        yield
    finally:
        with open(path, "w") as f:
            f.write(old)


def virsh(*args):
    p = subprocess.run(["virsh", "-q", "-c", "qemu:///system", *args], capture_output=True,
                       text=True, timeout=60)
    if p.returncode:
        raise Fail(f"virsh {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def case_libvirt(work):
    """A VM as libvirt runs it (QEMU as libvirt-qemu under its seccomp filter, its
    default RAM as memory-backend-ram, a qcow2 disk as -blockdev nodes), saved
    through a second QMP socket: the disk frozen through libvirt, which knows it."""
    g = hg.Guest(work, "template")
    # QEMU runs as libvirt-qemu: a directory it can reach (the work dir is root's).
    vdir = tempfile.mkdtemp(prefix="halite-test.", dir="/var/lib/libvirt/images")
    os.chmod(vdir, 0o755)
    name = os.path.basename(vdir).replace(".", "-")
    qmp = f"/var/lib/libvirt/qemu/{name}.qmp"
    disk = os.path.join(vdir, "disk.qcow2")
    try:
        for f in ("vmlinux", "initrd.img"):
            shutil.copy(os.path.join(g.image, f), vdir)
        run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "64M"], check_rc=0)
        xml = os.path.join(work, "domain.xml")
        with open(xml, "w") as f:
            f.write(LIBVIRT_XML.format(name=name, dir=vdir, append=g.append, qmp=qmp))
        with libvirt_running():
            virsh("create", xml)
            try:
                libvirt_save(work, name, vdir, qmp, disk)
            finally:
                subprocess.run(["virsh", "-c", "qemu:///system", "destroy", name],
                               capture_output=True)
    finally:
        shutil.rmtree(vdir, ignore_errors=True)


def console_passes(path):
    with open(path, errors="replace") as f:
        return len(re.findall(r"^verifier: pass \d+ ok", f.read(), re.M))


def wait_passes(path, more, timeout=90):
    """Until the console at @path shows @more verifier passes than now."""
    n, deadline = console_passes(path), time.monotonic() + timeout
    while console_passes(path) < n + more:
        if time.monotonic() > deadline:
            raise Fail(f"the guest's verifier did not pass {more} more times in {timeout} s")
        time.sleep(0.2)


def libvirt_save(work, name, vdir, qmp, disk):
    console = os.path.join(vdir, "console.log")
    wait_passes(console, 3)
    uuid = virsh("domuuid", name).strip()
    pid = int(open(f"/run/libvirt/qemu/{name}.pid").read())
    with open(f"/proc/{pid}/status") as f:
        st = f.read()
    check(re.search(r"^Uid:\s+\d+\s+(\d+)", st, re.M).group(1) != "0" and
          re.search(r"^Seccomp:\s+2", st, re.M), f"libvirt runs QEMU {pid} as a user of its "
          "own, under a seccomp filter")
    path = os.path.join(work, "vm.hlt")
    # Without vm.unprivileged_userfaultfd, QEMU's user may not make a userfaultfd.
    with sysctl("vm.unprivileged_userfaultfd", "0"):
        p, _ = run([hg.halite_qemu(), "save", "--qmp", qmp, "-q", path])
    check(p.returncode == 1 and "vm.unprivileged_userfaultfd is 0" in p.stderr,
          "refused, naming the sysctl: " + p.stderr.strip().splitlines()[-1])
    check(virsh("domblklist", name).split()[1] == disk and not os.path.exists(path) and
          sorted(os.listdir(vdir)) == ["console.log", "disk.qcow2", "initrd.img", "vmlinux"],
          "nothing changed: no file, no overlay, libvirt's disk as it was")
    wait_passes(console, 2)
    with sysctl("vm.unprivileged_userfaultfd", "1"):
        p, _ = run([hg.halite_qemu(), "save", "--qmp", qmp, "--json", "-q", path], check_rc=0)
        rep = json.loads(p.stdout)
        overlay = rep["disks"][0]["overlay"]
        check(rep["libvirt_domain"] == uuid and rep["disks"][0]["frozen"] and
              virsh("domblklist", name).split()[1] == overlay,
              f"saved; the disk frozen through libvirt, which runs it on {overlay} now")
        frozen = os.stat(disk).st_mtime_ns
        # A save that fails after the freeze thaws through libvirt too.
        p, _ = run([hg.halite_qemu(), "save", "--qmp", qmp, "-q", os.path.join(work, "x.hlt")],
                   fault="fail-before-arm")
        check(p.returncode == 1 and virsh("domblklist", name).split()[1] == overlay and
              len([n for n in os.listdir(vdir) if n.endswith(".qcow2")]) == 2,
              "a failed save's overlay committed back and gone; libvirt's disk is the first "
              "overlay again")
    wait_passes(console, 2)
    check(os.stat(disk).st_mtime_ns == frozen, "the frozen image was never written again")
    run([INSPECT, "verify", path], check_rc=0)
    info = inspect_info(path)
    check("-blockdev" in info["metadata"]["qemu.cmdline"] and
          json.loads(info["metadata"]["qemu.disks"])[0]["image"] == disk,
          "the file records libvirt's command line and the frozen image")


def case_kill(work):
    src = hg.Guest(work, "source").boot().wait_ready()
    path = os.path.join(work, "guest.hlt")
    # A save killed halfway: QEMU holds no copy of the save's userfaultfd, so the
    # registration dies with halite and the guest runs on with its memory intact.
    src.rewrites(False)
    d0, _, _ = src.digest()
    killed = os.path.join(work, "killed.hlt")
    proc = subprocess.Popen([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q", killed],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Armed and saving once locality blocks reach the file: kill it then.
    tmp = wait_file(proc, killed, 2 << 20)
    proc.kill()
    proc.wait()
    check(not os.path.exists(killed) and os.path.exists(tmp),
          f"the killed save left no {os.path.basename(killed)}, only its temporary file")
    os.unlink(tmp)
    n = len(src.console_text())
    src.wait_console(r"^verifier: pass \d+ ok", 30, after=n)
    d1, _, ok = src.digest()
    check(ok and d1 == d0, f"after SIGKILL of halite-qemu save the guest runs on, digest {d1} "
          "unchanged")
    # SIGINT cancels a save cleanly: every block goes back, the partial file
    # goes, and an older file at the path is left as it was.
    cancelled = os.path.join(work, "cancelled.hlt")
    older = b"an older file at the path, not to be lost\n" * 1000
    with open(cancelled, "wb") as f:
        f.write(older)
    proc = subprocess.Popen([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q", cancelled],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_file(proc, cancelled, 2 << 20)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    check(proc.returncode == 1 and "save cancelled: Interrupt" in err,
          f"SIGINT cancels the save: {err.strip().splitlines()[-1] if err.strip() else ''}")
    with open(cancelled, "rb") as f:
        check(f.read() == older, "the older file at the cancelled save's path is unchanged")
    left = [n for n in os.listdir(work) if n.startswith(".cancelled.hlt.") or
            n == "cancelled.hlt.incomplete"]
    check(not left, f"the cancelled save's partial file is removed ({left})")
    src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
    d2, _, ok = src.digest()
    check(ok and d2 == d0, f"after the cancel the guest runs on, digest {d2} unchanged")
    src.rewrites(True)
    save(src, path)
    src.kill()
    dst = hg.Guest(work, "victim")
    proc, q, tids, qemu_pid = slow_restore(path, dst)
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    check(True, f"halite-qemu killed (SIGKILL) {0.3:.1f} s after the guest resumed")
    lines = len(dst.verifier_lines())
    time.sleep(3)
    check(dst.alive(), "QEMU is still alive")
    blocked = []
    for t in tids:
        with open(f"/proc/{qemu_pid}/task/{t}/wchan") as f:
            blocked.append(f.read().strip())
    # A vCPU with nothing to run sits halted (a futex wait in TCG) until an
    # interrupt; one that runs soon touches memory not yet restored.
    check("handle_userfault" in blocked and
          all(w in ("handle_userfault", "futex_do_wait", "futex_wait_queue") for w in blocked),
          f"vCPU threads are blocked in userfaultfd or halted ({', '.join(blocked)})")
    try:
        body = dst.http("/hello.txt", timeout=3, per_try=1)
        raise Fail(f"the guest answered HTTP while it should be blocked: {body!r}")
    except hg.GuestError:
        check(True, "the guest answers no HTTP")
    check(len(dst.verifier_lines()) == lines, "no verifier line since the kill (blocked)")
    dst.check_console()
    check(True, "its console shows no mismatch, panic or failure")
    q.close()
    dst.kill()

    # SIGTERM stops a restore and its QEMU: the guest cannot run without its memory.
    dst = hg.Guest(work, "stopped")
    proc, q, _, qemu_pid = slow_restore(path, dst)
    q.close()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    check(proc.returncode == 1 and "restore stopped: Terminated" in err,
          f"SIGTERM stops the restore: {err.strip().splitlines()[-1] if err.strip() else ''}")
    time.sleep(0.2)
    check(not dst.alive(), f"its QEMU {qemu_pid} is gone")


def wait_file(proc, path, size):
    """Until the file @proc writes for @path (a temporary ".NAME.XXXXXX" beside
    it, renamed over @path only when complete) holds @size bytes: armed and
    saving. Returns the temporary file's path."""
    d, name = os.path.split(path)
    deadline = time.monotonic() + 60
    tmp, have = None, 0
    while proc.poll() is None and time.monotonic() < deadline:
        for n in os.listdir(d):
            if n.startswith(f".{name}."):
                tmp = os.path.join(d, n)
        try:
            have = os.path.getsize(tmp) if tmp else 0
        except OSError:
            have = 0
        if have > size:
            break
        time.sleep(0.002)
    check(proc.poll() is None and have > size,
          f"halite-qemu save is running, {have >> 20} MiB written to its temporary file")
    return tmp


def slow_restore(path, dst, latency_us=200000):
    """A restore with slow reads and no prefetch, so the guest needs memory
    halite has not brought yet; returns once the guest runs: (process, QMP,
    vCPU thread ids, QEMU's pid)."""
    proc = subprocess.Popen(restore_cmd(path, dst, "--no-prefetch", "--read-latency",
                                        str(latency_us)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    q = None
    while True:
        if proc.poll() is not None:
            raise Fail(f"halite-qemu restore ended early: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise Fail("the restored guest was not resumed within 120 s")
        try:
            if q is None and os.path.exists(dst.qmp_path):
                q = dst.qmp(timeout=2)
            if q and q.cmd("query-status")["status"] == "running":
                break
        except (hg.GuestError, OSError, EOFError):
            q = None
        time.sleep(0.01)
    tids = [c["thread-id"] for c in q.cmd("query-cpus-fast")]
    with open(f"/proc/{tids[0]}/status") as f:
        qemu_pid = int([l for l in f if l.startswith("Tgid:")][0].split()[1])
    dst.adopt(qemu_pid)
    return proc, q, tids, qemu_pid


def case_errors(work):
    # A private mapping of a file (memory-backend-file share=off): its pages
    # are QEMU's private copies of the file's, which a snapshot cannot tell apart.
    backing = os.path.join(work, "private-backing")
    g = set_backend(hg.Guest(work, "private"),
                    f"memory-backend-file,share=off,mem-path={backing}")
    g.boot().wait_ready()
    p, _ = run([hg.halite_qemu(), "save", "--qmp", g.qmp_path, "-q",
                os.path.join(work, "x.hlt")])
    # The fix to paste, with the guest's real size (512 MiB).
    check(p.returncode == 1 and "private mapping of the file" in p.stderr
          and "size=512M,mem-path=...,share=on" in p.stderr
          and "memory-backend-ram,id=mem0,size=512M" in p.stderr
          and len(p.stderr.strip().splitlines()) == 1,
          f"a private file mapping refused: {p.stderr.strip().splitlines()[-1]}")
    check(not os.path.exists(os.path.join(work, "x.hlt")), "no file left behind")
    q = g.qmp()
    check(q.cmd("query-status")["status"] == "running", "that guest is still running")
    g.wait_console(r"^verifier: pass \d+ ok", 30, after=len(g.console_text()))
    q.close()
    g.kill()

    src = hg.Guest(work, "source").boot().wait_ready()
    path = os.path.join(work, "guest.hlt")
    # ptrace refused: another tracer (a debugger, strace) holds QEMU.
    tracer = subprocess.Popen([sys.executable, "-c", TRACER, str(src.pid)],
                              stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    check(tracer.stdout.readline().strip() == "seized", f"QEMU {src.pid} held by a tracer")
    p, _ = run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q", path])
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "ptrace(PTRACE_SEIZE)" in msg and "not allowed" in msg and
          f"already traced by process {tracer.pid}" in msg, f"ptrace refused: {msg}")
    check(not os.path.exists(path), "no file left behind")
    tracer.kill()
    tracer.wait()
    q = src.qmp()
    check(q.cmd("query-status")["status"] == "running", "that guest is still running")
    q.close()
    src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
    save(src, path)
    src.kill()
    # Another memory size: the command line says so before QEMU starts; without that
    # check, QEMU's RAM does once it runs, and that QEMU goes.
    other = hg.Guest(work, "other", mem_mib=768)
    p, _ = run(restore_cmd(path, other, "--detach"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "-m 512M at save, -m 768M now" in msg,
          f"other memory size refused before QEMU starts: {msg}")
    p, _ = run(restore_cmd(path, other, "--detach", "--no-cmdline-check"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "'mem0' is 512 MiB, this QEMU's is 768 MiB" in msg,
          f"and by QEMU's RAM: {msg}")
    # The QEMU it started is gone.
    try:
        other.qmp(timeout=1)
        raise Fail("the QEMU of the refused restore is still there")
    except (hg.GuestError, OSError):
        check(True, "the QEMU of the refused restore is gone")

    # Other devices: the command line says so; without that check, QEMU's devices
    # (info qtree) do, before its RAM is touched.
    nonic = hg.Guest(work, "nonic")
    i = nonic.args.index("-nic")
    nonic.args[i + 1] = "none"
    p, _ = run(restore_cmd(path, nonic, "--detach"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "-nic user,model=virtio-net-pci" in msg and
          "at save, not now" in msg, f"no NIC refused before QEMU starts: {msg}")
    p, _ = run(restore_cmd(path, nonic, "--detach", "--no-cmdline-check"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "devices differ from those recorded" in msg and
          "device virtio-net-pci addr=02.0 at save, not now" in msg,
          f"and by QEMU's devices: {msg}")
    # QEMU refuses its command line: what it said is shown (detached: from our log).
    bad = hg.Guest(work, "bad")
    bad.args += ["-device", "no-such-device"]
    p, _ = run(restore_cmd(path, bad, "--detach", "--no-cmdline-check"))
    check(p.returncode == 1 and "QEMU said" in p.stderr and "no-such-device" in p.stderr,
          "QEMU's own refusal is shown: " +
          " ".join(l for l in p.stderr.splitlines() if "no-such-device" in l)[:120])

    # A flipped byte in a locality block's data.
    info = inspect_info(path)
    bad = os.path.join(work, "bad.hlt")
    shutil.copy(path, bad)
    p, _ = run([INSPECT, "blocks", "--json", path], check_rc=0)
    lbs = json.loads(p.stdout)["lbs"]
    flip_byte(bad, lbs[len(lbs) // 2])
    dst = hg.Guest(work, "corrupt")
    p, _ = run(restore_cmd(bad, dst, "--detach"), timeout=300)
    msg = p.stderr.strip()
    check(p.returncode == 1 and "checksum" in msg,
          f"corrupt locality block fails the restore: {msg.splitlines()[-1] if msg else ''}")
    rep = json.loads(p.stdout)
    check(not rep["ok"] and "locality block" in rep["error"], "the report names the block")
    time.sleep(0.2)
    check(not os.path.exists(f"/proc/{rep['qemu']['pid']}") or
          open(f"/proc/{rep['qemu']['pid']}/stat").read().split(")")[-1].split()[0] == "Z",
          "its QEMU was killed")
    del info

    # A flipped byte in the locality block QEMU reads first while it loads the
    # device state: its main loop then waits for memory that never comes and
    # answers no QMP. The engine's error must come out at once, not a QMP timeout.
    lb = first_device_load_lb(work, path)
    bad = os.path.join(work, "load-bad.hlt")
    shutil.copy(path, bad)
    flip_byte(bad, next(x for x in lbs if x["lb"] == lb))
    dst = hg.Guest(work, "load-corrupt")
    # No prefetch: only QEMU's own accesses (the device load first) read LBs.
    p, dt = run(restore_cmd(bad, dst, "--detach", "--no-prefetch"), timeout=300)
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    rep = json.loads(p.stdout)
    check(p.returncode == 1 and f"locality block {lb} at offset" in msg and "checksum" in msg,
          f"LB {lb}, read by the device load, fails the restore: {msg}")
    check(not any(w in msg for w in ("query-migrate", "no answer", "given up", "within")),
          "the error is the engine's, not a QMP wait's")
    check(rep["error"] == msg.split("restore: ", 1)[-1] and rep["devices_loaded_ms"] is None,
          "the JSON error is the same, and the devices never finished loading")
    check(dt < 3, f"halite-qemu returned {dt:.2f} s after it started (QMP timeout: 10 s)")
    dst.adopt(rep["qemu"]["pid"])
    check(rep["qemu"]["pid"] > 0 and not dst.alive(), "its QEMU was killed")


def flip_byte(path, lb):
    """Flip a bit in the middle of locality block @lb (halite-inspect blocks' entry)."""
    off = lb["offset"] + lb["used"] // 2
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))


def first_device_load_lb(work, path):
    """The locality block the device state's load reads first: restore @path left
    paused without prefetch (only QEMU's own accesses read memory), stop it once
    the devices are loaded, and take the earliest demand read of its trace."""
    trace = os.path.join(work, "device-load.trace")
    probe = hg.Guest(work, "probe")
    proc = subprocess.Popen(restore_cmd(path, probe, "--paused", "--no-prefetch", "--trace", trace),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        check(wait_run_state(probe, proc, "paused"), "probe restore: devices loaded, paused")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    reads = []
    with open(trace) as f:
        for line in f:
            w = line.split()
            if w[0] == "lb" and w[2] == "demand":
                reads.append((int(w[3]), int(w[1])))
    check(reads, f"the device load read {len(reads)} LBs on demand: "
          f"{[lb for _, lb in sorted(reads)]}")
    return min(reads)[1]


def run_state(guest):
    """What query-status says, through the guest's own QMP socket."""
    q = guest.qmp()
    try:
        return q.cmd("query-status")["status"]
    finally:
        q.close()


def wait_run_state(guest, proc, want, timeout=60):
    """Until query-status on @guest's own QMP socket says @want while @proc
    (a restore) runs: True, or False after @timeout s or if @proc ended."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if os.path.exists(guest.qmp_path) and run_state(guest) == want:
                return True
        except (hg.GuestError, OSError, EOFError):
            pass
        time.sleep(0.05)
    return False


def case_runstate(work):
    """Every way out of a save leaves the guest in the run state it had, and a
    restore's cont is confirmed, whatever became of stop and cont: QEMU hung
    at the stop, a stop or cont whose reply is lost, a cont that never arrived,
    a failure between stop and arm (the fault points of halite/qemu/fault.c).
    A paused guest's save and the run state a restore leaves the guest in."""
    src = hg.Guest(work, "source").boot().wait_ready()
    src.rewrites(False)
    d0, _, _ = src.digest()
    path = os.path.join(work, "guest.hlt")
    hq = hg.halite_qemu()

    def faulty_save(fault, rc, text, want):
        out = path if fault == "cont-lost" else os.path.join(work, "other.hlt")
        p, dt = run([hq, "save", "--qmp", src.qmp_path, "--json", "-q", out], fault=fault)
        rep = json.loads(p.stdout)
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == rc and text in (rep["error"] if rc else "") and
              (not rc or text in err),
              f"{fault}: exit {p.returncode} in {dt:.1f} s{', ' + err if rc else ''}")
        st = run_state(src)
        check(st == want or (want is None and st in ("running", "paused")),
              f"{fault}: query-status says {st}")
        if want is None:
            return rep
        if want == "running":
            src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
        d, _, ok = src.digest() if want == "running" else (d0, 0, True)
        check(ok and d == d0, f"{fault}: memory digest {d} unchanged")
        return rep

    # A guest paused before its save: the save does not pause it, the file says paused.
    q = src.qmp()
    q.cmd("stop")
    q.close()
    paused = os.path.join(work, "paused.hlt")
    rep = save(src, paused)
    check(rep["pause_ms"] == 0 and rep["run_state"] == "paused",
          f"a paused guest's save: pause_ms {rep['pause_ms']}, run_state {rep['run_state']}")
    p, _ = run([hq, "save", "--qmp", src.qmp_path, "-q", os.path.join(work, "paused-text.hlt")],
               check_rc=0)
    line = [l for l in p.stdout.splitlines() if l.strip().startswith("pause ")][0].strip()
    check("not paused by the save" in p.stdout and "while the guest ran" not in p.stdout and
          "stayed paused" in p.stdout, f"its text report: {line}")
    check(run_state(src) == "paused", "the guest is still paused after its saves")
    meta = inspect_info(paused)["metadata"]
    check(meta.get("qemu.run-state") == "paused", "the file records qemu.run-state paused")
    q = src.qmp()
    q.cmd("cont")
    q.close()

    faulty_save("stop-reply-lost", 1, "pausing the guest (stop): stop: no answer from QEMU "
                "(test fault stop-reply-lost)", "running")
    faulty_save("hang-at-stop:1500", 1, "no answer from QEMU within 200 ms (test fault "
                "hang-at-stop:1500)", "running")
    faulty_save("fail-before-arm", 1, "test fault fail-before-arm", "running")
    # A cont lost or answered too late: the guest runs on, armed, and the save completes.
    for fault in ("cont-lost", "cont-reply-lost"):
        rep = faulty_save(fault, 0, "", "running")
        check(rep["ok"] and ram_bytes(rep) == 512 << 20, f"{fault}: the save completed")
    run([INSPECT, "verify", path], check_rc=0)
    # QEMU hung longer than halite-qemu waits (10 s): it cannot know what became
    # of its stop, and says so, loudly. (QEMU drops the requests of a client that
    # has gone, so here the stop may or may not run when QEMU wakes.)
    faulty_save("hang-at-stop:11000", 1, "the guest may be left paused: QEMU did not confirm "
                "the guest running within 10 s (query-status: no answer from QEMU", None)
    q = src.qmp()
    q.cmd("cont")
    q.close()
    # A paused guest stays paused whatever fails.
    q = src.qmp()
    q.cmd("stop")
    q.close()
    faulty_save("fail-before-arm", 1, "test fault fail-before-arm", "paused")
    q = src.qmp()
    q.cmd("cont")
    q.close()
    src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
    d, _, ok = src.digest()
    check(ok and d == d0, f"the guest runs on after all that, digest {d} unchanged")
    # QEMU dies while halite-qemu waits to see the run state (its stop timed out
    # after 200 ms): said at once, not after the 10 s it would wait for an answer.
    t = time.monotonic()
    proc = subprocess.Popen([hq, "save", "--qmp", src.qmp_path, "-q", os.path.join(work, "x.hlt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, HALITE_QEMU_TEST_FAULT="hang-at-stop:1000"))
    time.sleep(0.6)
    pid = src.pid
    src.kill()
    _, err = proc.communicate(timeout=60)
    dt = time.monotonic() - t
    err = err.strip().splitlines()[-1] if err.strip() else ""
    check(proc.returncode == 1 and f"save: QEMU (pid {pid}) has exited; before that" in err and
          dt < 5, f"QEMU killed during the save, {dt:.1f} s: {err}")

    check(inspect_info(path)["metadata"].get("qemu.run-state") == "running",
          "a running guest's file records qemu.run-state running")

    def restored(name, file, *opts, want):
        dst = hg.Guest(work, name)
        rep = restore(file, dst, *opts)
        time.sleep(0.5)
        st = run_state(dst)
        check(rep["run_state"] == st == want and rep["paused"] == (want == "paused"),
              f"{name}: {' '.join(opts) or 'no option'}: query-status says {st}, as the "
              f"report ({rep['run_state']}, saved {rep['saved_run_state']})")
        if st == "paused":
            q = dst.qmp()
            q.cmd("cont")
            q.close()
        d, _, ok = dst.digest()
        check(ok and d == d0, f"{name}: memory digest {d} equals the snapshot's")
        dst.kill()

    # As virsh restore: a guest saved paused comes back paused, unless --running.
    restored("paused-as-saved", paused, want="paused")
    restored("paused-running", paused, "--running", want="running")
    restored("running-paused", path, "--paused", want="paused")

    # A save onto the file a running restore reads is refused before QEMU is touched.
    dst = hg.Guest(work, "holder")
    holder = subprocess.Popen(restore_cmd(path, dst, "--paused", "--no-prefetch"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sock = os.path.join(work, "untouched-qmp.sock")
        listener = hg.unix_listener(sock)
        # From the moment its QEMU starts (the file checked, the engine not yet
        # started), and once the devices are loaded (the guest paused).
        deadline = time.monotonic() + 60
        while not os.path.exists(dst.qmp_path) and time.monotonic() < deadline:
            time.sleep(0.002)
        for when in ("QEMU started", "guest loaded"):
            if when == "guest loaded":
                check(wait_run_state(dst, holder, "paused"), "the restore is running, paused")
            p, _ = run([hq, "save", "--qmp", sock, path])
            err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
            check(p.returncode == 1 and "is being restored from" in err and
                  not hg.accepted(listener), f"save onto a file being restored ({when}): {err}")
        listener.close()
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=60)

    # A restore's cont lost, or its reply: confirmed by query-status, the guest runs.
    for fault in ("cont-lost", "cont-reply-lost"):
        dst = hg.Guest(work, f"restored-{fault}")
        p, _ = run(restore_cmd(path, dst, "--detach"), check_rc=0, fault=fault)
        dst.adopt(json.loads(p.stdout)["qemu"]["pid"])
        check(run_state(dst) == "running", f"restore with {fault}: the guest runs")
        d, _, ok = dst.digest()
        check(ok and d == d0, f"restore with {fault}: digest {d} equals the snapshot's")
        dst.kill()


# PTRACE_SEIZE the process given, say so, then hold it until killed (the
# kernel detaches a dead tracer's tracees; SEIZE does not stop the tracee).
TRACER = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(0x4206, int(sys.argv[1]), None, None) != 0:  # PTRACE_SEIZE
    sys.exit(f"PTRACE_SEIZE: errno {ctypes.get_errno()}")
print("seized", flush=True)
sys.stdin.read()
"""


def fake_qmp(path, version):
    """A QMP server that greets as QEMU @version and answers {"return": {}}
    to everything, for one client; returns its thread."""
    import socket
    import threading
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        hg.qmp_greet(c, version)
        f = c.makefile("rb")
        for line in f:
            req = json.loads(line)
            c.sendall(json.dumps({"return": {}, "id": req.get("id")}).encode() + b"\r\n")
        c.close()
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t




def case_4g(work):
    """4 GiB of RAM: q35 maps 2 GiB below 4 GiB and 2 GiB above, two regions of one block."""
    src = hg.Guest(work, "source", mem_mib=4096).boot().wait_ready()
    src.rewrites(False)
    d0, _, _ = src.digest()
    path = os.path.join(work, "guest.hlt")
    save(src, path)
    src.kill()
    regions = ram_regions(inspect_info(path))
    check(set(regions) == {"mem0", "mem0@0x80000000"} and
          regions["mem0"]["gpa"] == 0 and regions["mem0"]["length"] == 2 << 30 and
          regions["mem0@0x80000000"]["gpa"] == 4 << 30 and
          regions["mem0@0x80000000"]["length"] == 2 << 30,
          "regions mem0 (GPA 0, 2 GiB) and mem0@0x80000000 (GPA 4 GiB, 2 GiB)")
    dst = hg.Guest(work, "restored", mem_mib=4096)
    restore(path, dst)
    d1, _, ok = dst.digest()
    check(ok and d1 == d0, f"memory digest after the restore equals the snapshot's ({d1})")
    dst.kill()


def set_backend(guest, backend):
    """Guest RAM on another memory backend (id mem0, same size)."""
    i = next(k for k, a in enumerate(guest.args) if a.startswith("memory-backend-memfd,id=mem0"))
    guest.args[i] = f"{backend},id=mem0,size={guest.mem_mib}M"
    return guest


def free_hugepages():
    with open("/proc/meminfo") as f:
        return int([l for l in f if l.startswith("HugePages_Free:")][0].split()[1])


def hugepages(n):
    """Make at least @n free 2 MiB huge pages; returns the old nr_hugepages."""
    path = "/proc/sys/vm/nr_hugepages"
    with open(path) as f:
        old = int(f.read())
    free = free_hugepages()
    if free < n:
        with open(path, "w") as f:
            f.write(str(old + n - free))
    free = free_hugepages()
    if free < n:
        with open(path, "w") as f:
            f.write(str(old))
        raise Fail(f"could not reserve {n} huge pages of 2 MiB ({free} free)")
    return old


def ram_page_kib(guest):
    """The page size (KiB) of QEMU's guest RAM mapping (the largest), from smaps."""
    size, best, page = 0, 0, 0
    with open(f"/proc/{guest.pid}/smaps") as f:
        for line in f:
            if line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("KernelPageSize:") and size > best:
                best, page = size, int(line.split()[1])
    return page


def save_digest_restore(work, src, dsts, what):
    """Save @src (rewrites frozen), restore into each of @dsts in turn: the digest must
    survive, and each restored guest's RAM is on the page size its backend asks for."""
    src.boot().wait_ready()
    src.rewrites(False)
    d0, _, ok0 = src.digest()
    check(ok0, f"{what}: source digest {d0}")
    path = os.path.join(work, f"{src.name}.hlt")
    rep = save(src, path)
    check(rep["faults_vcpu"] > 0 and ram_bytes(rep) == src.mem_mib << 20,
          f"{what}: saved {rep['mb_total']} blocks, {rep['faults_vcpu']} vCPU first touches")
    src.kill()
    for dst in dsts:
        huge = any("hugetlb=on" in a for a in dst.args)
        rrep = restore(path, dst)
        d1, _, ok1 = dst.digest()
        check(ok1 and d1 == d0, f"{what}, onto {dst.name}: digest after the restore equals "
              f"the snapshot's ({d1})")
        check(rrep["mb_fault"] + rrep["mb_pool"] + rrep["mb_prefetch"] + rrep["mb_zero"] ==
              rrep["mb_total"], f"{what}, onto {dst.name}: every block installed once")
        check(ram_page_kib(dst) == (2048 if huge else 4), f"{what}, onto {dst.name}: its RAM "
              f"on {ram_page_kib(dst)} KiB pages")
        dst.wait_console(r"^verifier: pass \d+ ok", 30, after=len(dst.console_text()))
        dst.check_console()
        dst.kill()
    os.unlink(path)


HUGE_MEMFD = "memory-backend-memfd,share=on,hugetlb=on,hugetlbsize=2M"


def case_backends(work):
    """The other shared backends: a file on tmpfs, and 2 MiB huge pages, saved and restored,
    each also onto the other (a file saved from 4 KiB pages spreads each huge page over many
    locality blocks)."""
    shm = os.path.join("/dev/shm", os.path.basename(work))
    os.mkdir(shm)
    # A 512 MiB guest on huge pages is 256 of them; the restore's QEMU maps (and the
    # restore reserves) another 256 while a source's may not be freed yet: 512, and
    # slack for QEMU.
    old = hugepages(2 * 256 + 8)
    try:
        src = set_backend(hg.Guest(work, "tmpfs-src"), "memory-backend-file,share=on,"
                          f"mem-path={shm}/src.ram")
        dst = set_backend(hg.Guest(work, "tmpfs-dst"), "memory-backend-file,share=on,"
                          f"mem-path={shm}/dst.ram")
        onto_huge = set_backend(hg.Guest(work, "tmpfs-to-huge"), HUGE_MEMFD)
        save_digest_restore(work, src, [dst, onto_huge], "tmpfs file backend saved")
        src = set_backend(hg.Guest(work, "huge-src"), HUGE_MEMFD)
        dst = set_backend(hg.Guest(work, "huge-dst"), HUGE_MEMFD)
        onto_memfd = hg.Guest(work, "huge-to-memfd")
        save_digest_restore(work, src, [dst, onto_memfd], "hugetlbfs memfd saved")
    finally:
        subprocess.run(["pkill", "-9", "-f", work], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        time.sleep(0.2)
        shutil.rmtree(shm, ignore_errors=True)
        if old is not None:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(old))


BALLOON = ["-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on"]
FS_IOC_GETFLAGS = 0x80086601
FS_APPEND_FL = 0x20


def qemu_discard_failures(guest):
    """Discards QEMU reported failed (ram_block_discard_range) on its stderr."""
    with open(os.path.join(guest.workdir, f"{guest.name}-qemu.err"), errors="replace") as f:
        return sum(1 for line in f if "ram_block_discard_range" in line)


def ram_file_flags(guest):
    """The FS flags of the guest RAM's file (the memfd), as QEMU holds it."""
    for fd in os.listdir(f"/proc/{guest.pid}/fd"):
        p = f"/proc/{guest.pid}/fd/{fd}"
        try:
            if "memfd:" in os.readlink(p) and os.stat(p).st_size >= guest.mem_mib << 20:
                with open(p, "rb") as f:
                    buf = bytearray(4)
                    fcntl.ioctl(f.fileno(), FS_IOC_GETFLAGS, buf)
                    return int.from_bytes(buf, "little")
        except OSError:
            continue
    raise Fail("the guest RAM's memfd is not among QEMU's descriptors")


def ram_registered(guest):
    """Some of QEMU's guest RAM is registered with a userfaultfd (smaps VmFlags)."""
    with open(f"/proc/{guest.pid}/smaps") as f:
        return any(l.startswith("VmFlags:") and (" ui" in l or " um" in l) for l in f)


def balloon_to(q, mib, timeout=30):
    q.cmd("balloon", value=mib << 20)
    deadline = time.monotonic() + timeout
    while q.cmd("query-balloon")["actual"] != mib << 20:
        if time.monotonic() > deadline:
            raise Fail(f"the balloon did not reach {mib} MiB in {timeout} s "
                       f"({q.cmd('query-balloon')['actual'] >> 20} MiB)")
        time.sleep(0.05)


def case_discard(work):
    """A second save of a VM being saved, and a balloon giving memory back during a save."""
    qmp2 = os.path.join(work, "src-qmp2.sock")
    src = hg.Guest(work, "src")
    src.args += BALLOON + ["-qmp", f"unix:{qmp2},server=on,wait=off"]
    src.boot().wait_ready()
    src.rewrites(False)
    d0, _, ok = src.digest()
    check(ok, f"source digest {d0}")
    path = os.path.join(work, "held.hlt")
    # The first save, its registration held 10 s once armed (test fault point).
    env = dict(os.environ, HALITE_QEMU_TEST_FAULT="hold-after-arm:10000")
    first = subprocess.Popen([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "--json", "-q",
                              path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    deadline = time.monotonic() + 30
    while not ram_registered(src) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    check(ram_registered(src), "the first save has armed copy-on-access")
    # A second save, on QEMU's second QMP socket: refused before QEMU is touched.
    second = os.path.join(work, "second.hlt")
    p, dt = run([hg.halite_qemu(), "save", "--qmp", qmp2, "-q", second])
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and dt < 5 and ("is being saved or restored by halite process "
                                            f"{first.pid}" in msg or
                                            "already registered with a userfaultfd" in msg),
          f"a second save of the VM is refused in {dt:.2f} s: {msg}")
    check(not os.path.exists(second), "the second save wrote no file")
    q = hg.QMP(qmp2)
    check(q.cmd("query-status")["status"] == "running", "the guest ran on throughout")
    # The balloon gives memory back while the first save holds: QEMU's hole
    # punches are refused, so no block not yet saved can turn into zeros.
    check(ram_file_flags(src) & FS_APPEND_FL, "the RAM's file refuses hole punches during "
          "the save")
    before = qemu_discard_failures(src)
    balloon_to(q, 448)
    during = qemu_discard_failures(src)
    check(first.poll() is None and ram_registered(src), "the balloon inflated while the "
          "save held (else the test proves nothing: a slow machine?)")
    check(during - before >= (64 << 20) // 4096 // 2,
          f"the balloon's discards during the save were refused ({during - before} reported "
          "by QEMU)")
    out, err = first.communicate(timeout=120)
    check(first.returncode == 0, f"the first save completes: {err.strip()[-300:]}")
    rep = json.loads(out)
    log(f"  first save: {rep['save_s']:.2f} s, {rep['faults']} faults")
    check(not ram_file_flags(src) & FS_APPEND_FL, "after the save the file takes hole punches "
          "again")
    # (Free page reporting may have had discards refused after the count above.)
    after = qemu_discard_failures(src)
    balloon_to(q, 384)
    check(qemu_discard_failures(src) == after, "the balloon's discards after the save "
          "succeed")
    q.close()
    src.kill()
    dst = hg.Guest(work, "dst")
    dst.args += BALLOON
    restore(path, dst)
    d1, _, ok = dst.digest()
    check(ok and d1 == d0, f"the first save's file restores the guest exactly: digest {d1}")
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.check_console()
    dst.kill()
    # Huge pages can neither refuse a hole nor show one: with a balloon, refused at once.
    # (264: one guest of 256 pages at a time, and slack.)
    old = hugepages(256 + 8)
    try:
        huge = set_backend(hg.Guest(work, "huge"),
                           "memory-backend-memfd,share=on,hugetlb=on,hugetlbsize=2M")
        huge.args += BALLOON
        huge.boot().wait_ready()
        p, _ = run([hg.halite_qemu(), "save", "--qmp", huge.qmp_path, "-q",
                    os.path.join(work, "huge.hlt")])
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == 77 and "hugetlbfs and a virtio-balloon device" in msg,
              f"a hugetlbfs guest with a balloon is refused: {msg}")
        check(huge.qmp().cmd("query-status")["status"] == "running" and not ram_registered(huge),
              "and left running, untouched")
        huge.kill()
        # Nor can a restore onto it refuse the balloon's hole punches: refused too.
        onto = set_backend(hg.Guest(work, "huge-restore"), HUGE_MEMFD)
        onto.args += BALLOON
        p, _ = run(restore_cmd(path, onto, "--detach"))
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == 77 and "on hugetlbfs, and the virtio-balloon device" in msg,
              f"a restore onto hugetlbfs with a balloon is refused: {msg}")
    finally:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(str(old))


def case_attach(work):
    """halite-qemu restore killed mid-restore; restore --attach takes over and finishes it."""
    src = hg.Guest(work, "source").boot().wait_ready()
    src.rewrites(False)
    d0, _, ok = src.digest()
    check(ok, f"source digest {d0}")
    path = os.path.join(work, "guest.hlt")
    save(src, path)
    src.kill()
    dst = hg.Guest(work, "victim")
    proc, q, tids, qemu_pid = slow_restore(path, dst)
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    lines = len(dst.verifier_lines())
    time.sleep(1)
    check(len(dst.verifier_lines()) == lines and dst.alive(),
          "halite-qemu restore killed: QEMU lives, the guest waits for its memory")
    # QEMU's main loop reads guest memory no one brought in (a monitor command
    # here; a NIC's packet or a device's DMA as well): it waits, and QMP
    # answers nothing until a handler serves that page.
    def in_fault(tid):
        try:
            with open(f"/proc/{qemu_pid}/task/{tid}/wchan") as f:
                return f.read().strip() == "handle_userfault"
        except OSError:
            return False

    blocked = False
    for mib in range(dst.mem_mib // 2, dst.mem_mib, 16):
        q.send("human-monitor-command", **{"command-line": f"xp /1xg {mib << 20:#x}"})
        # Until QEMU's main loop waits in a fault, or its reply comes (that page
        # was in): a loaded machine may take a while for either.
        deadline = time.monotonic() + 5
        replied = False
        while not blocked and not replied and time.monotonic() < deadline:
            blocked = in_fault(qemu_pid)
            replied = not blocked and bool(select.select([q.s], [], [], 0.05)[0])
        if not blocked and not replied:
            # No answer: the main loop may wait for a lock (the BQL) that a
            # thread waiting for a page holds. Stuck all the same, on a fault.
            blocked = any(in_fault(t) for t in os.listdir(f"/proc/{qemu_pid}/task"))
            check(blocked, "QMP answers nothing in 5 s, and a QEMU thread waits for a page")
        if blocked:
            break
        q.cmd("query-status")  # that page was in: its reply, then the next
    check(blocked, "QEMU's main loop waits for a page of guest memory (QMP is stuck)")
    q.close()
    p, dt = run([hg.halite_qemu(), "restore", "--attach", str(qemu_pid), "--json", "-q", path])
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 0, f"restore --attach {qemu_pid} finishes it in {dt:.2f} s {err}")
    rep = json.loads(p.stdout)
    log(f"  attach: {rep['mb_present']} blocks were in already, {rep['faults']} faults, "
        f"{rep['lb_demand']} demand / {rep['lb_prefetch']} prefetched LBs")
    check(rep["forwards"] == 0, "the dead handler had added the host forward already")
    check(rep["mb_present"] > 0 and rep["mb_present"] + rep["mb_fault"] + rep["mb_pool"] +
          rep["mb_prefetch"] + rep["mb_zero"] == rep["mb_total"],
          f"the blocks in already were kept ({rep['mb_present']}), the counts add up")
    d1, _, ok = dst.digest()
    check(ok and d1 == d0, f"the guest's memory digest equals the snapshot's ({d1})")
    n = len(dst.console_text())
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=n)
    dst.rewrites(True)
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.check_console()
    check(True, "the verifier keeps passing, with rewrites on again")
    p, _ = run([hg.halite_qemu(), "restore", "--attach", str(qemu_pid), "-q", path])
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "holds no userfaultfd" in msg,
          f"a second --attach, with the restore over, is refused: {msg}")
    dst.kill()
    # Killed before the device state was sent (test fault point): --attach loads it.
    early = hg.Guest(work, "early")
    p, _ = run(restore_cmd(path, early, "--detach"), fault="die-before-load")
    check(p.returncode == -signal.SIGKILL, f"halite-qemu restore killed before the load "
          f"(exit {p.returncode})")
    qemu_pid = int(subprocess.run(["pgrep", "-f", early.console], stdout=subprocess.PIPE,
                                  text=True).stdout.split()[0])
    early.adopt(qemu_pid)
    p, dt = run([hg.halite_qemu(), "restore", "--attach", str(qemu_pid), "--json", "-q", path])
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 0, f"restore --attach loads the device state and finishes: {err}")
    check(json.loads(p.stdout)["forwards"] == 1, "and adds the host forward the dead handler "
          "had not (its HTTP answers below)")
    d2, _, ok = early.digest()
    check(ok and d2 == d0, f"that guest's digest equals the snapshot's too ({d2})")
    early.kill()
    # Onto huge pages: the dead handler may leave huge pages half assembled in the page
    # cache, never mapped for the guest; --attach keeps those it mapped and writes the
    # others again. (Shorter reads: a fault there waits for every LB of its huge page.)
    old = hugepages(256 + 8)
    try:
        huge = set_backend(hg.Guest(work, "huge-victim"), HUGE_MEMFD)
        proc, q, _, qemu_pid = slow_restore(path, huge, 20000)
        time.sleep(0.5)
        proc.kill()
        proc.wait()
        q.close()
        p, dt = run([hg.halite_qemu(), "restore", "--attach", str(qemu_pid), "--json", "-q",
                     path])
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == 0, f"on hugetlbfs, restore --attach {qemu_pid} finishes it in "
              f"{dt:.2f} s {err}")
        rep = json.loads(p.stdout)
        log(f"  attach on hugetlbfs: {rep['mb_present']} blocks were in already, "
            f"{rep['faults']} faults, {rep['lb_demand']} demand / {rep['lb_prefetch']} "
            "prefetched LBs")
        check(rep["mb_present"] + rep["mb_fault"] + rep["mb_pool"] + rep["mb_prefetch"] +
              rep["mb_zero"] == rep["mb_total"], "on hugetlbfs, the counts add up")
        d3, _, ok = huge.digest()
        check(ok and d3 == d0, f"on hugetlbfs, the guest's digest equals the snapshot's ({d3})")
        huge.wait_console(r"^verifier: pass \d+ ok", 60, after=len(huge.console_text()))
        huge.check_console()
        huge.kill()
    finally:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(str(old))


def case_cli(work):
    """Wrong arguments and files that are not halite-qemu snapshots: exit code and message."""
    hq = hg.halite_qemu()

    def expect(args, rc, text):
        p, _ = run([hq, *args])
        last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == rc and text in p.stderr, f"{' '.join(args)[:60]!r}: exit {rc}, {last}")

    expect(["save", "x.hlt"], 2, "--qmp SOCKET is required")
    expect(["save", "--qmp", "/nonexistent.sock", os.path.join(work, "x.hlt")], 1,
           "No such file or directory")
    expect(["save", "--qmp", "s", "--codec", "brotli", "x.hlt"], 2, "--codec 'brotli'")
    expect(["restore", "x.hlt", "--"], 2, "QEMU's command line missing after '--'")
    expect(["restore", os.path.join(work, "none.hlt")], 1, "No such file")
    expect(["restore", "x.hlt", "--", "-incoming", "defer"], 2, "-incoming is halite-qemu's")
    expect(["restore", "x.hlt", "--", "-daemonize"], 2, "--detach")
    expect(["restore", "--running", "--paused", "x.hlt", "--", "-m", "1G"], 2, "not both")
    expect(["restore", "--running", "x.hlt", "--", "-S"], 2, "contradict each other")
    expect(["restore", "/etc/passwd", "--", "-m", "1G"], 1, "not a Halite snapshot")
    expect(["restore", "--prefetch-idle", "0", "x.hlt", "--", "-m", "1G"], 2,
           "--prefetch-idle '0': 1..10000000 us")
    expect(["restore", "--prefetch-rate", "lots", "x.hlt", "--", "-m", "1G"], 2,
           "--prefetch-rate 'lots': 1..1000000 MiB/s")
    # A good Halite file that holds no QEMU device state.
    img = os.path.join(work, "img.raw")
    with open(img, "wb") as f:
        f.write(b"\x01" * 65536)
    plain = os.path.join(work, "plain.hlt")
    run([INSPECT, "import", img, "--region", "mem0", "-o", plain], check_rc=0)
    expect(["restore", plain, "--", "-m", "1G"], 1, "not saved by halite-qemu")
    expect(["bogus"], 2, "unknown command")
    # A QEMU older than 7.2 (a QMP server that greets as 6.2.0).
    sock = os.path.join(work, "old-qmp.sock")
    fake_qmp(sock, (6, 2, 0))
    expect(["save", "--qmp", sock, os.path.join(work, "old.hlt")], 77,
           "QEMU 6.2.0 (pid %d) is too old: halite-qemu needs 7.2 or newer" % os.getpid())
    check(not os.path.exists(os.path.join(work, "old.hlt")), "no file left behind")
    # The output path is checked before QEMU is touched: no connection at all.
    sock = os.path.join(work, "untouched-qmp.sock")
    listener = hg.unix_listener(sock)
    held = os.path.join(work, "held.hlt")
    with open(held, "wb") as f:
        f.write(b"an older snapshot")
    with open(held, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # what a running restore holds (HALITE_LOCK_PROTOCOL)
        for path, rc, text in ((os.path.join(work, "no-such-dir", "x.hlt"), 1,
                                "no-such-dir: No such file or directory"),
                               (work, 1, f"{work} is a directory"),
                               (held, 1, "is being restored from (a running restore reads it)"),
                               ("", 2, "no file name given")):
            expect(["save", "--qmp", sock, path], rc, text)
    check(not hg.accepted(listener), "no bad path made halite-qemu connect to QEMU")
    with open(held, "rb") as f:
        check(f.read() == b"an older snapshot", "the file a restore holds is untouched")
    listener.close()
    cli_recorded(work, expect)


# A stand-in for QEMU: writes its directory, arguments and environment's
# HALITE_QEMU_CMDLINE where FAKE_QEMU_OUT says, and exits 3 (before any QMP).
FAKE_QEMU = """#!/bin/sh
{ pwd; printf '%s\\n' "$@"; } >"$FAKE_QEMU_OUT"
printf '%s' "$HALITE_QEMU_CMDLINE" >"$FAKE_QEMU_OUT.env"
exit 3
"""


def mkfile(path, argv=None, cwd=None, devices=None):
    """A snapshot as halite-qemu save writes one (tests/qemu/mkfile.c), no QEMU needed."""
    tool = os.environ.get("HALITE_QEMU_MKFILE") or os.path.join(
        hg.ROOT, "build", "tests", "qemu", "qemu_mkfile")
    cmd = [tool, path]
    if cwd:
        cmd += ["--cwd", cwd]
    if devices:
        cmd += ["--devices", ",".join(devices)]
    if argv is not None:
        cmd += ["--", *argv]
    run(cmd, check_rc=0)
    return path


def cli_recorded(work, expect):
    """The recorded command line, before any QEMU starts: replayed as it was run (in its
    directory, without halite-qemu's options, its forwards taken out to be added once
    loaded), compared with a given one and refused naming the difference, and refused
    when its sockets, host ports or memory files are in use."""
    hq = hg.halite_qemu()
    fake = os.path.join(work, "fake-qemu")
    with open(fake, "w") as f:
        f.write(FAKE_QEMU)
    os.chmod(fake, 0o755)
    out = os.path.join(work, "fake.out")
    env = dict(os.environ, FAKE_QEMU_OUT=out)
    vmdir = os.path.join(work, "vm")
    os.mkdir(vmdir)
    port = hg.free_port()
    qmp = os.path.join(work, "vm-qmp.sock")
    saved = [fake, "-machine", "q35", "-smp", "2", "-m", "512M", "-S", "-daemonize",
             "-object", "memory-backend-memfd,id=mem0,size=512M,share=on",
             "-machine", "memory-backend=mem0", "-kernel", "vmlinux", "-incoming", "defer",
             "-nic", f"user,model=e1000,hostfwd=tcp:127.0.0.1:{port}-:80,hostfwd=udp::{port}-:7",
             "-serial", "file:console.log", "-qmp", f"unix:{qmp},server=on,wait=off"]
    path = mkfile(os.path.join(work, "rec.hlt"), saved, cwd=vmdir)

    def restore(*args, rc=1):
        if os.path.exists(out):
            os.unlink(out)
        p = subprocess.run([hq, "restore", "--json", "-q", path, *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, timeout=120)
        err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        check(p.returncode == rc, f"restore {' '.join(args)[:50]}: exit {p.returncode}: {err}")
        return json.loads(p.stdout) if p.stdout.strip() else None, err

    # No command line given: the recorded one, in its directory.
    rep, err = restore()
    check("QEMU exited (status 3) before its QMP socket came up" in err, f"the recorded QEMU "
          f"ran: {err}")
    with open(out) as f:
        ran = f.read().splitlines()
    with open(out + ".env") as f:
        user = json.loads(f.read())
    want = [a for a in saved[1:] if a not in ("-S", "-daemonize", "-incoming", "defer")]
    want[want.index("-nic") + 1] = "user,model=e1000,id=halite.nic0"
    check(ran[0] == vmdir, f"in the recorded directory {ran[0]}")
    check(ran[1:-5] == want, f"the recorded command line without -S, -daemonize, -incoming "
          f"and its forwards: {' '.join(ran[1:-5])}")
    check(ran[-5:-2] == ["-S", "-incoming", "defer"] and ran[-2] == "-qmp" and
          ran[-1].startswith("unix:/tmp/halite-qemu."), f"then halite-qemu's: {ran[-5:]}")
    check(user == [a for a in saved if a not in ("-S", "-daemonize", "-incoming", "defer")],
          "QEMU's environment holds the user's command line, forwards and all, for the next save")
    check(rep["detached"] and rep["cmdline"] == "recorded", "-daemonize at save: detached")

    # A given command line that differs where it matters: refused before QEMU starts.
    same = [a for a in saved if a not in ("-S", "-daemonize", "-incoming", "defer")]
    other = list(same)
    other[other.index("-smp") + 1] = "4"
    other[other.index("-nic") + 1] = "user,model=virtio-net-pci"
    rep, err = restore("--", *other)
    check("QEMU's command line differs from the one recorded in" in err and
          "-smp 2 at save, -smp 4 now" in err and "-nic user,model=e1000," in err and
          "-nic user,model=virtio-net-pci now" in err and not os.path.exists(out),
          f"refused before QEMU starts: {err}")
    # What does not matter passes: QEMU starts (and the stand-in exits).
    fine = list(same)
    fine[fine.index("-serial") + 1] = "file:/elsewhere.log"
    fine[fine.index("-nic") + 1] = f"user,model=e1000,hostfwd=tcp::{hg.free_port()}-:80"
    fine[fine.index("-qmp") + 1] = f"unix:{work}/other.sock,server=on,wait=off"
    fine += ["-display", "none", "-name", "clone"]
    rep, err = restore("--", *fine)
    check(os.path.exists(out) and rep["cmdline"] == "given", "serial path, host ports, QMP "
          "socket, display and name may differ: QEMU started")
    os.unlink(out)
    rep, err = restore("--no-cmdline-check", "--", *other)
    check(os.path.exists(out), "--no-cmdline-check runs a differing command line")

    # In use: the QMP socket (QEMU would take its path over), a host port, a memory file.
    listener = hg.unix_listener(qmp)
    rep, err = restore()
    check(f"-qmp unix:{qmp},server=on,wait=off: the socket {qmp} is in use (process "
          f"{os.getpid()}" in err and not os.path.exists(out), f"a socket in use: {err}")
    listener.close()
    os.unlink(qmp)
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", port))
    taken.listen(1)
    rep, err = restore()
    check(f"hostfwd=tcp:127.0.0.1:{port}-:80 (netdev halite.nic0): host port {port} cannot be "
          "bound: Address already in use" in err and not os.path.exists(out),
          f"a host port in use: {err}")
    taken.close()
    ram = os.path.join(work, "ram.file")
    with open(ram, "wb") as f:
        f.truncate(1 << 20)
    import mmap
    with open(ram, "r+b") as f:
        m = mmap.mmap(f.fileno(), 1 << 20)
        bad = list(same)
        bad[bad.index("memory-backend-memfd,id=mem0,size=512M,share=on")] = \
            f"memory-backend-file,id=mem0,size=512M,share=on,mem-path={ram}"
        rep, err = restore("--", *bad)
        m.close()
    check(f"the memory file {ram} is mapped by process {os.getpid()}" in err and
          "would punch that process's memory" in err and not os.path.exists(out),
          f"a memory file in use: {err}")

    # A file from before the command line was recorded; a directory that is gone.
    old = mkfile(os.path.join(work, "old.hlt"))
    expect(["restore", old], 1, "records no QEMU command line (saved by an older halite-qemu)")
    gone = mkfile(os.path.join(work, "gone.hlt"), saved, cwd=os.path.join(work, "no-such-dir"))
    expect(["restore", gone], 1, "working directory at save, " + os.path.join(work, "no-such-dir")
           + ", is gone")


def udp_noports(guest):
    """The guest kernel's count of UDP datagrams to ports nobody listens on."""
    kv = dict(l.split() for l in guest.http("/cgi-bin/udp").splitlines() if l.strip())
    return int(kv["NoPorts"])


def case_network(work):
    """A connection held from the moment the restore starts is answered soon
    after the guest resumes (well before slirp's retransmission), for e1000, e1000e and virtio-net-pci: the
    host forwards are added once the guest's state is loaded (before, slirp
    parked the connection's SYN on a clock the load then moved past, and
    retransmitted it 6 s later). The -nic and -netdev forms, tcp and udp rules."""
    nics = [("e1000", {"nic_model": "e1000"}),
            ("e1000e", {"nic_model": None}),          # q35's default -nic user
            ("virtio-net-pci", {"nic_model": "virtio-net-pci", "netdev": True})]
    for name, kw in nics:
        src = hg.Guest(work, f"src-{name}", udp=True, **kw).boot().wait_ready()
        path = os.path.join(work, f"{name}.hlt")
        save(src, path)
        src.kill()
        dst = hg.Guest(work, f"dst-{name}", udp=True, **kw)
        t0 = time.monotonic()
        proc = subprocess.Popen(restore_cmd(path, dst, "--detach"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            t_conn, t_ans, status, body = hg.held_get(
                dst.port, "/hello.txt", t0 + 60,
                alive=lambda: None if proc.poll() in (None, 0) else "the restore failed")
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        check(proc.returncode == 0, f"{name}: restored ({err.strip()[-200:]})")
        rep = json.loads(out)
        dst.adopt(rep["qemu"]["pid"])
        # t0 is taken before halite-qemu starts, so its times from t0 are a
        # little early and the time after the resume a little long: never short.
        resumed = t0 + rep["resumed_ms"] / 1e3
        after = t_ans - resumed
        log(f"  {name}: connected {t_conn - t0:.3f} s after the start, forwards added at "
            f"{rep.get('forwarded_ms', 0) / 1e3:.3f} s, resumed {rep['resumed_ms'] / 1e3:.3f} s, "
            f"answered {t_ans - t0:.3f} s ({after:.3f} s after the resume)")
        check(status == 200 and "hello" in body, f"{name}: GET /hello.txt answered: {status}")
        # What this guards against is slirp's retransmission of a parked SYN,
        # 6 s later; a guest under TCG on a loaded machine (CI's TSan run, the
        # other suites beside it) answered 1.1 s after the resume, so the
        # bound sits between the two.
        check(after < 3.0, f"{name}: the held connection was answered {after:.3f} s after the "
              "guest resumed (< 3 s: not slirp's retransmission, 6 s later)")
        check(rep["forwards"] == 2 and 0 < rep["forwarded_ms"] <= rep["resumed_ms"],
              f"{name}: 2 forwards added before the guest resumed")
        # The udp rule: a datagram to the host port reaches the guest's port 7,
        # where nothing listens: the guest counts it in NoPorts.
        before = udp_noports(dst)
        import socket
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        deadline = time.monotonic() + 10
        while udp_noports(dst) == before and time.monotonic() < deadline:
            u.sendto(b"halite", ("127.0.0.1", dst.udp_port))
            time.sleep(0.2)
        u.close()
        check(udp_noports(dst) > before, f"{name}: the udp forward reaches the guest "
              f"(NoPorts {before} -> {udp_noports(dst)})")
        dst.check_console()
        dst.kill()


def pids_naming(text):
    """Live processes whose command line holds @text."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read() and guest_alive(int(d)):
                        out.append(int(d))
            except OSError:
                pass
    return out


def guest_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def case_recorded(work):
    """The command line a save records (qemu.cmdline, qemu.cwd, qemu.devices), shown by
    halite-inspect info, and restores that run it with no QEMU arguments: in its
    directory (relative paths), with its QMP socket and host ports; a save of a QEMU
    that halite-qemu restore started records the user's command line, not the one
    halite-qemu ran; a differing command line is refused before QEMU starts; a device
    hot-plugged at the source is named, and restored when given on the command line."""
    vmdir = os.path.join(work, "vm")
    os.mkdir(vmdir)
    for f in ("vmlinux", "initrd.img"):
        os.symlink(os.path.join(hg.ROOT, "build", "guest-image", f), os.path.join(vmdir, f))
    src = hg.Guest(vmdir, "source")
    # Relative paths, and a PCIe root port a device can be hot-plugged into.
    src.args = [{src.console: "source-console.log"}.get(a, a) for a in src.args]
    src.args = ["file:source-console.log" if a == f"file:{src.console}" else
                "vmlinux" if a.endswith("/vmlinux") else
                "initrd.img" if a.endswith("/initrd.img") else a for a in src.args]
    src.args += ["-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1"]
    argv = ["qemu-system-x86_64", *src.args]
    src.boot(cwd=vmdir).wait_ready()
    src.rewrites(False)
    d0, _, ok = src.digest()
    check(ok, f"source digest {d0}")
    first = os.path.join(work, "first.hlt")
    save(src, first)
    src.kill()
    meta = inspect_info(first)["metadata"]
    check(meta["qemu.cmdline"] == argv, "qemu.cmdline is QEMU's command line as it ran "
          f"({len(argv)} arguments)")
    check(meta["qemu.cwd"] == vmdir, f"qemu.cwd is its directory {meta['qemu.cwd']}")
    check("virtio-net-pci addr=02.0" in meta["qemu.devices"] and
          "pcie-root-port id=rp1 addr=03.0" in meta["qemu.devices"],
          f"qemu.devices lists {len(meta['qemu.devices'])} devices")
    p, _ = run([INSPECT, "info", first], check_rc=0)
    text = p.stdout
    check("  qemu.cmdline = qemu-system-x86_64 \\\n      -machine q35 \\\n" in text and
          "      -append 'console=ttyS0 " in text, "halite-inspect info shows it one option a "
          "line, quoted as a shell would")

    # No QEMU arguments: the recorded command line, in its directory, from anywhere.
    p, _ = run([hg.halite_qemu(), "restore", "--detach", "--json", "-q", first], check_rc=0)
    rep = json.loads(p.stdout)
    src.adopt(rep["qemu"]["pid"])
    check(rep["cmdline"] == "recorded" and os.readlink(f"/proc/{src.pid}/cwd") == vmdir,
          f"QEMU runs the recorded command line in {vmdir}")
    d1, _, ok = src.digest()
    check(ok and d1 == d0, f"the guest answers on the recorded port; digest {d1} equals the "
          "snapshot's")
    check(run_state(src) == "running", "the recorded QMP socket answers")
    # That QEMU's save records the user's command line, not halite-qemu's additions.
    second = os.path.join(work, "second.hlt")
    q = src.qmp()
    q.cmd("device_add", driver="virtio-rng-pci", bus="rp1", id="rng0")
    q.close()
    save(src, second)
    src.kill()
    meta = inspect_info(second)["metadata"]
    check(meta["qemu.cmdline"] == argv, "a restored QEMU's save records the command line the "
          "restore ran for the user (hostfwd included; no -S, -incoming or halite's socket)")
    check("virtio-rng-pci id=rng0 addr=00.0" in meta["qemu.devices"],
          "the hot-plugged device is in the file's device list")

    # A command line that differs where it matters: refused before QEMU starts.
    other = list(argv)
    other[other.index("-smp") + 1] = "1"
    p, dt = run([hg.halite_qemu(), "restore", "-q", second, "--", *other])
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "-smp 2 at save, -smp 1 now" in err and
          not pids_naming(src.qmp_path), f"-smp 1 refused, no QEMU started: {err}")
    # The recorded line lacks the hot-plugged device: QEMU's devices are named as differing
    # before its RAM is touched, and it goes.
    p, _ = run([hg.halite_qemu(), "restore", "-q", second])
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "devices differ from those recorded" in err and
          "device virtio-rng-pci id=rng0 addr=00.0 at save, not now" in err,
          f"the hot-plugged device is named: {err}")
    time.sleep(0.2)
    check(not pids_naming(src.qmp_path), "that QEMU is gone")
    # Given with it (where the relative paths hold): restored.
    p = subprocess.run([hg.halite_qemu(), "restore", "--detach", "--json", "-q", second, "--",
                        *argv, "-device", "virtio-rng-pci,bus=rp1,id=rng0"], cwd=vmdir,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p.returncode == 0, f"the command line with the hot-plugged device restores "
          f"{p.stderr.strip()[-300:]}")
    src.adopt(json.loads(p.stdout)["qemu"]["pid"])
    d2, _, ok = src.digest()
    check(ok and d2 == d0, f"digest {d2} equals the snapshot's")
    src.wait_console(r"^verifier: pass \d+ ok", 60, after=len(src.console_text()))
    src.check_console()
    src.kill()


VRAM = "0000:00:01.0/vga.vram"  # q35's default VGA (std), 16 MiB


def vram_pattern(tag, n):
    """What /cgi-bin/vram?fill=TAG writes: "halite vram TAG\\n" repeated, cut at @n."""
    unit = f"halite vram {tag}\n".encode()
    return (unit * (n // len(unit) + 1))[:n]


def vram_fill(guest, tag, at, n):
    body = guest.http(f"/cgi-bin/vram?fill={tag}&at={at}&len={n}", timeout=120, per_try=120)
    if not body.strip().endswith("filled"):
        raise Fail(f"/cgi-bin/vram?fill={tag}: {body.strip()}")


def vram_sum(guest, at, n):
    """The guest's sha256 of [at, at + n) of its video memory, read now through its BAR."""
    body = guest.http(f"/cgi-bin/vram?sum&at={at}&len={n}", timeout=120, per_try=120)
    m = re.search(r"sha256 ([0-9a-f]{64})$", body.strip())
    if not m:
        raise Fail(f"/cgi-bin/vram?sum: {body.strip()}")
    return m.group(1)


def qemu_vram(guest):
    """(BAR address, bytes) of QEMU's video memory, read from outside: the VGA's BAR 0
    (query-pci), its host address (gpa2hva), /proc/PID/mem."""
    q = guest.qmp()
    vga = [d for d in q.cmd("query-pci")[0]["devices"] if d["class_info"]["class"] == 0x300]
    bar = [r for r in vga[0]["regions"] if r["bar"] == 0][0]
    text = q.cmd("human-monitor-command", **{"command-line": f"gpa2hva {bar['address']:#x}"})
    q.close()
    m = re.search(r"\(vga\.vram\) is (0x[0-9a-f]+)", text)
    if not m:
        raise Fail(f"gpa2hva of the VGA's BAR: {text!r}")
    with open(f"/proc/{guest.pid}/mem", "rb") as f:
        f.seek(int(m.group(1), 16))
        return bar["address"], f.read(bar["size"])


def first_diff(a, b):
    return next((i for i in range(0, min(len(a), len(b)), 4096) if a[i:i + 4096] != b[i:i + 4096]),
                None)


def case_video(work):
    """Video memory (the VGA's vga.vram, outside the memory backends) saved at the
    snapshot instant and restored before the guest runs, byte for byte; what the
    source writes after the snapshot is not in the restore; a file without video
    memory restores as before; a QEMU whose video memory differs is refused."""
    mib = 1 << 20
    src = hg.Guest(work, "source").boot().wait_ready()
    src.rewrites(False)
    d0, _, ok = src.digest()
    check(ok, f"source digest {d0}")
    # A pattern in 4 MiB of video memory and another in its last 64 KiB, from inside.
    vram_fill(src, "A", 1 * mib, 4 * mib)
    vram_fill(src, "Z", 16 * mib - 65536, 65536)
    bar, v = qemu_vram(src)
    check(len(v) == 16 * mib and v[mib:5 * mib] == vram_pattern("A", 4 * mib) and
          v[-65536:] == vram_pattern("Z", 65536),
          f"the guest wrote its video memory (BAR {bar:#x}), as QEMU holds it")
    path = os.path.join(work, "video.hlt")
    rep = save(src, path)
    check(rep["device_ram"] == [{"name": VRAM, "gpa": bar, "bytes": 16 * mib}] and
          rep["device_ram_bytes"] == 16 * mib and not rep["device_ram_skipped"] and
          rep["memory_bytes"] == 512 * mib and ram_bytes(rep) == 512 * mib,
          f"the save copied {VRAM} (16 MiB at {bar:#x}) beside 512 MiB of RAM: "
          f"{rep['device_ram_copied_bytes'] >> 10} KiB of pages QEMU has, in "
          f"{rep['device_ram_ms']:.2f} ms of the {rep['pause_ms']:.1f} ms pause")
    # After the snapshot instant: must not be in the restore.
    vram_fill(src, "B", 2 * mib, 256 << 10)
    check(vram_sum(src, 2 * mib, 256 << 10) ==
          hashlib.sha256(vram_pattern("B", 256 << 10)).hexdigest(),
          "the source overwrote 256 KiB of it after the save")
    src.kill()

    info = inspect_info(path)
    regions = {r["name"]: r for r in info["regions"]}
    check(regions.get(VRAM, {}).get("gpa") == bar and regions[VRAM]["length"] == 16 * mib and
          info["metadata"].get("qemu.device-ram") == [VRAM] and set(ram_regions(info)) == {"mem0"},
          f"halite-inspect info: region {VRAM} at {bar:#x}, 16 MiB, named in qemu.device-ram")
    run([INSPECT, "verify", path], check_rc=0)
    check(True, "halite-inspect verify: every checksum and block decodes")
    raw = os.path.join(work, "vram.raw")
    run([INSPECT, "extract", "--region", VRAM, "-o", raw, path], check_rc=0)
    with open(raw, "rb") as f:
        saved = f.read()
    check(saved[mib:5 * mib] == vram_pattern("A", 4 * mib) and
          saved[-65536:] == vram_pattern("Z", 65536) and saved[:mib] == v[:mib],
          "the file holds the video memory of the snapshot instant (A, Z, and the BIOS's text "
          "below them), not what came after (B)")

    # Restored paused: QEMU's video memory is the file's, every byte, before the guest runs.
    dst = hg.Guest(work, "restored")
    rrep = restore(path, dst, "--paused")
    check(rrep["paused"] and rrep["device_ram_bytes"] == 16 * mib and
          rrep["device_ram_written_bytes"] >= 4 * mib + 65536,
          f"restore: {rrep['device_ram_written_bytes'] >> 10} KiB of video memory written in "
          f"{rrep['device_ram_ms']:.2f} ms once the devices were loaded")
    bar2, v2 = qemu_vram(dst)
    at = first_diff(v2, saved)
    check(bar2 == bar and len(v2) == len(saved) and at is None,
          "every byte of the restored QEMU's video memory equals the file's" +
          (f" (first difference at {at:#x})" if at is not None else ""))
    check(v2[2 * mib:2 * mib + (256 << 10)] == vram_pattern("A", 4 * mib)[mib:mib + (256 << 10)],
          "what the source wrote after the snapshot (B) is not there: A is")
    q = dst.qmp()
    q.cmd("cont")
    q.close()
    check(vram_sum(dst, 1 * mib, 4 * mib) == hashlib.sha256(vram_pattern("A", 4 * mib)).hexdigest()
          and vram_sum(dst, 16 * mib - 65536, 65536) ==
          hashlib.sha256(vram_pattern("Z", 65536)).hexdigest(),
          "the guest reads its video memory as it was at the snapshot instant")
    d2, _, ok = dst.digest()
    check(ok and d2 == d0, f"memory digest after the restore equals the snapshot's ({d2})")
    dst.rewrites(True)
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    dst.check_console()
    check(True, "the verifier keeps passing")
    dst.kill()

    # Video memory that differs: -vga none is refused by the command line, then by
    # QEMU's devices; other video memory (same devices) by the video memory itself.
    nov = hg.Guest(work, "novga")
    nov.args += ["-vga", "none"]
    p, _ = run(restore_cmd(path, nov, "--detach"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "-vga none now" in msg, f"-vga none refused: {msg}")
    p, _ = run(restore_cmd(path, nov, "--detach", "--no-cmdline-check"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "device VGA addr=01.0 at save, not now" in msg,
          f"and by QEMU's devices: {msg}")
    small = hg.Guest(work, "small")
    # (with a -global for it, QEMU adds no VGA of its own: -vga std asks for it)
    small.args += ["-global", "VGA.vgamem_mb=8", "-vga", "std"]
    p, _ = run(restore_cmd(path, small, "--detach", "--no-cmdline-check"))
    msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and f"the file's device RAM '{VRAM}' (16.0 MiB" in msg and
          re.search(r"is 8\.0+ MiB in this QEMU", msg), f"8 MiB of video memory refused: {msg}")

    # A VM without video memory: a file without it, restored as ever.
    src = hg.Guest(work, "plain")
    src.args += ["-vga", "none"]
    src.boot().wait_ready()
    src.rewrites(False)
    d0, _, _ = src.digest()
    path = os.path.join(work, "novideo.hlt")
    rep = save(src, path)
    src.kill()
    info = inspect_info(path)
    check(rep["device_ram"] == [] and "qemu.device-ram" not in info["metadata"] and
          [r["name"] for r in info["regions"]] == ["mem0"],
          "-vga none: no device RAM saved, the file holds guest RAM only")
    dst = hg.Guest(work, "plain-restored")
    dst.args += ["-vga", "none"]
    restore(path, dst)
    d2, _, ok = dst.digest()
    check(ok and d2 == d0, f"and restores: digest {d2} equals the snapshot's")
    dst.kill()


def stderr_lines(p):
    return [l for l in p.stderr.splitlines() if l.strip()]


def case_enospc(work):
    """A save onto a file system that fills up: exit 1, the error said once, in
    one sentence naming the file once; the guest runs on with its memory as it
    was and the run state it had; no partial file left."""
    small = os.path.join(work, "small")
    os.mkdir(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", small], check=True)
    try:
        src = hg.Guest(work, "source").boot().wait_ready()
        src.rewrites(False)
        d0, _, _ = src.digest()
        path = os.path.join(small, "full.hlt")
        for extra in ((), ("--json",)):
            p, _ = run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "-q", *extra, path])
            lines = stderr_lines(p)
            msg = lines[0] if lines else ""
            check(p.returncode == 1 and len(lines) == 1 and
                  msg.startswith("halite-qemu: save: ") and
                  "No space left on device" in msg and msg.count(path) == 1 and
                  "save: save:" not in msg,
                  f"exit {p.returncode}, one sentence on stderr, the path once: {lines}")
            if extra:
                rep = json.loads(p.stdout)
                check(rep["ok"] is False and rep["exit"] == 1 and
                      rep["error"] == msg[len("halite-qemu: save: "):] and
                      rep["qemu"]["pid"] == src.pid and rep["run_state"] == "running" and
                      rep["file_bytes"] is None and rep["qemu_error"] is None,
                      "--json: one object, the same sentence, what was learnt, null for "
                      "the file")
            else:
                check(p.stdout == "", "nothing on stdout")
            check(os.listdir(small) == [], f"no partial file left ({os.listdir(small)})")
            check(run_state(src) == "running", "the guest is running")
            src.wait_console(r"^verifier: pass \d+ ok", 30, after=len(src.console_text()))
            d1, _, ok = src.digest()
            check(ok and d1 == d0, f"its memory is as it was (digest {d1})")
        src.kill()
    finally:
        subprocess.run(["umount", "-l", small])


def resident_bytes(path):
    """How much of @path is in the page cache (fincore, util-linux)."""
    p, _ = run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", path],
               check_rc=0)
    return int(p.stdout.split()[0])


def progress_lines(p, op):
    """--progress=json: every stderr line one progress object of @op, the last done."""
    lines = stderr_lines(p)
    objs = [json.loads(l) for l in lines]
    check(objs and all(o["type"] == "progress" and o["op"] == op for o in objs) and
          objs[-1]["done"] is True and all(not o["done"] for o in objs[:-1]),
          f"{op}: {len(objs)} progress lines on stderr, each JSON, the last done")
    last = objs[-1]
    check(last["bytes"] == last["total_bytes"] > 0 and last["percent"] == 100.0 and
          last["faults"] is not None,
          f"{op}: the last says {last['percent']}% of {last['total_bytes']} bytes, "
          f"{last['faults']} faults")
    pct = [o["percent"] for o in objs]
    check(pct == sorted(pct), f"{op}: the percentage never goes back")


def case_bypass(work):
    """--bypass-cache: the save writes its locality blocks with O_DIRECT and the
    restore reads them so (the file's pages stay out of the page cache, where a
    save without it leaves them in); the success reports: one JSON object, "ok"
    true, every key known; --progress=json lines on stderr."""
    src = hg.Guest(work, "source").boot().wait_ready()
    plain, direct = os.path.join(work, "plain.hlt"), os.path.join(work, "direct.hlt")
    rep = save(src, plain)
    size = os.path.getsize(plain)
    cached = resident_bytes(plain)
    check(rep["bypass_cache"] is False and cached > size * 0.9,
          f"without --bypass-cache {cached >> 20} of {size >> 20} MiB are in the page cache")
    p, _ = run([hg.halite_qemu(), "save", "--qmp", src.qmp_path, "--json", "--bypass-cache",
                "--progress=json", direct], check_rc=0)
    rep = json.loads(p.stdout)
    size = os.path.getsize(direct)
    cached = resident_bytes(direct)
    check(rep["bypass_cache"] is True and cached < size * 0.1,
          f"with --bypass-cache {cached >> 10} KiB of {size >> 20} MiB are in the page cache "
          "(the sections after the blocks)")
    unknown = [k for k, v in rep.items() if v is None and k not in (
        "error", "qemu_error", "libvirt_domain", "device_ram_skipped")]
    check(rep["ok"] is True and rep["error"] is None and "exit" not in rep and
          rep["qemu_error"] is None and not unknown and
          rep["qemu"]["pid"] == src.pid and rep["qemu"]["version"] and
          rep["qemu"]["machine"] and rep["qemu"]["vcpus"] == 2 and
          rep["run_state"] == "running" and rep["file_bytes"] == size,
          f"save: one object, ok, every value known ({unknown or 'none null'})")
    progress_lines(p, "save")
    src.kill()
    # The restore reads with O_DIRECT: the file stays out of the cache.
    with open(direct, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before = resident_bytes(direct)
    dst = hg.Guest(work, "restored")
    p, _ = run(restore_cmd(direct, dst, "--detach", "--bypass-cache", "--progress=json"),
               check_rc=0)
    rep = json.loads(p.stdout)
    dst.adopt(rep["qemu"]["pid"])
    after = resident_bytes(direct)
    check(rep["ok"] is True and rep["bypass_cache"] is True and
          after - before < size * 0.1,
          f"restore --bypass-cache: {after >> 10} KiB of {size >> 20} MiB in the page cache "
          f"after it ({before >> 10} KiB before)")
    # Null by meaning here: no error, no --track-access, no --learn, a local file (no store).
    unknown = [k for k, v in rep.items() if v is None and k not in (
        "error", "qemu_error", "vm_access_pct", "learn_trace", "learn_window_ms", "store")]
    check("exit" not in rep and not unknown and rep["qemu"]["pid"] == dst.pid,
          f"restore: one object, ok, every value known ({unknown or 'none null'})")
    progress_lines(p, "restore")
    dst.wait_console(r"^verifier: pass \d+ ok", 60, after=len(dst.console_text()))
    check(True, "the restored guest's verifier passes")
    dst.kill()
    # Without it the restore's reads go through the cache: the check above can tell.
    with open(direct, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    dst = hg.Guest(work, "cached")
    restore(direct, dst)
    cached = resident_bytes(direct)
    check(cached > size * 0.5, f"a restore without it leaves {cached >> 20} MiB of "
          f"{size >> 20} MiB in the page cache")
    dst.kill()


LEARN_PAGES = (3, 1000, 1001, 1777)  # pages the client asks for while the guest is learnt


def fetch_pages(guest, deadline):
    """GET each of LEARN_PAGES, the first on a connection held from before
    QEMU listens (the restore is starting), every body compared byte for
    byte with what pages.c wrote."""
    first = LEARN_PAGES[0]
    _, _, status, body = hg.held_get(guest.port, f"/p/{first}.txt", deadline)
    if status != 200 or body.encode() != hg.page_bytes(first):
        raise Fail(f"/p/{first}.txt: status {status}, {len(body)} bytes, not the page's")
    for i in LEARN_PAGES[1:]:
        hg.get_page(guest.port, i, deadline)


def restore_while(path, guest, client, *opts):
    """restore() with @client(guest) run meanwhile: from the restore's start,
    while it is running (--detach returns once all memory is in)."""
    proc = subprocess.Popen(restore_cmd(path, guest, "--detach", *opts), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        client(guest)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise Fail(f"halite-qemu restore: exit {proc.returncode}\nstderr: {err[-3000:]}")
    rep = json.loads(out)
    guest.adopt(rep["qemu"]["pid"])
    log_restore(rep)
    return rep


def trace_lbs(path):
    """{LB index: how} from a restore trace's lb lines."""
    out = {}
    for line in open(path):
        f = line.split()
        if f[0] == "lb":
            out[int(f[1])] = f[2]
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def case_learn(work):
    """restore --learn: a version 2 trace of the guest's first touches while a
    client fetches pages, memory intact; then the learning loop: the file
    relayouted from that trace restores to the same memory and pages, its hot
    prefix read first (lb_hot), or not with --hot-prefix 0."""
    src = hg.Guest(work, "source").boot().wait_ready()
    src.rewrites(False)
    d0, _, ok0 = src.digest()
    check(ok0, f"source guest digest {d0} before the save")
    path = os.path.join(work, "guest.hlt")
    save(src, path)
    q = src.qmp()
    q.cmd("quit")
    src.proc.wait(timeout=30)

    trace = os.path.join(work, "learn.trace")
    dst = hg.Guest(work, "learnt")
    t0 = time.monotonic()
    fetched = []

    def client(g):
        fetch_pages(g, time.monotonic() + 60)
        fetched.append(time.monotonic() - t0)
    rep = restore_while(path, dst, client, "--learn", trace, "--learn-window", "4000")
    check(rep["ok"] and rep["learn_trace"] == trace and rep["learn_window_ms"] == 4000,
          f"restore --learn: the report names the trace and the window; pages {LEARN_PAGES} "
          f"served byte for byte while learning")
    lines = open(trace).read().split("\n")
    check(lines[0] == "halite-restore-trace 2" and lines[-1] == "",
          "the trace is version 2, ending in a newline")
    learn = [i for i, l in enumerate(lines) if l.startswith("learn ")]
    check(len(learn) == 1 and lines[learn[0]] == "learn 4000 0",
          f"one learn line, the window ended before all memory was in ({lines[learn[0]:learn[0] + 1]})")
    touches = [l.split(" ") for l in lines[learn[0] + 1:-1]]
    mbs = [int(t[3]) for t in touches]
    vcpus = {t[2] for t in touches}
    check(touches and all(len(t) == 5 and t[0] == "touch" and t[4] in ("stored", "zero", "untouched")
                          for t in touches), f"{len(touches)} touch lines, well formed")
    check(len(set(mbs)) == len(mbs) and max(mbs) < rep["mb_total"], "each block at most once")
    check(vcpus <= {"-", "0", "1"} and ("0" in vcpus or "1" in vcpus),
          f"touches from the vCPUs (by cpu-index) and other threads: {sorted(vcpus)}")
    t = [int(x[1]) for x in touches]
    check(t == sorted(t) and t[-1] < 4000 * 1000000, "touch times rise, inside the window")
    # Nothing came in unasked during the window: as many vCPU or other first touches as faults.
    check(rep["faults"] >= len(touches), f"{rep['faults']} faults for {len(touches)} first touches")
    m = dst.wait_console(r"^verifier: pass (\d+) ok", 60)
    d2, _, ok2 = dst.digest()
    check(ok2 and d2 == d0, f"memory digest after the learning restore equals the snapshot's ({d2})")
    q = dst.qmp()
    q.cmd("quit")
    dst.kill()
    check(fetched[0] < 4.0, f"the client had its pages {fetched[0]:.2f} s after the restore "
          "started: inside the learning window, which starts later")

    # The learning loop: relayout from the trace, restore the new file.
    rl = os.path.join(work, "relayout.hlt")
    p, _ = run([INSPECT, "relayout", path, "--trace", trace, "-o", rl, "--json"], check_rc=0)
    rrep = json.loads(p.stdout)
    hot = rrep["hot_lbs"]
    check(hot > 0 and rrep["ok"], f"halite-inspect relayout: a hot prefix of {hot} LBs, "
          f"{rrep['hot_blocks']} blocks")
    info0, info1 = inspect_info(path), inspect_info(rl)
    meta = dict(kv.split("=", 1) for kv in info1["metadata"]["halite.relayout"].split(" "))
    check(meta == {"traces": "1", "hot-lbs": str(hot), "hot-blocks": str(rrep["hot_blocks"]),
                   "source-uuid": info0["uuid"]} and info1["uuid"] != info0["uuid"],
          f"the relayouted file's metadata: {info1['metadata']['halite.relayout']}")
    t1 = time.monotonic()
    for name in ram_regions(info0):
        imgs = []
        for f in (path, rl):
            img = f"{f}.{name}.img"
            run([INSPECT, "extract", "--region", name, "-o", img, f], check_rc=0)
            imgs.append(sha256_file(img))
            os.unlink(img)
        check(imgs[0] == imgs[1], f"halite-inspect extract of region {name}: the same image "
              f"from both files (sha256 {imgs[0][:16]}...)")
    log(f"  (extract and compare took {time.monotonic() - t1:.1f} s)")

    rtrace = os.path.join(work, "relayout.trace")
    dst = hg.Guest(work, "relayouted")
    rep = restore_while(rl, dst, lambda g: fetch_pages(g, time.monotonic() + 60),
                        "--trace", rtrace)
    check(rep["ok"], f"the relayouted file restores; pages {LEARN_PAGES} served byte for byte")
    lbs = trace_lbs(rtrace)
    pre = sum(1 for lb, how in lbs.items() if lb < hot and how == "prefetch")
    dem = sum(1 for lb, how in lbs.items() if lb < hot and how == "demand")
    ndem = sum(1 for how in lbs.values() if how == "demand")
    # The prefetcher reads LBs 0..hot-1 first (lb_hot); those a fault read
    # first are demand reads, and the stream readahead after any demand read
    # (8 LBs at most each, halite-qemu's default) reads some of them too: the
    # trace calls both prefetch, lb_hot counts only the prefetcher's.
    check(rep["lb_hot"] > 0 and len(lbs) == rep["lb_total"] and pre + dem == hot and
          pre - 8 * ndem <= rep["lb_hot"] <= pre and (ndem or rep["lb_hot"] == pre),
          f"lb_hot {rep['lb_hot']}: of the {hot} hot LBs, each read once, {pre} prefetched "
          f"(by the prefetcher, or by readahead after one of {ndem} demand reads), {dem} "
          f"read for faults first")
    p, _ = run([INSPECT, "restore", "--json", rl, rtrace], check_rc=0)
    hp = json.loads(p.stdout)["hot_prefix"]
    check(hp == {"lb_hot": rep["lb_hot"], "file_hot_lbs": hot, "traces": 1},
          f"halite-inspect restore of its trace says so too: {hp}")
    dst.wait_console(r"^verifier: pass (\d+) ok", 60)
    d3, _, ok3 = dst.digest()
    check(ok3 and d3 == d0, f"memory digest after the relayouted restore equals the "
          f"snapshot's ({d3})")
    q = dst.qmp()
    q.cmd("quit")
    dst.kill()

    dst = hg.Guest(work, "nohot")
    rep = restore(rl, dst, "--hot-prefix", "0")
    check(rep["ok"] and rep["lb_hot"] == 0, "with --hot-prefix 0, lb_hot 0")
    d4, _, ok4 = dst.digest()
    check(ok4 and d4 == d0, f"and its memory digest equals the snapshot's ({d4})")
    dst.kill()


CASES = {
    "cli": case_cli,
    "4g": case_4g,
    "backends": case_backends,
    "save-restore": case_save_restore,
    "exact": case_exact,
    "kill": case_kill,
    "errors": case_errors,
    "runstate": case_runstate,
    "discard": case_discard,
    "attach": case_attach,
    "private": case_private,
    "disks": case_disks,
    "network": case_network,
    "recorded": case_recorded,
    "libvirt": case_libvirt,
    "video": case_video,
    "enospc": case_enospc,
    "bypass": case_bypass,
    "learn": case_learn,
}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        print(f"usage: {sys.argv[0]} {'|'.join(CASES)}", file=sys.stderr)
        return 2
    need = os.environ.get("HALITE_REQUIRE_QEMU") == "1"
    why = None
    if not hg.qemu_available():
        why = "qemu-system-x86_64 not installed (scripts/install-deps.sh --guest)"
    elif not hg.image_ready():
        why = "test guest not built (scripts/make-guest.sh)"
    elif os.geteuid() != 0:
        why = "needs root (ptrace of QEMU, /proc/PID/map_files)"
    if why:
        print(("FAIL: " if need else "SKIP: ") + why)
        return 1 if need else 77
    work = hg.make_workdir()
    log(f"case {sys.argv[1]} in {work}")
    t = time.monotonic()
    try:
        CASES[sys.argv[1]](work)
    except (Fail, hg.GuestError, subprocess.TimeoutExpired) as e:
        log(f"FAIL: {e}")
        return 1
    finally:
        # Every QEMU this case started is ours to stop.
        subprocess.run(["pkill", "-9", "-f", work], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        if os.environ.get("HALITE_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)
    log(f"PASS {sys.argv[1]} in {time.monotonic() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
