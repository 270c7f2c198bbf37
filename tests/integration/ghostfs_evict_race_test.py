#!/usr/bin/env python3
"""A cached copy evicted between the open's decision and the open itself is fetched again from
the origin, never an EIO (the race ghostfs_evict_random found about once in 1,300 opens under
eviction pressure, forced here step by step):
  1. a.bin (100 kB, max-age=1) is read once through the mount and so cached;
  2. once stale, an open of it revalidates: the origin holds the conditional GET;
  3. meanwhile a read of fill.bin (4.15 MB, with --cache-size 4M) fills the cache and the cap
     evicts a.bin;
  4. the origin answers 304 Not Modified: the copy it confirms is gone. The open must fetch
     the body again (a plain GET) and read a.bin's bytes whole (main: EIO at the open).
Then the same race where the origin, asked again, no longer has a.bin (404): ENOENT, not EIO.
TAP; skipped without root or /dev/fuse."""
import errno
import http.server
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 7
CAP = 4 << 20
A = (b"a.bin line, the copy that is evicted while its revalidation waits\n" * 1600)[:100_000]
FILL = (b"fill.bin: bytes that push a.bin out of the cache\n" * 90_000)[:4_150_000]
ETAG = '"a-1"'


class Origin(http.server.BaseHTTPRequestHandler):
    """An nginx-style autoindex of "/" with a.bin and fill.bin. A conditional GET of a.bin is
    held (its arrival is signalled) until the test releases it, then answered 304; once `gone`
    is set, a plain GET of a.bin answers 404."""
    protocol_version = "HTTP/1.1"
    conditional = threading.Event()
    release = threading.Event()
    gone = False
    plain_gets = []

    def do_GET(self):
        name = self.path.lstrip("/")
        if name == "":
            rows = "".join(f'<a href="{n}">{n}</a> 25-Nov-2026 11:00 {len(b)}\n'
                           for n, b in (("a.bin", A), ("fill.bin", FILL)))
            return self.reply(200, (f'<html><head><title>Index of /</title></head><body><h1>Index of /</h1><hr>'
                                    f'<pre><a href="../">../</a>\n{rows}</pre><hr></body></html>').encode(), "text/html")
        if name == "a.bin" and self.headers.get("If-None-Match"):
            Origin.conditional.set()
            Origin.release.wait(60)
            return self.reply(304, b"")
        if name == "a.bin" and Origin.gone:
            return self.reply(404, b"")
        if name == "a.bin":
            Origin.plain_gets.append(time.time())
        body = {"a.bin": A, "fill.bin": FILL}.get(name)
        if body is None:
            return self.reply(404, b"")
        self.reply(200, body, "application/octet-stream")

    def reply(self, status, body, ctype=None):
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        if self.path == "/a.bin":
            self.send_header("ETag", ETAG)
            self.send_header("Cache-Control", "max-age=1")
        self.send_header("Last-Modified", "Wed, 25 Nov 2026 11:00:00 GMT")
        if status != 304:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 304:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def cached(path):
    try:
        return os.getxattr(path, "user.ghost.cached") == b"1"
    except OSError:
        return None


def open_in_thread(path, out):
    """Opens and reads `path` whole in a thread; `out` gets the bytes or the OSError."""
    def run():
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as e:
            out.append(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def evict_a(t, mnt, a_path, what):
    """Holds an open of a.bin in its revalidation while fill.bin evicts the copy; returns the
    open's thread and its outcome list."""
    Origin.conditional.clear()
    Origin.release.clear()
    time.sleep(1.5)  # max-age=1: the copy is stale now, so the next open revalidates
    out = []
    th = open_in_thread(a_path, out)
    held = Origin.conditional.wait(20)
    with open(os.path.join(mnt, "fill.bin"), "rb") as f:
        filled = f.read() == FILL
    gone = h.wait_for(lambda: cached(a_path) is False, timeout=20)
    t.check(held and filled and gone, f"{what}: the open revalidates, and the cap evicts a.bin meanwhile",
            f"conditional GET held {held}, fill.bin read {filled}, a.bin evicted {gone}")
    Origin.release.set()
    th.join(60)
    return th, out


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    h.on_exit(srv.shutdown)
    h.on_exit(Origin.release.set)
    t = h.Tap(PLAN)
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {"web": f"http://127.0.0.1:{srv.server_address[1]}/"},
                   args=["--cache-size", str(CAP)])
    if not t.check(fs.start(), "mounts with --cache-size 4M", fs.output()):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()
    web = os.path.join(mnt, "web")
    a_path = os.path.join(web, "a.bin")

    with open(a_path, "rb") as f:
        first = f.read()
    t.check(first == A and h.wait_for(lambda: cached(a_path), timeout=20),
            "a.bin is read from the origin and cached", (len(first), cached(a_path)))

    gets = len(Origin.plain_gets)
    th, out = evict_a(t, web, a_path, "revalidation")
    got = out[0] if out else None
    t.check(not th.is_alive() and got == A,
            "the open whose copy was evicted during its revalidation reads a.bin whole (fetched again, no EIO)",
            f"got {got if isinstance(got, OSError) else (len(got) if got is not None else 'nothing (hung)')}; "
            f"plain GETs of a.bin since: {len(Origin.plain_gets) - gets}")

    # Cached again (the fetch above filled it); the same race, and the origin, asked again for
    # the body, no longer has it.
    h.wait_for(lambda: cached(a_path), timeout=20)
    Origin.gone = True
    th, out = evict_a(t, web, a_path, "gone from the origin")
    got = out[0] if out else None
    t.check(isinstance(got, OSError) and got.errno == errno.ENOENT,
            "the same race when the origin no longer has a.bin: ENOENT (not EIO, not hung)",
            f"got {got if isinstance(got, OSError) else (len(got) if got is not None else 'nothing (hung)')}")
    Origin.gone = False
    fs.stop()
    t.check(not os.path.ismount(mnt), "unmounts cleanly")
    t.done()


if __name__ == "__main__":
    main()
