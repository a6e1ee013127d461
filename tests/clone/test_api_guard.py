#!/usr/bin/env python3
"""halite-cloned's front door (issue 24, part A): who gets in, what they may send, what it costs.

  test_api_guard.py CASE     CASE: auth, browser, limits, sigterm, json, socket

Each case starts its own daemon with Env (test_clone.py). Requests are raw
bytes on a socket where the case needs exact control of what is sent;
"nobody" is a local attacker run with setpriv (uid/gid 65534, no groups).
- auth: --listen without --token-file is a usage error (2); a token file
  that is 0644, owned by nobody or too short is refused at start (1) with
  its fix; TCP without or with a wrong token -> 401 with WWW-Authenticate
  and the connection closed, even with a 100 MB Content-Length and no body
  sent; the right token -> 200; halite-clone --tcp --token-file works.
- browser: a text/plain POST -> 415, an Origin -> 403, a foreign Host ->
  403, on TCP and the socket; no template was made by any; the same POST
  done right makes one.
- limits: 300 idle TCP connections from 127.0.0.2, a slowloris from
  127.0.0.3 and 100 idle socket connections from nobody: /healthz and
  /metrics answer within 2 s over TCP and the socket; an endless chunked
  body gets 413 and a closed connection after < 1 MiB sent.
- sigterm: with a slowloris, a half-sent body, idle connections and a slow
  request (a clone that never gets ready) in progress, SIGTERM ends the
  daemon with 0 within 10 s.
- json: duplicate keys, \\u0000, invalid UTF-8, a lone surrogate, raw
  control characters and 40-deep nesting -> 400 naming the problem and its
  byte; URLs with bytes 0xff 0xc3 and of 2000 bytes of 2-byte characters ->
  replies that are strict UTF-8 and JSON.
- tls: --tls-cert/--tls-key/--tls-client-ca: a client with a certificate of
  the CA and the token gets 200; without a certificate, or with one of
  another CA, 403; plain HTTP on the port gets no reply; a key file 0644 is
  refused at start; halite-clone over TLS works; an endless chunked body
  over TLS still gets its 413.
- socket: --socket-group G: the socket is root:G 0660 in a 0750 directory
  of G; nobody (not in G) gets EACCES, nobody with G gets in.
"""
import json
import os
import resource
import select
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_clone  # noqa: E402
import test_clone as tc  # noqa: E402
# run_cases() turns test_clone's Skip into exit 77: a class of our own would be a failure.
from test_clone import CLONED, CLIENT, SYNTH, Fail, Skip, check, log  # noqa: E402


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def read_reply(s, timeout=5.0, wait_close=1.0):
    """(status, headers {lower: value}, body bytes, closed) of one reply on @s.

    closed: the daemon ended the connection after the reply (waited for
    @wait_close seconds; 0: not waited for, closed only if seen)."""
    s.settimeout(timeout)
    buf = b""
    while b"\r\n\r\n" not in buf:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise Fail("the connection ended before a reply's headers: %r" % buf[:200])
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "-1"))
    closed = False
    while n < 0 or len(body) < n:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            closed = True
            break
        body += chunk
    if not closed and wait_close:
        # does the daemon close the connection after it? (a short wait)
        s.settimeout(wait_close)
        try:
            closed = s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        except socket.timeout:
            closed = False
    return status, hdrs, body, closed


def strict_json(body, what):
    """@body decoded strictly as UTF-8, then as JSON: fails the case if either fails."""
    try:
        text = body.decode("utf-8", errors="strict")
    except UnicodeDecodeError as x:
        raise Fail("%s: the reply is not valid UTF-8 (%s): %r" % (what, x, body[:120]))
    try:
        return json.loads(text)
    except ValueError as x:
        raise Fail("%s: the reply is not JSON (%s): %r" % (what, x, text[:120]))


