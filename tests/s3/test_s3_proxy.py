#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/s3_proxy.py against a real S3 store (run_with_store.sh exports it),
with real GETs signed by curl --aws-sigv4 on one keep-alive connection:
- every request through a 20 ms proxy takes at least 20 ms, the first (a new
  connection) at least 40 ms, and the proxy counts exactly the requests and
  the one connection made; the bytes are the object's;
- an outage in reset mode breaks a connection in use and refuses new ones,
  and a GET after it ends gets the object again;
- an outage in stall mode holds a connection in use for the outage and then
  lets it finish, every answer whole;
- quit makes the proxy exit 0.
Only lower bounds on times, and one loose upper bound: CI runs under load.

  test_s3_proxy.py SOURCE_DIR
Exit 0 pass, 1 fail, 77 skip.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SRC = sys.argv[1]
PROXY = os.path.join(SRC, "bench", "s3_proxy.py")
sys.path.insert(0, os.path.dirname(PROXY))
import s3_proxy  # noqa: E402  (its control() client; the proxy itself runs as PROXY)
ENV = os.environ
REGION = ENV.get("AWS_REGION", "us-east-1")
RTT = 0.020


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def curl(endpoint, keys, out_dir, extra=(), timeout=120):
    """GET each key on one connection: (exit code, per-request seconds, bodies)."""
    cmd = ["curl", "-s", "--max-time", "60",
           "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
           "--aws-sigv4", f"aws:amz:{REGION}:s3",
           "--user", f"{ENV['AWS_ACCESS_KEY_ID']}:{ENV['AWS_SECRET_ACCESS_KEY']}",
           "-w", "%{http_code} %{time_total}\n", *extra]
    outs = []
    for i, k in enumerate(keys):
        outs.append(os.path.join(out_dir, f"get.{i}"))
        cmd += ["-o", outs[-1], f"{endpoint}/{ENV['HALITE_TEST_BUCKET']}/{k}"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    times = []
    for line in p.stdout.split("\n"):
        if line.strip():
            code, t = line.split()
            times.append((int(code), float(t)))
    bodies = []
    for o in outs:
        try:
            with open(o, "rb") as f:
                bodies.append(f.read())
            os.unlink(o)
        except FileNotFoundError:
            bodies.append(None)
    return p.returncode, times, bodies


def put(key, path):
    subprocess.run(["curl", "-sf", "--max-time", "60", "-T", path,
                    "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                    "--aws-sigv4", f"aws:amz:{REGION}:s3",
                    "--user", f"{ENV['AWS_ACCESS_KEY_ID']}:{ENV['AWS_SECRET_ACCESS_KEY']}",
                    f"{ENV['AWS_ENDPOINT_URL']}/{ENV['HALITE_TEST_BUCKET']}/{key}"],
                   check=True, timeout=90)


class Proxy:
    def __init__(self, rtt_ms):
        self.p = subprocess.Popen([sys.executable, PROXY, "--die-with-parent",
                                   "--upstream", ENV["AWS_ENDPOINT_URL"],
                                   "--rtt-ms", str(rtt_ms)],
                                  stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        check(line, "the proxy printed no port")
        info = json.loads(line)
        self.endpoint, self.ctl = info["endpoint"], info["control"]
        check(os.stat(self.ctl).st_mode & 0o777 == 0o600, "the control socket is not 0600")

    def cmd(self, line):
        ans = s3_proxy.control(self.ctl, line)
        check("error" not in ans, f"proxy {line}: {ans}")
        return ans

    def wait_outage_over(self):
        deadline = time.monotonic() + 30
        while self.cmd("stats")["outage_s"] > 0:
            check(time.monotonic() < deadline, "the outage did not end")
            time.sleep(0.1)
        time.sleep(0.1)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def on_term(sig, frame):
    raise Fail(f"signal {sig}")  # the finally below stops the proxy


def main():
    signal.signal(signal.SIGTERM, on_term)
    if not shutil.which("curl"):
        print("SKIP: needs curl")
        return 77
    work = tempfile.mkdtemp(prefix="halite-s3-proxy.")
    proxy = None
    try:
        obj = os.urandom(256 << 10)
        path = os.path.join(work, "obj")
        with open(path, "wb") as f:
            f.write(obj)
        key = f"proxy-{os.getpid()}"
        put(key, path)
        n = 8

        # ---- latency: at least the RTT per request, counted exactly ----
        proxy = Proxy(0)
        rc, base, bodies = curl(proxy.endpoint, [key] * n, work)
        check(rc == 0 and len(base) == n, f"GETs through the proxy at 0 ms: exit {rc}")
        check(all(b == obj for b in bodies), "a body through the proxy differs from the object")
        proxy.cmd(f"rtt {RTT * 1000:g}")
        proxy.cmd("zero")
        rc, slow, bodies = curl(proxy.endpoint, [key] * n, work)
        check(rc == 0 and len(slow) == n and all(c == 200 for c, _ in slow),
              f"GETs at {RTT * 1000:g} ms: exit {rc}, {slow}")
        check(all(b == obj for b in bodies), "a body through the slow proxy differs")
        st = proxy.cmd("stats")
        print(f"0 ms: {[round(t * 1000, 1) for _, t in base]} ms; "
              f"{RTT * 1000:g} ms: {[round(t * 1000, 1) for _, t in slow]} ms; {st}")
        check(st["requests"] == n and st["connections"] == 1,
              f"{n} GETs on one connection counted as {st['requests']} on {st['connections']}")
        check(st["bytes_down"] >= n * len(obj), f"{st['bytes_down']} bytes down < {n} objects")
        check(slow[0][1] >= 2 * RTT, f"the first GET took {slow[0][1]:.4f} s < connect + request")
        for i, (_, t) in enumerate(slow[1:], 1):
            check(t >= RTT, f"GET {i} took {t:.4f} s < the RTT")
        med = sorted(t for _, t in slow[1:])[(n - 1) // 2]
        med0 = sorted(t for _, t in base[1:])[(n - 1) // 2]
        check(med < med0 + RTT + 2.0, f"median GET {med:.3f} s, far above {med0:.3f} s + RTT")

        # ---- outage, reset: the connection in use breaks, new ones are refused ----
        proxy.cmd("rtt 50")
        proxy.cmd("zero")
        t = later(0.3, lambda: proxy.cmd("outage 2 reset"))
        rc, times, bodies = curl(proxy.endpoint, [key] * 30, work)
        t.join()
        st = proxy.cmd("stats")
        print(f"reset outage: curl exit {rc}, {len(times)} answers, {st}")
        check(rc != 0, "GETs went on through a reset outage")
        check(st["reset"] >= 1 and st["refused"] >= 1,
              f"the outage reset {st['reset']} connections and refused {st['refused']}")
        proxy.wait_outage_over()
        rc, times, bodies = curl(proxy.endpoint, [key], work)
        check(rc == 0 and bodies[0] == obj, f"a GET after the outage: exit {rc}")

        # ---- outage, stall: the connection in use waits, then finishes ----
        proxy.cmd("zero")
        t = later(0.3, lambda: proxy.cmd("outage 2 stall"))
        rc, times, bodies = curl(proxy.endpoint, [key] * 30, work)
        t.join()
        st = proxy.cmd("stats")
        longest = max(x for _, x in times) if times else 0
        print(f"stall outage: curl exit {rc}, longest GET {longest:.3f} s, {st}")
        check(rc == 0 and len(times) == 30 and all(b == obj for b in bodies),
              f"GETs through a stall outage: exit {rc}, {len(times)} answers")
        check(st["connections"] == 1 and st["requests"] == 30,
              f"a stall made {st['connections']} connections for {st['requests']} requests")
        check(longest >= 1.5, f"the longest GET took {longest:.3f} s, the stall lasted 2 s")

        # ---- a clean exit ----
        proxy.cmd("quit")
        check(proxy.p.wait(timeout=10) == 0, "the proxy did not exit 0 on quit")
        proxy = Proxy(0)
        proxy.p.terminate()
        check(proxy.p.wait(timeout=10) == 0, "the proxy did not exit 0 on SIGTERM")
        proxy = None
        print("PASS")
        return 0
    except (Fail, subprocess.SubprocessError, OSError, ValueError) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        if proxy:
            proxy.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
