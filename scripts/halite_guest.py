"""The QEMU test guest from Python: boot it, watch its console, talk HTTP and
QMP, fetch and check its numbered pages, run halite-qemu on it. Shared by
tests/qemu, bench/qemu.py and scripts/demo_qemu.py; the guest itself is
built by scripts/make-guest.sh (testing/guest-image/README.md).

Every wait has a deadline and every failure raises GuestError with what was
seen (the console's last lines), so a broken guest fails a test instead of
hanging it.
"""
import functools
import hashlib
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (halite-cloned's API): one request per connection."""

    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class GuestError(Exception):
    pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class QMP:
    """A minimal QMP client for the tests (halite-qemu has its own, in C)."""

    def __init__(self, path, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.s.settimeout(timeout)
                self.s.connect(path)
                break
            except OSError:
                self.s.close()
                if time.monotonic() > deadline:
                    raise GuestError(f"QMP socket {path} did not come up in {timeout} s")
                time.sleep(0.05)
        self.f = self.s.makefile("rwb")
        self.n = 0
        greeting = self._read()
        self.version = greeting["QMP"]["version"]["qemu"]
        self.cmd("qmp_capabilities")

    def _read(self):
        line = self.f.readline()
        if not line:
            raise EOFError("QMP connection closed")
        return json.loads(line)

    def cmd(self, name, **args):
        self.n += 1
        tag = f"hg-{self.n}"
        msg = {"execute": name, "id": tag}
        if args:
            msg["arguments"] = args
        self.f.write(json.dumps(msg).encode() + b"\n")
        self.f.flush()
        while True:
            r = self._read()
            # Events, and replies to a client that has gone: QEMU may still answer
            # its queued commands on the next client's connection (seen after a
            # QEMU held stopped while halite-qemu gave up on it).
            if r.get("id") != tag:
                continue
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise GuestError(f"QMP {name}: {r['error'].get('desc', r['error'])}")

    def send(self, name, **args):
        """Send a command and do not wait for its reply."""
        self.n += 1
        msg = {"execute": name, "id": f"hg-{self.n}"}
        if args:
            msg["arguments"] = args
        self.f.write(json.dumps(msg).encode() + b"\n")
        self.f.flush()

    def close(self):
        # QEMU serves one client per QMP socket: the next one waits until this is closed
        # (the file object holds the descriptor too).
        for o in (self.f, self.s):
            try:
                o.close()
            except OSError:
                pass


class Guest:
    """One QEMU running the test guest. The command line is the same for a
    boot and for a restore (halite-qemu restore adds what it needs)."""

    def __init__(self, workdir, name="guest", image=None, mem_mib=512, smp=2,
                 verifier_mib=64, append="", nic_model="virtio-net-pci", netdev=False,
                 udp=False):
        """@nic_model None: QEMU's default NIC (e1000e on q35). @netdev: the NIC as
        -netdev user,id=net0 and -device (else -nic user). @udp: also forward
        udp_port on the host to the guest's UDP port 7 (nothing listens there)."""
        self.image = image or os.path.join(ROOT, "build", "guest-image")
        self.workdir = workdir
        self.name = name
        self.mem_mib = mem_mib
        self.smp = smp
        self.port = free_port()
        self.udp_port = free_port() if udp else None
        self.console = os.path.join(workdir, f"{name}-console.log")
        self.qmp_path = os.path.join(workdir, f"{name}-qmp.sock")
        self.proc = None
        self.pid = None
        kernel = os.path.join(self.image, "vmlinux")
        if not os.path.exists(kernel):
            kernel = os.path.join(self.image, "vmlinuz")
        with open(os.path.join(self.image, "append")) as f:
            base = f.read().strip()
        base = re.sub(r"verifier\.mib=\d+", "", base).strip()
        self.append = f"{base} verifier.mib={verifier_mib} {append}".strip()
        fwd = f"hostfwd=tcp:127.0.0.1:{self.port}-:80"
        if udp:
            fwd += f",hostfwd=udp:127.0.0.1:{self.udp_port}-:7"
        if netdev:
            net = ["-netdev", f"user,id=net0,{fwd}", "-device",
                   f"{nic_model or 'e1000e'},netdev=net0"]
        else:
            net = ["-nic", f"user,model={nic_model},{fwd}" if nic_model else f"user,{fwd}"]
        self.args = [
            "-machine", "q35", "-accel", "tcg,thread=multi", "-smp", str(smp),
            "-m", f"{mem_mib}M",
            "-object", f"memory-backend-memfd,id=mem0,size={mem_mib}M,share=on",
            "-machine", "memory-backend=mem0",
            "-display", "none", "-no-reboot", "-monitor", "none",
            "-serial", f"file:{self.console}",
            "-kernel", kernel, "-initrd", os.path.join(self.image, "initrd.img"),
            "-append", self.append,
            *net,
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
        ]

    # --- RAM and disks ---
    def private_ram(self, backend=None):
        """Guest RAM as QEMU allocates it by default: -m alone (no memory backend),
        or @backend (e.g. memory-backend-ram): private anonymous memory of QEMU."""
        i = self.args.index("-object")
        if backend:
            self.args[i + 1] = f"{backend},id=mem0,size={self.mem_mib}M"
        else:
            del self.args[i:i + 2]
            i = self.args.index("memory-backend=mem0")
            del self.args[i - 1:i + 1]
        return self

    def with_disk(self, how, image):
        """@image as the guest's virtio disk, /dev/vda, which the guest's disklog
        writes: with -drive (any format, probed) or -blockdev (a raw image)."""
        if how == "drive":
            self.args += ["-drive", f"file={image},if=virtio,id=disk0"]
        else:
            self.args += ["-blockdev", f"driver=file,filename={image},node-name=f0",
                          "-blockdev", "driver=raw,file=f0,node-name=d0",
                          "-device", "virtio-blk-pci,drive=d0,id=vd0"]
        return self

    def disklog(self):
        """(disk, memory before, memory after, ok) from the guest's disklog: the
        count on its disk and in its memory, which agree (testing/guest-image/disklog.c)."""
        body = self.http("/cgi-bin/disklog").strip()
        m = re.match(r"disklog disk (\d+) mem (\d+) (\d+) (ok|MISMATCH)$", body)
        if not m:
            raise GuestError(f"/cgi-bin/disklog: unexpected answer {body!r}")
        return int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4) == "ok"

    # --- process ---
    def boot(self, cwd=None):
        """Start QEMU (in @cwd: relative paths in self.args are relative to it)."""
        self.proc = subprocess.Popen(["qemu-system-x86_64"] + self.args, cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.workdir, f"{self.name}-qemu.err"), "w"))
        self.pid = self.proc.pid
        return self

    def adopt(self, pid):
        """A QEMU started by someone else (halite-qemu restore)."""
        self.pid = pid
        self.proc = None  # kill() then waits for this pid, not for an earlier boot

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # a zombie is dead
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def kill(self):
        if self.pid and self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait()
        else:
            # Not ours to reap: gone once its last thread has exited (a zombie leader
            # may still have threads holding its sockets and ports).
            deadline = time.monotonic() + 5
            while self.alive() or self._threads() > 1:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)

    def _threads(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                return int([l for l in f if l.startswith("Threads:")][0].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    def qmp(self, timeout=10):
        return QMP(self.qmp_path, timeout)

    # --- console ---
    def console_text(self):
        try:
            with open(self.console, "rb") as f:
                return f.read().decode(errors="replace").replace("\r", "")
        except FileNotFoundError:
            return ""

    def console_tail(self, n=20):
        return "\n".join("  | " + l for l in self.console_text().splitlines()[-n:])

    def fail(self, msg):
        raise GuestError(f"{msg}\n  last lines of {self.name}'s console:\n{self.console_tail()}")

    def check_console(self):
        text = self.console_text()
        for bad in ("verifier: MISMATCH", "FAILED (", "Kernel panic", "init: verifier exited"):
            if bad in text:
                self.fail(f"the guest's console says '{bad}'")
        return text

    def verifier_lines(self):
        return [l for l in self.console_text().splitlines() if l.startswith("verifier: pass ")]

    def wait_console(self, pattern, timeout, after=0):
        """Wait until @pattern (regex) appears in the console past offset @after."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        while True:
            text = self.check_console()
            m = rx.search(text, after)
            if m:
                return m
            if not self.alive():
                self.fail(f"QEMU exited while waiting for /{pattern}/")
            if time.monotonic() > deadline:
                self.fail(f"no /{pattern}/ on the console within {timeout} s")
            time.sleep(0.02)

    def wait_ready(self, timeout=90):
        """Verifier passing (two ok lines) and HTTP answering."""
        self.wait_console(r"^verifier: pass \d+ ok.*\n(?:.*\n)*?verifier: pass \d+ ok", timeout)
        self.http("/hello.txt", timeout=timeout)
        return self

    # --- HTTP ---
    def http(self, path, timeout=30, per_try=5):
        deadline = time.monotonic() + timeout
        err = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                            timeout=min(per_try, max(0.1, deadline - time.monotonic()))) as r:
                    return r.read().decode(errors="replace")
            except Exception as e:  # refused while slirp settles, or a timeout
                err = e
                time.sleep(0.05)
        self.fail(f"HTTP GET {path}: no answer within {timeout} s ({err})")

    def status(self):
        body = self.http("/status")
        kv = {}
        for line in body.splitlines()[1:]:
            k, _, v = line.partition(" ")
            kv[k] = v
        return kv

    def digest(self):
        """Ask the verifier to re-read its whole region now: (digest, uptime, expected)."""
        body = self.http("/cgi-bin/digest").strip()
        m = re.match(r"seq \d+ pass \d+ digest ([0-9a-f]+) uptime ([0-9.]+) (expected|differs)$", body)
        if not m:
            self.fail(f"/cgi-bin/digest: unexpected answer {body!r}")
        return m.group(1), float(m.group(2)), m.group(3) == "expected"

    def rewrites(self, on):
        body = self.http("/cgi-bin/rewrites?" + ("on" if on else "off"))
        return body


def held_get(port, path, deadline, alive=None, host="127.0.0.1"):
    """One HTTP GET on one connection held from the start: connect retried
    while refused (every 2 ms: nothing listens yet) until it is accepted,
    then the request sent once and the answer awaited until @deadline
    (time.monotonic()), however long the guest takes; no second request.
    What a client sees that connects to a restoring guest and waits, unlike
    polling with short tries. @alive() returns why to stop (the restore
    failed) or None. Returns (t_connected, t_answered, status, body), times
    from time.monotonic(); raises GuestError on a refusal that outlasts
    @deadline, no answer by then, or a closed connection."""
    while True:
        s = socket.socket()
        try:
            s.connect((host, port))
            break
        except (ConnectionRefusedError, ConnectionResetError):
            s.close()
            why = alive() if alive else None
            if why:
                raise GuestError(f"{why} before port {port} accepted a connection")
            if time.monotonic() > deadline:
                raise GuestError(f"port {port} refused connections until the deadline")
            time.sleep(0.002)
    t_conn = time.monotonic()
    data = b""
    try:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestError(f"GET {path}: no answer on the held connection by the "
                                 f"deadline ({len(data)} bytes)")
            s.settimeout(left)
            try:
                d = s.recv(65536)
            except socket.timeout:
                continue
            if not d:
                break
            data += d
    except OSError as e:
        raise GuestError(f"GET {path}: the held connection failed: {e}")
    finally:
        s.close()
    t_ans = time.monotonic()
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise GuestError(f"GET {path}: not an HTTP answer: {data[:100]!r}")
    return t_conn, t_ans, int(parts[1]), body.decode(errors="replace")


# --- the guest's numbered pages (testing/guest-image/pages.c writes them at boot) ---

PAGES = 2000  # what /init asks pages.c for: /www/p/0.txt .. /www/p/1999.txt
_ALPHABET = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n"
_BYTE_TO_CHAR = bytes(_ALPHABET[b & 63] for b in range(256))
_M64 = (1 << 64) - 1


def _mix(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=PAGES)
def page_bytes(i):
    """The exact content of the guest's page @i (/p/I.txt), as pages.c writes it."""
    size = 4096 + _mix(i) % 12289
    words = (size + 7) // 8
    raw = struct.pack(f"<{words}Q", *(_mix(i << 32 | w) for w in range(words)))
    head = b"halite page %d\n" % i
    return head + raw[len(head):size].translate(_BYTE_TO_CHAR)


def gaussian_pages(n, seed, mean=PAGES // 2, sigma=300, count=PAGES):
    """@n page indices drawn from a Gaussian (@mean, @sigma), rounded and
    clipped to [0, @count): a client whose interest centres on some pages."""
    rng = random.Random(seed)
    return [min(count - 1, max(0, round(rng.gauss(mean, sigma)))) for _ in range(n)]


def get_page(port, i, deadline, host="127.0.0.1"):
    """GET /p/I.txt on a new connection (busybox httpd closes each after one
    answer: no keep-alive), the answer read to the close and its body checked
    byte for byte. Returns seconds from just before the connect to the close;
    raises GuestError on a refusal, a timeout, a status other than 200 or a
    wrong body."""
    t = time.monotonic()
    data = b""
    try:
        with socket.create_connection((host, port), timeout=max(0.1, deadline - t)) as s:
            s.sendall(b"GET /p/%d.txt HTTP/1.0\r\nHost: %s\r\n\r\n" % (i, host.encode()))
            while True:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                d = s.recv(65536)
                if not d:
                    break
                data += d
    except OSError as e:
        raise GuestError(f"GET /p/{i}.txt: {e} ({len(data)} bytes read)")
    took = time.monotonic() - t
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        raise GuestError(f"GET /p/{i}.txt: not a 200 answer: {head[:80]!r}")
    want = page_bytes(i)
    if body != want:
        at = next((k for k, (a, b) in enumerate(zip(body, want)) if a != b),
                  min(len(body), len(want)))
        raise GuestError(f"GET /p/{i}.txt: {len(body)} bytes, want {len(want)}; first "
                         f"difference at byte {at}")
    return took


def page_requests(port, indices, deadline):
    """GET each page of @indices one after another (get_page: a new connection
    each, every body checked). Returns {"latencies_s": [...], "bytes": N}."""
    lat = []
    total = 0
    for i in indices:
        lat.append(get_page(port, i, deadline))
        total += len(page_bytes(i))
    return {"latencies_s": lat, "bytes": total}


def latency_summary(lat):
    """mean, p50, p99 and max of @lat (seconds), rounded to microseconds."""
    s = sorted(lat)

    def pct(p):  # nearest rank
        return s[max(0, math.ceil(p / 100 * len(s)) - 1)]
    return {"n": len(s), "mean_s": round(statistics.fmean(s), 6), "p50_s": round(pct(50), 6),
            "p99_s": round(pct(99), 6), "max_s": round(s[-1], 6)}


def halite_qemu():
    """The halite-qemu binary of the build tree (HALITE_QEMU_BIN overrides)."""
    path = os.environ.get("HALITE_QEMU_BIN") or os.path.join(ROOT, "build", "tools",
                                                             "halite-qemu", "halite-qemu")
    if not os.path.exists(path):
        raise GuestError(f"{path} not built (scripts/build.sh)")
    return path


def qemu_available():
    return shutil.which("qemu-system-x86_64") is not None


def image_ready(image=None):
    image = image or os.path.join(ROOT, "build", "guest-image")
    return all(os.path.exists(os.path.join(image, f)) for f in ("initrd.img", "append"))


def bench_prerequisites(image, binaries, root_why="halite-qemu ptraces QEMU"):
    """Why the QEMU benches cannot run here (one sentence saying what to do), or
    None: QEMU, the test guest in @image, root, and each of @binaries built."""
    if not qemu_available():
        return "qemu-system-x86_64 not installed (scripts/install-deps.sh --guest)"
    if not image_ready(image):
        return f"test guest not built in {image} (scripts/make-guest.sh)"
    if os.geteuid() != 0:
        return f"needs root ({root_why})"
    for b in binaries:
        if not os.access(b, os.X_OK):
            return f"{b} not built (scripts/build.sh)"
    return None


def sha256_file(path):
    """A file's SHA-256, hex (a disk image as the store's manifest records it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def make_workdir(prefix="halite-qemu-test."):
    return tempfile.mkdtemp(prefix=prefix)


# --- a socket nobody answers: did a program try to talk to it? ---

def unix_listener(path):
    """A unix socket nobody accepts on: accepted() says whether anyone connected."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    return srv


def accepted(srv):
    """Whether a connection to unix_listener()'s socket is waiting (taken and closed)."""
    srv.settimeout(0)
    try:
        c, _ = srv.accept()
        c.close()
        return True
    except BlockingIOError:
        return False


def qmp_greet(conn, version):
    """A fake QMP server's greeting on @conn, as QEMU @version (major, minor, micro) sends it."""
    major, minor, micro = version
    conn.sendall(json.dumps({"QMP": {"version": {"qemu": {
        "major": major, "minor": minor, "micro": micro}, "package": ""},
        "capabilities": []}}).encode() + b"\r\n")
