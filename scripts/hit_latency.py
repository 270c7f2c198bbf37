#!/usr/bin/env python3
"""Proxy hit latency, every request timed: N keep-alive connections to a forward proxy, each
sending one absolute-form GET at a time for `seconds`; each request's latency is CLOCK_MONOTONIC
from just before its send to the last byte of its body. Prints the count and p50/p99/p99.9/max
of the latencies as measured (no correction for coordinated omission: wrk's --latency adds
synthetic samples for every response slower than the mean interval, stats_correct in wrk 4,
so one stall of 100 ms among 8,000 sequential hits moves its p99 by itself; co_p99 is that
corrected p99 computed from these samples; see scripts/RESULTS.md "hit14").

Used by bench_scale.py; standalone:
  hit_latency.py --port P --origin http://127.0.0.1:O/ --threads 2 --share S [--slack 64]
                 [--connections 1] [--seconds 5]
asks for origin + "o/<t>/<i>" with t < threads, i < share - slack (bench_scale's fill URLs),
in a random order (seed 42).
"""
import argparse
import random
import selectors
import socket
import sys
import time


def pct(values, p):
    """Nearest-rank percentile of `values` (sorted or not); None if empty."""
    s = sorted(values)
    if not s:
        return None
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


class _Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = b""
        self.start = 0
        self.need = None  # bytes of the whole response, once its head is in


def run(port, urls, host, connections=1, seconds=5.0, timeout=10.0):
    """Sends GETs for `urls` (an iterator) over `connections` keep-alive connections for
    `seconds`. Returns {"latencies_us": [...], "bad": non-2xx count}. Raises RuntimeError if a
    response does not come within `timeout` or cannot be parsed (no Content-Length)."""
    sel = selectors.DefaultSelector()
    conns = [_Conn(port) for _ in range(connections)]
    lat, bad = [], 0

    def send(c):
        c.buf, c.need = b"", None
        req = f"GET {next(urls)} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        c.start = time.monotonic_ns()
        c.sock.sendall(req)  # a few hundred bytes: fits the socket buffer

    end = time.monotonic() + seconds
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
        send(c)
    try:
        while conns:
            events = sel.select(timeout)
            if not events:
                raise RuntimeError(f"no response within {timeout} s")
            for key, _ in events:
                c = key.data
                data = c.sock.recv(1 << 16)
                if not data:
                    raise RuntimeError("the proxy closed a connection")
                c.buf += data
                if c.need is None:
                    head_end = c.buf.find(b"\r\n\r\n")
                    if head_end < 0:
                        continue
                    head = c.buf[:head_end].decode("latin-1").split("\r\n")
                    length = None
                    for line in head[1:]:
                        name, _, value = line.partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    if length is None:
                        raise RuntimeError(f"response without Content-Length: {head[0]}")
                    c.need = head_end + 4 + length
                    if not head[0].split()[1].startswith("2"):
                        bad += 1
                if len(c.buf) < c.need:
                    continue
                if len(c.buf) > c.need:
                    raise RuntimeError("more bytes than one response (pipelining not used)")
                lat.append((time.monotonic_ns() - c.start) / 1000.0)
                if time.monotonic() < end:
                    send(c)
                else:
                    sel.unregister(c.sock)
                    c.sock.close()
                    conns.remove(c)
    finally:
        for c in conns:
            c.sock.close()
        sel.close()
    return {"latencies_us": lat, "bad": bad}


def corrected(lat, seconds, connections=1):
    """`lat` with wrk 4's coordinated-omission correction (stats_correct, applied before it
    prints --latency): with the mean interval e = run time / (requests per connection), a
    sample v adds synthetic samples v - e, v - 2e, ... while they exceed e."""
    if not lat:
        return []
    e = seconds * 1e6 / max(1, len(lat) // connections)
    out = list(lat)
    for v in lat:
        m = v - e
        while v >= 2 * e and m > e:
            out.append(m)
            m -= e
    return out


def summary(r, seconds=None, connections=1):
    lat = r["latencies_us"]
    s = {"count": len(lat), "bad": r["bad"], "p50_us": pct(lat, 50), "p99_us": pct(lat, 99),
         "p999_us": pct(lat, 99.9), "max_us": max(lat) if lat else None,
         "over_10ms": sum(1 for v in lat if v > 10_000)}
    if seconds:  # what wrk would print for these samples
        s["co_p99_us"] = pct(corrected(lat, seconds, connections), 99)
    return s


def bench_urls(origin, threads, share, slack, seed=42):
    """bench_scale's hit URLs: random among the fill's o/<t>/<i>, i < share - slack."""
    rnd = random.Random(seed)
    top = max(1, share - slack)
    while True:
        yield f"{origin}o/{rnd.randrange(threads)}/{rnd.randrange(top)}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--origin", required=True, help="e.g. http://127.0.0.1:8080/")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--share", type=int, required=True)
    ap.add_argument("--slack", type=int, default=64)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    host = a.origin.split("/")[2]
    s = summary(run(a.port, bench_urls(a.origin, a.threads, a.share, a.slack), host,
                    a.connections, a.seconds), a.seconds, a.connections)
    print(" ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in s.items()))
    return 0 if s["count"] else 1


if __name__ == "__main__":
    sys.exit(main())