class Tcp:
    """The daemon's TCP listener, with its token."""

    def __init__(self, e, port, token):
        self.e, self.port, self.token = e, port, token
        self.host = "127.0.0.1:%d" % port

    def connect(self, src=None, timeout=5.0):
        s = socket.socket()
        s.settimeout(timeout)
        if src:
            s.bind((src, 0))
        s.connect(("127.0.0.1", self.port))
        return s

    def raw(self, data, src=None, timeout=5.0, wait_close=1.0):
        s = self.connect(src, timeout)
        try:
            s.sendall(data)
            return read_reply(s, timeout, wait_close)
        finally:
            s.close()

    def req(self, method, path, body=None, headers=None, token=True, timeout=5.0, wait_close=1.0):
        h = {"Host": self.host}
        if token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/json"
            h["Content-Length"] = str(len(body))
        h.update(headers or {})
        data = ("%s %s HTTP/1.1\r\n" % (method, path)).encode() + \
            b"".join(("%s: %s\r\n" % kv).encode() for kv in h.items() if kv[1] is not None) + \
            b"\r\n" + (body or b"")
        return self.raw(data, timeout=timeout, wait_close=wait_close)


def unix_raw(path, data, timeout=5.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.sendall(data)
        return read_reply(s, timeout)
    finally:
        s.close()


def make_token(e, name="token", mode=0o600, text=None):
    path = os.path.join(e.tmp, name)
    with open(path, "w") as f:
        f.write(text if text is not None else os.urandom(24).hex() + "\n")
    os.chmod(path, mode)
    return path


def start_tcp(e, *extra):
    """The daemon with --listen and --token-file: its Tcp."""
    port = tc.hg.free_port()
    tok = make_token(e)
    e.start("--listen", "127.0.0.1:%d" % port, "--token-file", tok, *extra)
    with open(tok) as f:
        return Tcp(e, port, f.read().strip())


def run_daemon(e, *args, timeout=20):
    """The daemon run with @args until it exits: (rc, its output)."""
    r = subprocess.run([CLONED, "--socket", e.sock, "--state-dir", e.state, "--mem-dir", e.mem,
                        "--synth-bin", SYNTH] + list(args), capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def templates(e):
    return e.ok("GET", "/templates")["templates"]


# --- cases -----------------------------------------------------------------

def case_auth(e):
    port = tc.hg.free_port()
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port)
    check(rc == 2 and "--token-file" in out, "--listen without --token-file: rc %s: %s" % (rc, out))
    bad = make_token(e, "t644", 0o644)
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port, "--token-file", bad)
    check(rc == 1 and "chmod 600 " + bad in out, "token file 0644: rc %s: %s" % (rc, out))
    theirs = make_token(e, "tnobody")
    os.chown(theirs, 65534, 65534)
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port, "--token-file", theirs)
    check(rc == 1 and "chown 0 " + theirs in out, "token file of nobody: rc %s: %s" % (rc, out))
    short = make_token(e, "tshort", text="short\n")
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port, "--token-file", short)
    check(rc == 1 and "at least 32" in out, "a 5-character token: rc %s: %s" % (rc, out))
    check(not os.path.exists(e.sock), "a refused start left its socket")
    log("  refused at start: no token file, 0644, nobody's, too short")

    t = start_tcp(e)
    # A 100 MB body announced and never sent: the 401 must come anyway, and the end.
    for name, auth in (("no token", None), ("a wrong token", "Bearer " + "x" * len(t.token)),
                       ("the token as Basic", "Basic " + t.token),
                       ("a prefix of the token", "Bearer " + t.token[:-1])):
        t0 = time.time()
        st, h, body, closed = t.req("POST", "/templates", headers={
            "Authorization": auth, "Content-Type": "application/json",
            "Content-Length": "100000000"}, token=False)
        j = strict_json(body, name)
        check(st == 401, "%s: status %s, wanted 401: %s" % (name, st, j))
        check(h.get("www-authenticate", "").startswith("Bearer"),
              "%s: 401 without WWW-Authenticate: Bearer: %s" % (name, h))
        check("Authorization: Bearer" in j["error"], "%s: error %r does not say what to send" % (name, j))
        check(closed, "%s: the connection stays open after the 401" % name)
        check(time.time() - t0 < 3, "%s: the 401 took %.1f s" % (name, time.time() - t0))
    st, h, body, _ = t.req("GET", "/healthz")
    check(st == 200 and strict_json(body, "healthz")["ok"] is True, "right token: %s %r" % (st, body))
    log("  TCP: no/wrong token -> 401 and closed (100 MB announced); right token -> 200")

    tokf = os.path.join(e.tmp, "token")
    r = subprocess.run([CLIENT, "--tcp", t.host, "--token-file", tokf, "health"], capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 0, "halite-clone --tcp --token-file health: %s" % r)
    r = subprocess.run([CLIENT, "--tcp", t.host, "list"], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, HALITE_CLONED_TOKEN_FILE=tokf))
    check(r.returncode == 0, "halite-clone --tcp with HALITE_CLONED_TOKEN_FILE: %s" % r)
    wrong = make_token(e, "wrong")
    r = subprocess.run([CLIENT, "--tcp", t.host, "--token-file", wrong, "health"], capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 1 and "authentication required" in r.stderr,
          "halite-clone with a wrong token: %s" % r)
    log("  halite-clone --tcp: token file and env work, a wrong token is refused")


