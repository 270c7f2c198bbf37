#!/usr/bin/env python3
"""ghostproxy's misses with the fetch's transfer folded into the lookup (begin) and the inline
store (end), beside a ghostfs with the ipaq-2004's emulated card (DESIGN §4.3, §4.5): a miss is
still answered no sooner than the card's modelled transfer (4 round trips of 40 ms, then the
body), its body is nginx's, it is stored inline and then a hit; no transfer stays open after
misses stored inline, after concurrent ones, after one not stored (no-store) and after one too
big to go inline (the fill file). An open transfer keeps the card's network module busy, so a
leak would show as the card never sleeping. TAP; skipped without root, /dev/fuse or nginx."""
import http.client
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 8
# ipaq-2004: round_trips = 4 at 2 x 20 ms before the first byte.
MODELLED_FETCH_S = 4 * 0.040


def get(port, url):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    start = time.monotonic()
    c.request("GET", url)
    r = c.getresponse()
    body = r.read()
    took = time.monotonic() - start
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), body, took


def wait_for(fn, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    return fn()


def main():
    h.require_root_and_fuse()
    t = h.Tap(PLAN)
    work = h.tempdir()
    www = os.path.join(work, "www")
    os.makedirs(os.path.join(www, "c"))
    files = {f"c/small{i}.bin": os.urandom(3000 + i) for i in range(10)}
    files["c/big.bin"] = os.urandom(64 * 1024)
    files["c/nostore.bin"] = os.urandom(2000)
    for name, data in files.items():
        with open(os.path.join(www, name), "wb") as f:
            f.write(data)
    nginx = h.Nginx(www, extra_location="location /c/ { expires 1h; }\n"
                    "    location = /c/nostore.bin { add_header Cache-Control no-store; }")
    if not nginx.start():
        t.skip_rest(PLAN, "nginx did not start")
        t.done()
    _, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), args=["--profile", "ipaq-2004"])
    ctl = h.Control(sock)
    port = h.free_port()
    log = os.path.join(work, "ghostproxy.log")
    p = subprocess.Popen([os.path.join(h.build_dir(), "proxy", "ghostproxy"), "--listen", f"127.0.0.1:{port}",
                          "--mount", mnt, "--control", sock, "--memory-cache", "0"],
                         stdout=open(log, "a"), stderr=subprocess.STDOUT)
    h.on_exit(lambda: p.poll() is None and (p.terminate(), p.wait(10)))
    if not t.check(h.wait_port(port, 15), "ghostproxy listens beside a ghostfs with an emulated card",
                   open(log).read()[-600:]):
        t.skip_rest(PLAN, "no proxy")
        t.done()
    origin = nginx.url()

    def proxy_stats():
        return ctl.ok("stats")["proxy"]

    def settled(inline_fills):
        s = proxy_stats()
        return s if s["open_transfers"] == 0 and s["inline_fills"] >= inline_fills else None

    before = proxy_stats()
    status, head, body, took = get(port, origin + "c/small0.bin")
    t.check(status == 200 and body == files["c/small0.bin"] and head.get("x-ghost-source") == "network"
            and took >= MODELLED_FETCH_S,
            "a miss is nginx's body, answered no sooner than the card's modelled transfer",
            f"status {status}, {len(body)} bytes, {took * 1000:.0f} ms (card: >= {MODELLED_FETCH_S * 1000:.0f} ms)")
    after = wait_for(lambda: settled(before["inline_fills"] + 1))
    t.check(after is not None, "the miss is stored inline and its transfer ends with the store",
            proxy_stats())
    status, head, body, _ = get(port, origin + "c/small0.bin")
    t.check(status == 200 and body == files["c/small0.bin"] and head.get("x-ghost-source") == "cache",
            "the next request is a hit", head)

    # Concurrent misses: every transfer folded into its lookup ends with its store.
    results = {}

    def fetch(name):
        results[name] = get(port, origin + name)

    names = [f"c/small{i}.bin" for i in range(1, 10)]
    threads = [threading.Thread(target=fetch, args=(n,)) for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    good = all(results.get(n, (0, {}, b"", 0))[0] == 200 and results[n][2] == files[n] for n in names)
    after = wait_for(lambda: settled(before["inline_fills"] + 10))
    t.check(good and after is not None, "9 concurrent misses are nginx's bodies, all stored inline, no transfer left open",
            proxy_stats())

    # Not stored: the end goes on its own.
    status, _, body, took = get(port, origin + "c/nostore.bin")
    t.check(status == 200 and body == files["c/nostore.bin"] and took >= MODELLED_FETCH_S
            and wait_for(lambda: proxy_stats()["open_transfers"] == 0),
            "a miss that may not be stored still waits for the card and ends its transfer", proxy_stats())

    # Too big to go inline: the fill file, and the end on its own.
    fills = proxy_stats()["fills"]
    status, _, body, _ = get(port, origin + "c/big.bin")
    t.check(status == 200 and body == files["c/big.bin"]
            and wait_for(lambda: proxy_stats()["open_transfers"] == 0 and proxy_stats()["fills"] > fills),
            "a body too big to go inline goes through the fill file and ends its transfer", proxy_stats())
    status, head, body, _ = get(port, origin + "c/big.bin")
    t.check(status == 200 and body == files["c/big.bin"] and head.get("x-ghost-source") == "cache",
            "and is a hit next", head)
    ctl.close()
    t.done()


if __name__ == "__main__":
    main()
