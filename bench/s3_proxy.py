#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A TCP proxy in front of an S3 endpoint that adds a round-trip latency per
request, counts requests and bytes, and fails on command like a store that
goes away: the benchmarks' stand-in for a store across a network (netem is
not in this kernel).

  bench/s3_proxy.py --upstream http://127.0.0.1:PORT [--rtt-ms 20]
                    [--listen 127.0.0.1] [--port 0] [--control PATH]

Prints one JSON line on stdout once it listens: {"port": N, "control": PATH,
"endpoint": "http://ADDR:N"}. Point AWS_ENDPOINT_URL at the endpoint.
--listen takes another local IPv4 address than loopback: a network
namespace's veth peer reaches a loopback-only store through it
(tests/s3/test_clone_hosts.py).
SigV4 signs the Host header the client sends, and the proxy passes every byte
through unchanged, so the store checks the signature against the proxy's
address the client signed: nothing is rewritten.

Latency. The proxy does not parse HTTP; it sees a connection's bytes turn
around. The first bytes the client sends on a connection, and the first it
sends after the server has answered, start a request: the proxy holds them
for the whole RTT before passing them on. Charging the whole round trip on
the request side counts it exactly once per request on HTTP/1.1 keep-alive
connections whatever the response's size, keeps each direction's bytes in
order (later bytes of the request queue behind the held ones), and needs one
turn detected instead of two; the client sees the same time to its first
response byte as with half the RTT each way. A new connection costs one RTT
more before it is accepted upstream (--no-connect-rtt drops it), as a TCP
handshake does. Bandwidth is not limited. Clients that pipeline requests
(libcurl does not) would be charged once per batch.

Control, on a unix stream socket (--control, made 0600; default a fresh
directory under $TMPDIR): one command per line, one JSON line answers each.
  stats                    {"requests","connections","bytes_up","bytes_down",
                            "refused","reset","rtt_ms","outage_s"}
  zero                     counters to zero, {"ok": true}
  rtt MS                   the RTT from now on (new requests), {"ok": true}
  outage SECONDS [reset|stall]
                           for SECONDS: new connections are accepted and reset
                           at once (the client sees a refusal: connection reset
                           before any answer); open ones are reset (default) or
                           stalled (bytes held, flowing again after). {"ok": true}
  quit                     {"ok": true}, then the proxy exits 0
SIGTERM and SIGINT also make it exit 0 after closing every connection.
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.parse

CHUNK = 256 << 10


class Proxy:
    def __init__(self, host, port, rtt_ms, connect_rtt):
        self.up_host, self.up_port = host, port
        self.rtt = rtt_ms / 1000.0
        self.connect_rtt = connect_rtt
        self.outage_until = 0.0
        self.stall = None  # an Event set while traffic may flow
        self.open = {}  # id -> connection: {"turn", "writers"}
        self.done = asyncio.Event()
        self.zero()

    def zero(self):
        self.requests = self.connections = self.refused = self.reset = 0
        self.bytes_up = self.bytes_down = 0

    def in_outage(self):
        return time.monotonic() < self.outage_until

    def stats(self):
        return {"requests": self.requests, "connections": self.connections,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "refused": self.refused, "reset": self.reset,
                "rtt_ms": self.rtt * 1000.0,
                "outage_s": max(0.0, round(self.outage_until - time.monotonic(), 3))}

    @staticmethod
    def abort(writer):
        # SO_LINGER 0 makes close send an RST: the peer sees a reset, not an EOF.
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            except OSError:
                pass
        writer.transport.abort()

    async def client(self, creader, cwriter):
        if self.in_outage():
            self.refused += 1
            self.abort(cwriter)
            return
        self.connections += 1
        if self.connect_rtt and self.rtt:
            await asyncio.sleep(self.rtt)
        try:
            ureader, uwriter = await asyncio.open_connection(self.up_host, self.up_port)
        except OSError:
            self.abort(cwriter)
            return
        conn = {"turn": True, "writers": (cwriter, uwriter)}
        self.open[id(conn)] = conn
        try:
            await asyncio.gather(self.pump(creader, uwriter, conn, True),
                                 self.pump(ureader, cwriter, conn, False))
        finally:
            self.open.pop(id(conn), None)
            for w in (cwriter, uwriter):
                if not w.is_closing():
                    w.close()

    async def pump(self, reader, writer, conn, up):
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if self.stall is not None:
                    await self.stall.wait()
                if up:
                    if conn["turn"]:
                        conn["turn"] = False
                        self.requests += 1
                        if self.rtt:
                            await asyncio.sleep(self.rtt)
                    self.bytes_up += len(data)
                else:
                    conn["turn"] = True
                    self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            for w in conn["writers"]:
                self.abort(w)

    async def outage(self, seconds, mode):
        self.outage_until = time.monotonic() + seconds
        if mode == "reset":
            for conn in list(self.open.values()):
                self.reset += 1
                for w in conn["writers"]:
                    self.abort(w)
        else:
            self.stall = asyncio.Event()
        await asyncio.sleep(seconds)
        if self.stall is not None:
            self.stall.set()
            self.stall = None

    async def control(self, reader, writer):
        try:
            while line := await reader.readline():
                words = line.decode(errors="replace").split()
                ans = await self.command(words)
                writer.write((json.dumps(ans) + "\n").encode())
                await writer.drain()
                if words[:1] == ["quit"]:
                    self.done.set()
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def command(self, words):
        try:
            if words == ["stats"]:
                return self.stats()
            if words == ["zero"]:
                self.zero()
                return {"ok": True}
            if len(words) == 2 and words[0] == "rtt":
                ms = float(words[1])
                if not 0 <= ms <= 60000:
                    return {"error": f"rtt {words[1]}: not between 0 and 60000 ms"}
                self.rtt = ms / 1000.0
                return {"ok": True}
            if words[:1] == ["outage"] and len(words) in (2, 3):
                secs = float(words[1])
                mode = words[2] if len(words) == 3 else "reset"
                if mode not in ("reset", "stall") or not 0 < secs <= 3600:
                    return {"error": "outage SECONDS [reset|stall], SECONDS in (0, 3600]"}
                if self.in_outage():
                    return {"error": "an outage is already under way"}
                asyncio.ensure_future(self.outage(secs, mode))
                return {"ok": True}
            if words == ["quit"]:
                return {"ok": True}
        except ValueError:
            pass
        return {"error": f"unknown command {' '.join(words)!r}: stats, zero, rtt MS, "
                         "outage SECONDS [reset|stall], quit"}