def case_browser(e):
    t = start_tcp(e)
    snap = e.snapshot()
    body = json.dumps({"snapshot": snap}).encode()
    cases = [
        ("text/plain", {"Content-Type": "text/plain"}, 415, "application/json"),
        ("form", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
        ("no type", {"Content-Type": None}, 415, "application/json"),
        ("Origin", {"Origin": "http://evil.example"}, 403, "browser requests are refused"),
        ("Origin null", {"Origin": "null"}, 403, "browser requests are refused"),
        ("Host", {"Host": "evil.example:%d" % t.port}, 403, "evil.example"),
        ("Host no port", {"Host": "127.0.0.1"}, 403, "127.0.0.1"),
    ]
    for name, hdrs, want, words in cases:
        st, h, rbody, closed = t.req("POST", "/templates", body, headers=hdrs)
        j = strict_json(rbody, name)
        check(st == want and words in j["error"], "TCP %s: %s %s, wanted %d naming %r" % (name, st, j, want, words))
        log("  TCP    %-12s %d %s" % (name, st, j["error"][:70]))
    for name, hdrs, want, words in cases[:5]:
        head = "POST /templates HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n" % len(body)
        head += "".join("%s: %s\r\n" % kv for kv in hdrs.items() if kv[1] is not None)
        st, h, rbody, closed = unix_raw(e.sock, head.encode() + b"\r\n" + body)
        j = strict_json(rbody, name)
        check(st == want and words in j["error"], "socket %s: %s %s, wanted %d" % (name, st, j, want))
        log("  socket %-12s %d %s" % (name, st, j["error"][:70]))
    check(templates(e) == [], "a refused request made a template: %s" % templates(e))
    # The same request, done right, is served: the refusals were the guards'.
    st, h, rbody, _ = t.req("POST", "/templates", body,
                            headers={"Content-Type": "application/json; charset=utf-8"})
    check(st == 201, "the right POST over TCP: %s %r" % (st, rbody))
    check(len(templates(e)) == 1, "templates after the right POST: %s" % templates(e))


def closed_count(socks):
    """How many of @socks the daemon has closed (EOF or reset), without waiting."""
    n = 0
    for s in socks:
        t = s.gettimeout()
        s.settimeout(0)
        try:
            n += s.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            pass
        except OSError:
            n += 1
        s.settimeout(t)
    return n


def hold_nobody(sock, n, seconds):
    """A process of nobody holding @n connections to @sock: (Popen, how many the daemon closed)."""
    code = ("import socket,sys,time\n"
            "sys.path.insert(0, %r)\n"
            "from test_api_guard import closed_count\n"
            "ss=[]\n"
            "for i in range(%d):\n"
            "    s=socket.socket(socket.AF_UNIX); s.connect(%r); ss.append(s)\n"
            "time.sleep(1.5)\n"
            "print(len(ss), closed_count(ss), flush=True)\n"
            "time.sleep(%d)\n" % (os.path.dirname(os.path.abspath(__file__)), n, sock, seconds))
    p = subprocess.Popen(NOBODY + [sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd="/")
    line = p.stdout.readline().split()
    check(len(line) == 2 and line[0] == str(n),
          "nobody connected %r of %d: %s" % (line, n, p.stderr.read() if p.poll() is not None else ""))
    return p, int(line[1])


def slowloris(t, src, stop, first=b"GET /healthz HTTP/1.1\r\nHost: "):
    """A connection from @src that sends one header byte every 2 s until @stop."""
    def run():
        try:
            s = t.connect(src)
            for b in first + t.host.encode() + b"\r\nX-Slow: " + b"a" * 1000:
                if stop.wait(2):
                    break
                s.send(bytes([b]))
            s.close()
        except OSError:
            pass
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def timed(what, fn):
    t0 = time.time()
    st, body = fn()
    dt = time.time() - t0
    check(st == 200, "%s under load: status %s" % (what, st))
    check(dt < 2, "%s under load took %.2f s" % (what, dt))
    return dt


def endless_chunked(t):
    """An endless chunked POST body: (status, closed, bytes sent when the reply came)."""
    s = t.connect(timeout=10)
    s.sendall(("POST /templates HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (t.host, t.token)).encode())
    chunk = b"1000\r\n" + b" " * 4096 + b"\r\n"
    sent = 0
    try:
        while sent < 64 << 20:
            r, _, _ = select.select([s], [], [], 0)
            if r:
                break
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            time.sleep(0.001)
        st, h, body, closed = read_reply(s, 10)
        return st, strict_json(body, "413"), closed, sent
    finally:
        s.close()


def case_limits(e):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    t = start_tcp(e, "--socket-group", "nogroup")
    held, stop = [], threading.Event()
    nob = None
    try:
        for i in range(300):
            try:
                held.append(t.connect("127.0.0.2"))
            except OSError as x:
                raise Fail("idle connection %d from 127.0.0.2: %s" % (i, x))
        lor = slowloris(t, "127.0.0.3", stop)
        nob, nob_closed = hold_nobody(e.sock, 100, 60)
        log("  holding 300 idle TCP connections (127.0.0.2), a slowloris (127.0.0.3), "
            "100 idle socket connections of nobody")
        # 64 per client: the daemon closed the rest at once
        tcp_closed = closed_count(held)
        check(tcp_closed == 300 - 64, "of 300 connections from 127.0.0.2 the daemon closed %d, "
              "wanted 236 (64 kept)" % tcp_closed)
        check(nob_closed == 100 - 64, "of nobody's 100 socket connections the daemon closed %d, "
              "wanted 36 (64 kept)" % nob_closed)
        log("  per client: 64 kept of 300 TCP (127.0.0.2) and of nobody's 100 on the socket")
        worst = 0
        for rnd in range(3):
            for what, fn in (
                    ("TCP /healthz", lambda: t.req("GET", "/healthz", timeout=2, wait_close=0)[::2]),
                    ("TCP /metrics", lambda: t.req("GET", "/metrics", timeout=2, wait_close=0)[::2]),
                    ("socket /healthz", lambda: e.req("GET", "/healthz", timeout=2)),
                    ("socket /metrics", lambda: e.req("GET", "/metrics", timeout=2))):
                worst = max(worst, timed(what, fn))
            time.sleep(1)
        log("  /healthz and /metrics over TCP and the socket: 200 each, slowest %.3f s" % worst)
        st, j, closed, sent = endless_chunked(t)
        check(st == 413 and "65536" in j["error"], "endless chunked body: %s %s" % (st, j))
        check(closed, "endless chunked body: the connection stays open after the 413")
        check(sent < 1 << 20, "endless chunked body: %d bytes sent before the 413" % sent)
        log("  endless chunked body: 413 and closed after %d KiB sent" % (sent >> 10))
        # A 100 MB body announced: 413 at once, nothing read, closed.
        st, h, body, closed = t.req("POST", "/templates", headers={
            "Content-Type": "application/json", "Content-Length": "100000000"})
        j = strict_json(body, "100 MB")
        check(st == 413 and "65536" in j["error"] and closed, "a 100 MB Content-Length: %s %s closed %s" % (st, j, closed))
        log("  100 MB announced: 413 at once, closed")
        check(templates(e) == [], "templates after the attack: %s" % templates(e))
    finally:
        stop.set()
        for s in held:
            s.close()
        if nob:
            nob.kill()
            nob.wait()


def case_sigterm(e):
    # A "synth" that never says ready: a clone request stays in progress.
    fake = os.path.join(e.tmp, "never-ready")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\nexec sleep 30\n")
    os.chmod(fake, 0o755)
    snap = e.snapshot()
    test_clone.SYNTH = fake  # the daemon's --synth-bin (Env passes it)
    try:
        t = start_tcp(e)
    finally:
        test_clone.SYNTH = SYNTH
    tid = e.template(snap)["id"]
    stop = threading.Event()
    held = [t.connect() for _ in range(20)]
    slowloris(t, "127.0.0.3", stop)
    half = t.connect()
    half.sendall(("POST /templates HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"snapshot\": "
                  % (t.host, t.token)).encode())
    held.append(half)
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX)
        s.connect(e.sock)
        held.append(s)
    def slow_request():
        try:
            t.req("POST", "/templates/%s/clones" % tid, b'{"count": 1}', timeout=30)
        except (Fail, OSError):
            pass  # the daemon ends it: its end is what the case waits for
    # As many slow requests as the daemon runs at once (8): one more is a 503, and
    # the fast routes still answer.
    for _ in range(8):
        threading.Thread(target=slow_request, daemon=True).start()
    time.sleep(1.5)
    st, h, body, _ = t.req("POST", "/templates/%s/clones" % tid, b'{"count": 1}', wait_close=0)
    j = strict_json(body, "a 9th slow request")
    check(st == 503 and "busy" in j["error"], "a 9th slow request: %s %s" % (st, j))
    st, h, body, _ = t.req("GET", "/healthz", timeout=2, wait_close=0)
    check(st == 200, "/healthz with 8 slow requests running: %s" % st)
    log("  8 slow requests running: a 9th gets 503, /healthz 200")
    try:
        t0 = time.time()
        e.daemon.send_signal(signal.SIGTERM)
        try:
            rc = e.daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise Fail("the daemon still runs 10 s after SIGTERM")
        dt = time.time() - t0
        e.daemon = None
        check(rc == 0, "the daemon exited %s after SIGTERM" % rc)
        log("  SIGTERM with a slowloris, a half-sent body, 40 idle connections and 8 slow "
            "requests: exit 0 in %.1f s" % dt)
    finally:
        stop.set()
        for s in held:
            s.close()
    # SIGINT the same, with idle connections and a slowloris
    t = start_tcp(e)
    stop = threading.Event()
    held = [t.connect() for _ in range(20)]
    slowloris(t, "127.0.0.3", stop)
    time.sleep(0.5)
    try:
        t0 = time.time()
        e.daemon.send_signal(signal.SIGINT)
        try:
            rc = e.daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise Fail("the daemon still runs 10 s after SIGINT")
        e.daemon = None
        check(rc == 0, "the daemon exited %s after SIGINT" % rc)
        log("  SIGINT with a slowloris and 20 idle connections: exit 0 in %.1f s" % (time.time() - t0))
    finally:
        stop.set()
        for s in held:
            s.close()
    for cdir in os.listdir(os.path.join(e.state, "clones")):
        for name in os.listdir(os.path.join(e.state, "clones", cdir)):
            check(".tmp" not in name, "a half-written state file: %s/%s" % (cdir, name))


def case_json(e):
    e.start()
    snap = e.snapshot()
    dup = b'{"snapshot": "%s", "snapshot": "/etc/passwd"}' % snap.encode()
    cases = [
        ("duplicate key", dup, "duplicate key \"snapshot\"", dup.index(b'"snapshot"', 5)),
        ("escaped duplicate", b'{"snapshot": "%s", "snap\\u0073hot": "/x"}' % snap.encode(),
         "duplicate key", None),
        ("nested duplicate", b'{"a": {"b": 1, "b": 2}, "snapshot": "/x"}', "duplicate key", None),
        ("\\u0000", b'{"snapshot": "%s\\u0000/x"}' % snap.encode(), "\\u0000", None),
        ("0xff", b'{"snapshot": "/tmp/\xffx"}', "invalid UTF-8", 19),
        ("overlong", b'{"snapshot": "/tmp/\xc0\xafx"}', "invalid UTF-8", 19),
        ("UTF-16 surrogate", b'{"snapshot": "/tmp/\xed\xa0\x80x"}', "invalid UTF-8", 19),
        ("above U+10FFFF", b'{"snapshot": "/tmp/\xf4\x90\x80\x80"}', "invalid UTF-8", 19),
        ("cut character", b'{"snapshot": "/tmp/\xc3"}', "invalid UTF-8", 19),
        ("lone high surrogate", b'{"snapshot": "/tmp/\\ud800x"}', "lone surrogate", 19),
        ("lone low surrogate", b'{"snapshot": "/tmp/\\udc00"}', "lone surrogate", 19),
        ("raw control", b'{"snapshot": "/tmp/a\x01b"}', "control character", 20),
        ("raw newline", b'{"snapshot": "/tmp/a\nb"}', "control character", 20),
        ("40 deep", b'{"a":' * 40 + b"1" + b"}" * 40, "deeper than 32", 5 * 32),
        ("trailing", b'{"snapshot": "/x"} {}', "text after the value", 19),
    ]
    for name, body, words, at in cases:
        st, j = e.req("POST", "/templates", raw=body)
        check(st == 400 and isinstance(j, dict), "%s: status %s, wanted 400: %s" % (name, st, j))
        check(words in j["error"], "%s: error %r does not name %r" % (name, j["error"], words))
        if at is not None:
            check("at byte %d:" % at in j["error"], "%s: error %r is not at byte %d" % (name, j["error"], at))
        log("  %-20s 400 %s" % (name, j["error"][:80]))
    # A good body still is one: a surrogate pair and escapes decode.
    st, j = e.req("POST", "/templates", raw=b'{"snapshot": "%s", "hotset": true, "x\\ud83d\\ude00": 1}'
                  % snap.encode())
    check(st == 400 and "\U0001F600" in j["error"], "a valid pair in an unknown field: %s %s" % (st, j))
    check(templates(e) == [], "a refused body made a template: %s" % templates(e))
    # 31 levels are fine for the strict reader (the route then says what is wrong)
    st, j = e.req("POST", "/templates", raw=b'{"a":' * 32 + b"1" + b"}" * 32)
    check(st == 400 and "deeper" not in j["error"], "32 levels: %s %s" % (st, j))

    # The routes are data: the daemon lists them, and serves each (no "no route").
    r = subprocess.run([CLONED, "--list-routes"], capture_output=True, text=True, timeout=10)
    listed = sorted(tuple(ln.split()[:2]) for ln in r.stdout.splitlines())
    want = sorted([("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/templates"), ("POST", "/templates"),
                   ("GET", "/templates/ID"), ("DELETE", "/templates/ID"), ("POST", "/templates/ID/clones"),
                   ("GET", "/clones"), ("GET", "/clones/ID"), ("DELETE", "/clones/ID")])
    check(r.returncode == 0 and listed == want, "--list-routes: %s %r" % (r.returncode, r.stdout))
    for method, path in listed:
        p = path.replace("ID", "t-00000000" if "templates" in path else "c-00000000")
        st, j = e.req(method, p, raw=b"{}" if method == "POST" else None)
        check(not (isinstance(j, dict) and j.get("error", "").startswith("no route")) and st != 405,
              "listed route %s %s is not served: %s %s" % (method, path, st, j))
    log("  --list-routes: the %d routes, each served" % len(listed))

    for name, path in (("raw 0xff 0xc3", b"/templates/\xff\xc3"),
                       ("encoded %ff%c3", b"/templates/%ff%c3"),
                       ("encoded control", b"/templates/a%01b"),
                       ("2000 bytes of 2-byte characters", b"/" + "\u00e9".encode() * 1000),
                       ("2000 encoded", b"/x/" + urllib.parse.quote("\u00e9" * 1000).encode())):
        st, h, body, _ = unix_raw(e.sock, b"GET " + path + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        j = strict_json(body, name)
        check(st in (400, 404) and isinstance(j.get("error"), str), "%s: %s %s" % (name, st, j))
        log("  URL %-32s %d %s" % (name, st, j["error"][:60]))


def case_socket(e):
    grp = "adm"
    import grp as grpmod
    gid = grpmod.getgrnam(grp).gr_gid
    e.start("--socket-group", grp)
    st = os.stat(e.sock)
    check(stat.S_ISSOCK(st.st_mode) and st.st_uid == 0 and st.st_gid == gid and
          stat.S_IMODE(st.st_mode) == 0o660,
          "socket: uid %d gid %d mode %o, wanted 0:%d 0660" % (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), gid))
    dst = os.stat(os.path.dirname(e.sock))
    check(dst.st_gid == gid and stat.S_IMODE(dst.st_mode) == 0o750,
          "socket dir: gid %d mode %o, wanted %d 0750" % (dst.st_gid, stat.S_IMODE(dst.st_mode), gid))
    code = ("import socket,errno,sys\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect(%r); s.sendall(b'GET /healthz HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100)[:12].decode())\n"
            "except OSError as x:\n"
            "    print(errno.errorcode.get(x.errno, x.errno))\n" % e.sock)
    r = subprocess.run(NOBODY + [sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    check(r.stdout.strip() == "EACCES", "nobody connecting: %r %r" % (r.stdout, r.stderr))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--groups=%d" % gid, sys.executable,
                        "-c", code], capture_output=True, text=True, timeout=30)
    check(r.stdout.strip() == "HTTP/1.1 200", "nobody in %s connecting: %r %r" % (grp, r.stdout, r.stderr))
    log("  socket root:%s 0660, dir 0750: nobody EACCES, nobody in %s 200" % (grp, grp))


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d):
    """A CA, the daemon's certificate (127.0.0.1, localhost), a client's, and a stranger's (another CA)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"]
    leaf = ["-addext", "basicConstraints=critical,CA:FALSE"]
    for ca in ("ca", "rogue-ca"):
        openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".crt", "-subj", "/CN=" + ca, cwd=d)
    openssl("req", "-x509", "-CA", "ca.crt", "-CAkey", "ca.key", *ec, *leaf, "-keyout", "srv.key", "-out", "srv.crt",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext", "extendedKeyUsage=serverAuth", cwd=d)
    for name, ca in (("client", "ca"), ("stranger", "rogue-ca")):
        openssl("req", "-x509", "-CA", ca + ".crt", "-CAkey", ca + ".key", *ec, *leaf, "-keyout", name + ".key",
                "-out", name + ".crt", "-subj", "/CN=" + name, "-addext", "extendedKeyUsage=clientAuth", cwd=d)
    for f in os.listdir(d):
        if f.endswith(".key"):
            os.chmod(os.path.join(d, f), 0o600)


def case_tls(e):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode:
        raise Skip("no openssl to make certificates")
    pki = os.path.join(e.tmp, "pki")
    os.mkdir(pki)
    make_pki(pki)
    P = lambda f: os.path.join(pki, f)  # noqa: E731
    tls_args = ["--tls-cert", P("srv.crt"), "--tls-key", P("srv.key"), "--tls-client-ca", P("ca.crt")]
    port = tc.hg.free_port()
    tok = make_token(e)
    loose = P("loose.key")
    with open(P("srv.key")) as f, open(loose, "w") as g:
        g.write(f.read())
    os.chmod(loose, 0o644)
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port, "--token-file", tok, "--tls-cert", P("srv.crt"),
                         "--tls-key", loose, "--tls-client-ca", P("ca.crt"))
    check(rc == 1 and "chmod 600 " + loose in out, "a TLS key file 0644: rc %s: %s" % (rc, out))
    rc, out = run_daemon(e, "--listen", "127.0.0.1:%d" % port, "--token-file", tok, "--tls-cert", P("srv.crt"))
    check(rc == 2 and "go together" in out, "--tls-cert alone: rc %s: %s" % (rc, out))
    t = start_tcp(e, *tls_args)

    def tls_req(cert, data, wait_close=1.0):
        ctx = ssl.create_default_context(cafile=P("ca.crt"))
        if cert:
            ctx.load_cert_chain(P(cert + ".crt"), P(cert + ".key"))
        raw = socket.create_connection(("127.0.0.1", t.port), timeout=5)
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        try:
            s.sendall(data)
            return read_reply(s, 5, wait_close)
        finally:
            s.close()
    get = ("GET /healthz HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n" % (t.host, t.token)).encode()
    st, h, body, _ = tls_req("client", get, 0)
    check(st == 200 and strict_json(body, "tls")["ok"] is True, "TLS with the client's certificate: %s %r" % (st, body))
    for who in (None, "stranger"):
        try:
            st, h, body, closed = tls_req(who, get)
            j = strict_json(body, "tls %s" % who)
            check(st == 403 and "client certificate" in j["error"] and closed,
                  "TLS with %s: %s %s closed %s" % (who or "no certificate", st, j, closed))
            how = "403 %s" % j["error"]
        except (ssl.SSLError, ConnectionResetError) as x:
            how = "refused in the handshake (%s)" % x  # as good
        log("  TLS with %s: %s" % (who or "no certificate", how))
    log("  TLS: the client's certificate 200; none, or another CA's: refused")
    try:
        st = t.raw(get)[0]
        raise Fail("plain HTTP on the TLS listener got a reply: %s" % st)
    except (Fail, OSError) as x:
        check(not isinstance(x, Fail) or "before a reply" in str(x), str(x))
    log("  plain HTTP on the TLS port: no reply")
    r = subprocess.run([CLIENT, "--tcp", t.host, "--token-file", tok, "--tls-ca", P("ca.crt"), "--tls-cert",
                        P("client.crt"), "--tls-key", P("client.key"), "health"], capture_output=True, text=True,
                       timeout=30)
    check(r.returncode == 0, "halite-clone over TLS: %s" % r)
    # an endless chunked body inside TLS: the 413 comes inside TLS too
    ctx = ssl.create_default_context(cafile=P("ca.crt"))
    ctx.load_cert_chain(P("client.crt"), P("client.key"))
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", t.port), timeout=10), server_hostname="127.0.0.1")
    s.sendall(("POST /templates HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" % (t.host, t.token)).encode())
    sent, chunk = 0, b"1000\r\n" + b" " * 4096 + b"\r\n"
    try:
        while sent < 8 << 20:
            if select.select([s], [], [], 0)[0] or s.pending():
                break
            s.sendall(chunk)
            sent += len(chunk)
            time.sleep(0.001)
    except (ssl.SSLError, OSError):
        pass
    st, h, body, closed = read_reply(s, 10)
    s.close()
    check(st == 413 and sent < 1 << 20, "endless chunked body over TLS: %s after %d bytes" % (st, sent))
    log("  halite-clone over TLS works; endless chunked body over TLS: 413 after %d KiB" % (sent >> 10))


CASES = {"auth": case_auth, "browser": case_browser, "limits": case_limits, "sigterm": case_sigterm,
         "json": case_json, "socket": case_socket, "tls": case_tls}


def main():
    return tc.run_cases(CASES, __doc__, "guard-")


if __name__ == "__main__":
    sys.exit(main())
