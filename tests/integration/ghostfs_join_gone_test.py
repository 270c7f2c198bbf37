#!/usr/bin/env python3
"""Two opens of one origin file at once share one fetch: the second joins the first's stream
and is answered at once, before the origin's head has come. When that head says the file is
gone (404), the first open gets ENOENT and the joined open's reads must end too (ESTALE), not
wait forever: ghostfs_web_random hung a reader so (the daemon idle, its read unanswered), 2 of
14 runs. An origin (here, in Python) holds each GET until the test lets it answer, so the
second open surely comes while the first waits. Then the same with a 200: both read the whole
body from the one fetch.
TAP; skipped without root or /dev/fuse."""
import errno
import http.server
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 6
BODY = bytes(i % 251 for i in range(5000))


class Origin(http.server.BaseHTTPRequestHandler):
    """An autoindex of gone.bin and here.bin; a GET of either waits for `release`, then gone.bin
    answers 404 and here.bin its body."""
    release = threading.Event()
    got = threading.Event()
    gets = []

    def do_GET(self):
        if self.path == "/":
            rows = "".join(f'<a href="{n}">{n}</a> 25-Nov-2026 11:00 {len(BODY)}\n' for n in ("gone.bin", "here.bin"))
            body = (f'<html><head><title>Index of /</title></head><body><h1>Index of /</h1><hr><pre>'
                    f'<a href="../">../</a>\n{rows}</pre><hr></body></html>').encode()
            return self.answer(200, body, "text/html")
        Origin.gets.append(self.path)
        Origin.got.set()
        Origin.release.wait(30)
        if self.path == "/here.bin":
            return self.answer(200, BODY, "application/octet-stream")
        self.answer(404, b"gone\n", "text/plain")

    def answer(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def opener(path, out, key):
    """Opens `path` and reads it whole; out[key] = ("open", errno) or ("read", bytes or errno)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        out[key] = ("open", e.errno)
        return
    out[key + " opened"] = True
    try:
        data = b""
        while True:
            b = os.pread(fd, 4096, len(data))
            if not b:
                break
            data += b
        out[key] = ("read", data)
    except OSError as e:
        out[key] = ("read", e.errno)
    finally:
        os.close(fd)


def two_opens(path, name):
    """The first open's GET held at the origin, a second open of the same file, then the
    origin answers. Returns (out, the second open came back before the answer, threads)."""
    Origin.release.clear()
    Origin.got.clear()
    before = len(Origin.gets)
    out = {}
    first = threading.Thread(target=opener, args=(path, out, "first"), daemon=True)
    first.start()
    Origin.got.wait(10)
    second = threading.Thread(target=opener, args=(path, out, "second"), daemon=True)
    second.start()
    joined = h.wait_for(lambda: "second opened" in out, timeout=3)
    time.sleep(0.3)  # the second's first read is at the daemon, waiting for the stream
    Origin.release.set()
    for th in (first, second):
        th.join(10)
    return out, joined, [th for th in (first, second) if th.is_alive()], len(Origin.gets) - before


def main():
    h.require_root_and_fuse()
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    h.on_exit(origin.shutdown)
    h.on_exit(Origin.release.set)
    t = h.Tap(PLAN)
    work = h.tempdir()
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    fs = h.Ghostfs(mnt, os.path.join(work, "cache"), {"o": f"http://127.0.0.1:{origin.server_address[1]}/"})
    if not t.check(fs.start(), "mounts a Python origin that holds each GET until released", fs.output()):
        t.skip_rest(PLAN - 1, "not mounted")
        t.done()
    names = sorted(os.listdir(os.path.join(mnt, "o")))
    t.check(names == ["gone.bin", "here.bin"], "the listing names gone.bin and here.bin", names)

    out, joined, hung, gets = two_opens(os.path.join(mnt, "o", "gone.bin"), "gone.bin")
    if hung:
        h.write_stacks(f"{len(hung)} opener(s) of gone.bin hung", [fs.proc.pid], mounts=[mnt])
    t.check(joined and gets == 1, "a second open of gone.bin while the first's GET waits is answered at once: "
            "it joined the one fetch", (joined, gets, out))
    t.check(not hung and out.get("first") == ("open", errno.ENOENT)
            and out.get("second") in (("read", errno.ESTALE), ("read", errno.ENOENT)),
            "the origin's 404: the first open gets ENOENT, the joined open's read ESTALE, none hangs",
            (out, len(hung), fs.output()[-800:]))

    out, joined, hung, gets = two_opens(os.path.join(mnt, "o", "here.bin"), "here.bin")
    t.check(joined and gets == 1 and not hung and out.get("first") == ("read", BODY)
            and out.get("second") == ("read", BODY),
            "with a 200 both opens read the whole body from the one fetch",
            (joined, gets, len(hung), {k: (v[0], v[1] if isinstance(v[1], int) else len(v[1]))
                                       for k, v in out.items() if isinstance(v, tuple)}))
    t.check(fs.proc.poll() is None, "ghostfs is still running")
    t.done()


if __name__ == "__main__":
    main()