def die_with_parent():
    """SIGTERM when the parent dies, so that a test or bench killed outright
    (a timeout's SIGKILL runs no cleanup) leaves no proxy behind."""
    import ctypes
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:  # the parent died before the prctl
        sys.exit(0)


def upstream(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"--upstream {url}: an http://HOST:PORT endpoint is needed "
                         "(the proxy passes bytes, it does not terminate TLS)")
    return u.hostname, u.port or 80


async def serve(args):
    host, port = upstream(args.upstream)
    p = Proxy(host, port, args.rtt_ms, not args.no_connect_rtt)
    tmp = None
    ctl = args.control
    if ctl is None:
        tmp = tempfile.mkdtemp(prefix="halite-s3-proxy.")
        ctl = os.path.join(tmp, "control")
    old = os.umask(0o177)
    try:
        srv = await asyncio.start_server(p.client, args.listen, args.port)
        csrv = await asyncio.start_unix_server(p.control, ctl)
    finally:
        os.umask(old)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, p.done.set)
    lport = srv.sockets[0].getsockname()[1]
    print(json.dumps({"port": lport, "control": ctl,
                      "endpoint": f"http://{args.listen}:{lport}"}), flush=True)
    try:
        await p.done.wait()
    finally:
        srv.close()
        csrv.close()
        for conn in list(p.open.values()):
            for w in conn["writers"]:
                p.abort(w)
        await asyncio.sleep(0)
        try:
            os.unlink(ctl)
        except OSError:
            pass
        if tmp:
            os.rmdir(tmp)
    print(json.dumps(p.stats()), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", default=os.environ.get("AWS_ENDPOINT_URL"),
                    help="the store's endpoint (default $AWS_ENDPOINT_URL)")
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="added round trip (0)")
    ap.add_argument("--listen", default="127.0.0.1", metavar="ADDR",
                    help="the IPv4 address it listens on (127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="listening port (0: any free one)")
    ap.add_argument("--control", metavar="PATH", help="the control socket's path")
    ap.add_argument("--no-connect-rtt", action="store_true",
                    help="no RTT for a new connection, only per request")
    ap.add_argument("--die-with-parent", action="store_true",
                    help="exit (SIGTERM) when the process that started it dies")
    args = ap.parse_args()
    if not args.upstream:
        ap.error("--upstream or AWS_ENDPOINT_URL is required")
    if not 0 <= args.rtt_ms <= 60000:
        ap.error(f"--rtt-ms {args.rtt_ms}: not between 0 and 60000")
    try:
        upstream(args.upstream)
        socket.inet_pton(socket.AF_INET, args.listen)
    except ValueError as e:
        ap.error(str(e))
    except OSError:
        ap.error(f"--listen {args.listen}: not an IPv4 address")
    if args.die_with_parent:
        die_with_parent()
    asyncio.run(serve(args))
    return 0


def control(path, line, timeout=10):
    """One command to a running proxy's control socket: its answer, a dict
    ({"error": ...} when it refused). For bench/remote.py and the tests."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(line.encode() + b"\n")
        return json.loads(s.makefile().readline())


if __name__ == "__main__":
    sys.exit(main())
