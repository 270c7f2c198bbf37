#!/usr/bin/env python3
"""Origins that misbehave:
  - an origin that accepts connections and never answers fails a read within --stall-timeout
    (here 2 s) instead of holding the reader for 30 s; a file with a cached copy is then served
    from it (stale-if-error, with a log line), one without gets an error;
  - a listing with a name longer than 255 bytes (NAME_MAX: no Linux file system can open it)
    leaves that name out, with one log line, and lists the others.
TAP; skipped without root, /dev/fuse or nginx."""
import http.server
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6
LONG_NAME = "L" * 300


class Listing(http.server.BaseHTTPRequestHandler):
    """An nginx-style autoindex of "/" with one normal and one over-long name."""

    def do_GET(self):
        if self.path != "/":
            body = b"short file\n"
            ctype = "text/plain"
        else:
            rows = "".join(f'<a href="{n}">{n}</a> 25-Nov-2026 11:00 11\n' for n in ("short.txt", LONG_NAME))
            body = (f'<html><head><title>Index of /</title></head><body><h1>Index of /</h1><hr><pre>'
                    f'<a href="../">../</a>\n{rows}</pre><hr></body></html>').encode()
            ctype = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    work, root, sums, nginx = h.serve_tree(extra_location='add_header Cache-Control "max-age=1";')
    odd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listing)
    threading.Thread(target=odd.serve_forever, daemon=True).start()
    h.on_exit(odd.shutdown)
    t = h.Tap(PLAN)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"),
                   {"www": nginx.url(), "odd": f"http://127.0.0.1:{odd.server_address[1]}/"},
                   args=["--stall-timeout", "2"])
    if not t.check(fs.start(), "mounts with --stall-timeout 2", fs.output()):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()

    names = os.listdir(os.path.join(mnt, "odd"))
    os.listdir(os.path.join(mnt, "odd"))
    log = fs.output()
    t.check(names == ["short.txt"] and log.count("longer than 255 bytes") == 1,
            "a name over 255 bytes is left out of the listing, with one log line", (names, log[-300:]))

    cached_path = os.path.join(mnt, "www", "small.txt")
    with open(cached_path, "rb") as f:
        first = f.read()
    os.stat(os.path.join(mnt, "www", "page.html"))  # listed, never read: not cached
    # The origin stalls: nginx stops and a socket that accepts (the kernel completes the
    # handshake) but never answers takes its port.
    nginx.stop()
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind(("127.0.0.1", nginx.port))
    hole.listen(64)
    h.on_exit(hole.close)
    time.sleep(1.5)  # the cached copy (max-age=1) is stale now: opening it revalidates

    start = time.time()
    with open(cached_path, "rb") as f:
        stale = f.read()
    took = time.time() - start
    t.check(stale == first and took < 6, "a stalled origin: the stale cached copy is served within the stall "
            "timeout", f"{took:.1f} s")
    t.check(h.wait_for(lambda: "serving the cached copy (stale)" in fs.output(), timeout=3),
            "and the fallback is logged", fs.output()[-400:])
    start = time.time()
    err = None
    try:
        with open(os.path.join(mnt, "www", "page.html"), "rb") as f:
            f.read()
    except OSError as e:
        err = e.errno
    took = time.time() - start
    t.check(err is not None and took < 6, "an uncached file of a stalled origin fails within the stall timeout",
            (err, f"{took:.1f} s"))
    fs.stop()
    t.check(not os.path.ismount(mnt), "unmounts cleanly after the stalls")
    t.done()


if __name__ == "__main__":
    main()
