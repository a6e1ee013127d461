#!/usr/bin/env python3
"""Two clone-service hosts, one bucket (issue 26, "Many hosts").

  test_clone_hosts.py SOURCE_DIR

Run under tests/s3/run_with_store.sh (a real radosgw on 127.0.0.1); needs root,
`ip` and `nsenter`, and a kernel with network namespaces and veth (else 77).

Each "host" is a network namespace of its own (halite-hosts-PID-a, -b) joined
to the root namespace by a veth pair on a /30 of its own, and runs its own
halite-cloned (own --state-dir, --mem-dir and LB cache STATE/lbcache) inside
it, both listening on 127.0.0.1:8426 with tokens of their own (each answers
its own token, 401 to the other's) besides their unix sockets. The store listens on loopback only, so each host reaches it through a
bench/s3_proxy.py of its own that listens on the root side's veth address:
the proxy counts that host's requests, and a host has no other way to the
store (its 127.0.0.1 is its own, and it has no route to the other host's
link; both checked).
- A synthetic snapshot is pushed once; each host registers the same s3:// URL
  (the same uuid on both) and starts 2 clones; every clone's memory is the
  snapshot's, byte for byte.
- Per host: every LB came from the store once (cache misses == puts == LBs,
  no hit, no more bytes than the object has), at most one request per LB
  besides the open's, the metrics agree
  with the template's JSON, and the host's proxy saw exactly the requests its
  daemon counted (the metadata check and the engine share one open).
- Host a restarted as after a reboot (the same state and LB cache, its memory
  directory emptied): the recorded template comes back, takes every LB from
  the host's cache (hits == LBs, no miss) and its clone is exact; host a's
  proxy sees only the open's few requests (no LB request), host b's none.
The namespaces and veth links are removed on every exit; ones left by a run
killed outright (SIGKILL) are removed by the next run.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else None
sys.path.insert(0, os.path.join(SRC or ".", "tests", "clone"))
import test_clone as tc  # noqa: E402
from test_clone import INSPECT, Fail, check, log, stop_daemon  # noqa: E402
import test_clone_s3 as ts  # noqa: E402

BUCKET = os.environ.get("HALITE_TEST_BUCKET")
NS_RE = re.compile(r"^halite-hosts-(\d+)-([ab])$")
API_PORT = 8426  # each host's own 127.0.0.1


def run(*args, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, **kw)


def ip(*args):
    r = run("ip", *args)
    check(r.returncode == 0, "ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def veth_name(pid, h):
    return "hh%d%s" % (pid, h)  # at most 10 digits: within IFNAMSIZ


def sweep():
    """Namespaces and links of runs whose process is gone (killed outright)."""
    for line in run("ip", "netns", "list").stdout.splitlines():
        m = NS_RE.match(line.split()[0]) if line.split() else None
        if m and not alive(int(m.group(1))):
            # its daemons and their clones outlived it, in the namespace
            for pid in run("ip", "netns", "pids", line.split()[0]).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            run("ip", "netns", "del", line.split()[0])
            run("ip", "link", "del", veth_name(int(m.group(1)), m.group(2)))


class Net:
    """Two namespaces, each a veth pair to the root namespace on its own /30."""

    def __init__(self):
        self.pid = os.getpid()
        self.made = []  # (namespace, root-side link), to remove

    def free_octet(self):
        used = ip("-o", "-4", "addr", "show") + ip("-4", "route", "show", "table", "all")
        for i in range(250):
            x = (self.pid + i) % 250 + 1
            if "10.231.%d." % x not in used:
                return x
        raise Fail("no free 10.231.X.0/24 for the test's links")

    def make(self):
        x = self.free_octet()
        self.hosts = {}
        for i, h in enumerate("ab"):
            ns, link = "halite-hosts-%d-%s" % (self.pid, h), veth_name(self.pid, h)
            self.made.append((ns, link))
            ip("netns", "add", ns)
            ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            root, inside = "10.231.%d.%d" % (x, 4 * i + 1), "10.231.%d.%d" % (x, 4 * i + 2)
            ip("addr", "add", root + "/30", "dev", link)
            ip("link", "set", link, "up")
            ip("-n", ns, "addr", "add", inside + "/30", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            self.hosts[h] = {"ns": ns, "root": root, "inside": inside}
        return self.hosts

    def remove(self):
        for ns, link in self.made:
            run("ip", "netns", "del", ns)  # takes its end of the pair, and so the pair
            run("ip", "link", "del", link)
        self.made = []


def connect_in(ns, host, port):
    """What a TCP connect from inside @ns to host:port gives: 'ok' or the errno's name."""
    code = ("import errno, socket, sys\n"
            "s = socket.socket(); s.settimeout(3)\n"
            "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('ok')\n"
            "except OSError as x:\n print(errno.errorcode.get(x.errno, str(x)))\n")
    r = run("nsenter", "--net=/run/netns/" + ns, sys.executable, "-c", code, host, str(port))
    check(r.returncode == 0, "connect in %s: %s" % (ns, r.stderr))
    return r.stdout.strip()


def healthz_in(ns, port, token):
    """GET /healthz from inside @ns to 127.0.0.1:port with @token: the status."""
    code = ("import http.client, sys\n"
            "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=5)\n"
            "c.request('GET', '/healthz', headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
            "print(c.getresponse().status)\n")
    r = run("nsenter", "--net=/run/netns/" + ns, sys.executable, "-c", code, str(port), token)
    check(r.returncode == 0, "GET /healthz in %s: %s" % (ns, r.stderr))
    return int(r.stdout)


def start_proxy(addr, ctl):
    p = subprocess.Popen([sys.executable, os.path.join(SRC, "bench", "s3_proxy.py"),
                          "--upstream", os.environ["AWS_ENDPOINT_URL"], "--listen", addr,
                          "--control", ctl, "--die-with-parent"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    check(line, "bench/s3_proxy.py --listen %s did not start" % addr)
    return p, json.loads(line)


def proxy(ctl, cmd="stats"):
    sys.path.insert(0, os.path.join(SRC, "bench"))
    import s3_proxy
    return s3_proxy.control(ctl, cmd)


def first_fill(h, url, want, size):
    """Host @h registers @url and starts 2 clones, each exact: the template's JSON."""
    e = h["env"]
    t = e.template(url, hotset=False)
    check(t["snapshot"] == url and t["kind"] == "synthetic", "host %s: template %s" % (h["name"], t))
    ids = e.clones(t["id"], 2, pattern="random")
    for cid in ids:
        e.wait_state(cid, ("done",))
        e.check_exact(cid, want)
    show = ts.wait_complete(e, t["id"])
    s, lbs = show["store"], show["stats"]["lb_total"]
    log("  host %s: %d LBs, store %s" % (h["name"], lbs, s))
    check(lbs > 0 and s["cache_hits"] == 0 and s["cache_misses"] == lbs and s["cache_puts"] == lbs,
          "host %s: every LB of %d from the store once and kept: %s" % (h["name"], lbs, s))
    check(s["requests"] <= 4 + lbs, "host %s: %d requests for %d LBs" % (h["name"], s["requests"], lbs))
    check(s["bytes"] <= size, "host %s: %d bytes from the store, the object has %d" %
          (h["name"], s["bytes"], size))
    m = ts.store_metrics(e, t["id"])
    for k, v in m.items():
        check(v == s[k], "host %s: metrics %s %s != GET's %s" % (h["name"], k, v, s[k]))
    return show, ids


def hosts_case(net, hosts, envs):
    for name, h in hosts.items():
        h["name"] = name
        h["ctl"] = os.path.join(envs[name].tmp, "proxy.sock")
        h["proc"], h["proxy"] = start_proxy(h["root"], h["ctl"])
        e = h["env"] = envs[name]
        e.wrap = ["nsenter", "--net=/run/netns/" + h["ns"]]
        e.env = dict(os.environ, AWS_ENDPOINT_URL=h["proxy"]["endpoint"])
    store_port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1].strip("/"))
    for name, h in hosts.items():
        other = hosts["b" if name == "a" else "a"]
        got = connect_in(h["ns"], "127.0.0.1", store_port)
        check(got == "ECONNREFUSED", "host %s reaches the store on loopback: %s" % (name, got))
        got = connect_in(h["ns"], other["root"], other["proxy"]["port"])
        check(got == "ENETUNREACH", "host %s reaches host %s's link: %s" % (name, other["name"], got))
        got = connect_in(h["ns"], h["root"], h["proxy"]["port"])
        check(got == "ok", "host %s does not reach its proxy: %s" % (name, got))

    a, b = hosts["a"]["env"], hosts["b"]["env"]
    snap = a.snapshot()
    want = a.extract(snap)
    prefix = "hosts-%d" % os.getpid()
    url = "s3://%s/%s/t.hlt" % (BUCKET, prefix)
    subprocess.run([INSPECT, "push", snap, url], check=True, stdout=subprocess.DEVNULL, timeout=120)
    # Both listen on the same TCP address, each in its own namespace (and on its
    # unix socket, a path, which the test uses).
    for h in hosts.values():
        h["token"] = os.urandom(32).hex()
        tok = os.path.join(h["env"].tmp, "token")
        with open(os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(h["token"])
        h["env"].start("--s3-allow", "%s/%s/" % (BUCKET, prefix), "--listen",
                       "127.0.0.1:%d" % API_PORT, "--token-file", tok)
        check(proxy(h["ctl"], "zero")["ok"], "proxy zero")
    for name, h in hosts.items():
        other = hosts["b" if name == "a" else "a"]
        got = healthz_in(h["ns"], API_PORT, h["token"]), healthz_in(h["ns"], API_PORT, other["token"])
        check(got == (200, 401), "host %s's 127.0.0.1:%d with its token and the other's: %s" %
              (name, API_PORT, got))

    shows = {}
    for name, h in hosts.items():
        shows[name], h["clones"] = first_fill(h, url, want, os.path.getsize(snap))
    check(shows["a"]["uuid"] == shows["b"]["uuid"], "two uuids for one object: %s, %s" %
          (shows["a"]["uuid"], shows["b"]["uuid"]))
    lbs = shows["a"]["stats"]["lb_total"]
    check(shows["b"]["stats"]["lb_total"] == lbs, "LBs: %s" % [s["stats"]["lb_total"] for s in shows.values()])
    for name, h in hosts.items():
        p, s = proxy(h["ctl"]), shows[name]["store"]
        log("  host %s's proxy: %s" % (name, p))
        # The template's counters are the object's: the metadata check at POST and the
        # engine share one open (same_as), so the proxy saw exactly those.
        check(p["requests"] == s["requests"],
              "host %s: the proxy saw %d requests, the daemon counted %d" %
              (name, p["requests"], s["requests"]))
        check(p["bytes_down"] >= s["bytes"], "host %s: proxy %d bytes down, store %d" %
              (name, p["bytes_down"], s["bytes"]))
        cache = os.path.join(h["env"].state, "lbcache")
        check(os.path.isdir(cache) and any(f for _, _, f in os.walk(cache)),
              "host %s: no LB in its cache %s" % (name, cache))

    # Host a restarted as after a reboot: state and cache kept, template memory gone.
    for cid in hosts["a"]["clones"]:
        a.ok("DELETE", "/clones/" + cid)
    stop_daemon(a)
    for f in os.listdir(a.mem):
        os.unlink(os.path.join(a.mem, f))
    for h in hosts.values():
        proxy(h["ctl"], "zero")
    a.start()
    listed = a.ok("GET", "/templates")["templates"]
    check(len(listed) == 1 and listed[0]["id"] == shows["a"]["id"] and listed[0]["state"] == "ready",
          "host a after the restart: templates %s" % listed)
    tid = shows["a"]["id"]
    cid = a.clones(tid, 1, pattern="random")[0]
    a.wait_state(cid, ("done",))
    a.check_exact(cid, want)
    show = ts.wait_complete(a, tid)
    s, pa, pb = show["store"], proxy(hosts["a"]["ctl"]), proxy(hosts["b"]["ctl"])
    log("  host a again: store %s, proxy a %s, proxy b %s" % (s, pa["requests"], pb["requests"]))
    check(s["cache_hits"] == lbs and s["cache_misses"] == 0 and s["cache_puts"] == 0,
          "host a after the restart, every LB from its cache: %s" % s)
    check(2 <= s["requests"] <= 4, "host a after the restart: %d requests, want the open's only" %
          s["requests"])
    check(pa["requests"] == s["requests"],
          "host a's proxy after the restart: %d requests, want the open's only" % pa["requests"])
    check(pb["requests"] == 0, "host b's proxy saw %d requests while b was idle" % pb["requests"])
    m = ts.store_metrics(a, tid)
    check(m["cache_hits"] == lbs and m["cache_misses"] == 0, "host a's metrics: %s" % m)
    for h in hosts.values():
        stop_daemon(h["env"])


def main():
    if not SRC or len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if not BUCKET or not os.environ.get("AWS_ENDPOINT_URL"):
        print("skip: no object store (run under tests/s3/run_with_store.sh)")
        return 77
    for name in ("HALITE_CLONED_BIN", "HALITE_CLONE_BIN", "HALITE_SYNTH_BIN", "HALITE_INSPECT_BIN"):
        if not os.environ.get(name):
            print("%s not set" % name, file=sys.stderr)
            return 2
    if os.geteuid() != 0:
        print("skip: network namespaces and the engine need root")
        return 77
    if not shutil.which("ip") or not shutil.which("nsenter"):
        print("skip: needs ip (iproute2) and nsenter (util-linux)")
        return 77
    sweep()
    net = Net()
    envs = {}
    hosts = {}
    # SIGTERM (ctest's timeout first, some runners) ends the run through the finally below.
    def on_term(*_):
        raise Fail("killed by SIGTERM")
    signal.signal(signal.SIGTERM, on_term)
    try:
        try:
            hosts = net.make()
        except Fail as x:
            print("skip: cannot make the hosts' namespaces: %s" % x)
            return 77
        for name in hosts:
            envs[name] = tc.Env("hosts-" + name)
        hosts_case(net, hosts, envs)
        log("hosts: ok")
        return 0
    except Exception as x:
        log("hosts: FAIL: %s: %s" % (type(x).__name__, x))
        for name, e in envs.items():
            log("--- host %s's daemon log ---\n%s" % (name, e.log_text()))
        return 1
    finally:
        for h in hosts.values():
            if "proc" in h:
                h["proc"].terminate()
                h["proc"].wait(timeout=10)
        for e in envs.values():
            e.cleanup()
        net.remove()


if __name__ == "__main__":
    sys.exit(main())
