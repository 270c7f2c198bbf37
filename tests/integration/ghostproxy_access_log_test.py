#!/usr/bin/env python3
"""ghostproxy's access log is written off its event loop (proxy/access_log.h, DESIGN §4.3
"round 16"): with the log on a FIFO that is open but never read (a disk that takes nothing),
hits go on at their usual pace (main: the loop blocked in fflush once the pipe was full, and
every client with it); a small queue drops lines, counts them on /ghost/status, and the lines it
kept reach the FIFO whole once it is read; SIGTERM stops the proxy even while the log takes
nothing. On a plain file every line is written, and SIGHUP opens the path again after a rename
(logrotate): the old file has the lines before, the new one those after. A FIFO with no reader
or a queue under 4K is a clear error at start, not a hang. TAP; skipped without root, /dev/fuse
or nginx."""
import http.client
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 11
BODY = b"ghost access log\n" * 30


class Proxy:
    """A ghostproxy on the test's mount, its stderr kept in a file."""

    def __init__(self, work, name, mnt, ctl, log, extra=()):
        self.port = h.free_port()
        self.err = os.path.join(work, name + ".err")
        exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
        with open(self.err, "w") as e:
            self.proc = subprocess.Popen([exe, "--listen", f"127.0.0.1:{self.port}", "--mount", mnt,
                                          "--control", ctl, "--access-log", log, "--memory-cache", "0",
                                          *extra], stdout=subprocess.DEVNULL, stderr=e)
        h.on_exit(lambda: self.proc.poll() is None and self.proc.kill())
        self.up = h.wait_port(self.port, 15)
        self.conn = None
        self.requests = 0  # answered, each one line in the log

    def get(self, url, timeout=5.0):
        """(status, seconds, body) of a GET of `url` through the proxy on one kept-alive
        connection (minus the status when the body is not BODY); (None, seconds, b"") when it
        failed or timed out."""
        t0 = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            self.conn.request("GET", url)
            r = self.conn.getresponse()
            body = r.read()
            self.requests += 1
            return (r.status if body == BODY or url.endswith("/ghost/status") else -r.status,
                    time.monotonic() - t0, body)
        except (OSError, http.client.HTTPException):
            self.conn = None
            return None, time.monotonic() - t0, b""

    def status(self):
        s, _, body = self.get(f"http://127.0.0.1:{self.port}/ghost/status")
        return json.loads(body) if s == 200 else {}

    def hits(self, url, n):
        """n GETs of url: (all 200, slowest seconds, seconds in all)."""
        t0 = time.monotonic()
        worst, ok = 0.0, True
        for _ in range(n):
            s, secs, _ = self.get(url)
            worst = max(worst, secs)
            if s != 200:
                ok = False
                break
        return ok, worst, time.monotonic() - t0

    def stop(self, timeout=15):
        """SIGTERM; seconds it took to exit, or None when it did not within `timeout`."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - t0


def read_fifo(fd, wait=0.3):
    """What the FIFO holds now, read until it stays empty for `wait` seconds."""
    out = b""
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < wait:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = b""
        if chunk:
            out += chunk
            quiet_since = time.monotonic()
        else:
            time.sleep(0.02)
    return out


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    with open(os.path.join(site, "a.bin"), "wb") as f:
        f.write(BODY)
    nginx = h.started_nginx(site, "expires 1h;")
    t = h.Tap(PLAN)
    fs, mnt, ctl = h.mount_origin(t, PLAN, work, nginx.url())
    url = nginx.url() + "a.bin"

    # 1. The log on a FIFO that is open but never read: ~2000 lines are ~4× the pipe's 64 KiB.
    fifo = os.path.join(work, "blocked.fifo")
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    a = Proxy(work, "blocked", mnt, ctl, fifo)
    if not t.check(a.up, "ghostproxy starts with its access log on a FIFO", open(a.err).read()[-800:]):
        t.skip_rest(PLAN, "ghostproxy did not start")
        t.done()
    first = a.get(url)[0]
    ok, worst, total = a.hits(url, 2000)
    t.check(first == 200 and ok and worst < 2.0,
            "2000 hits go on while the access log takes nothing (the FIFO is full after ~500 lines)",
            f"first {first}, all 200: {ok}, slowest {worst:.3f} s, {a.requests} answered in {total:.2f} s")
    st = a.status().get("access_log", {})
    t.check(st.get("lines_dropped") == 0 and st.get("queued_bytes", 0) > 0
            and st.get("lines_written", 0) < a.requests - 1,
            "the lines wait in the writer's queue (none dropped under the 4 MiB default)", st)
    secs = a.stop()
    t.check(secs is not None and secs < 10,
            "SIGTERM stops ghostproxy while its access log still takes nothing", f"{secs} s; "
            + open(a.err).read()[-500:])
    os.close(rfd)

    # 2. A 4 KiB queue on a FIFO: lines past it are dropped and counted; the rest arrive whole.
    fifo2 = os.path.join(work, "small.fifo")
    os.mkfifo(fifo2)
    rfd = os.open(fifo2, os.O_RDONLY | os.O_NONBLOCK)
    b = Proxy(work, "small", mnt, ctl, fifo2, ["--access-log-queue", "4K"])
    ok, worst, _ = b.hits(url, 1500)
    st = b.status().get("access_log", {})
    t.check(ok and worst < 2.0 and st.get("lines_dropped", 0) > 0,
            "with a 4K queue on the full FIFO, hits go on and the lines past it are dropped, counted",
            f"all 200: {ok}, slowest {worst:.3f} s; {st}")
    got = read_fifo(rfd)
    before = b.requests  # the requests logged before the next status request
    st = h.wait_for(lambda: (lambda s: s if s.get("queued_bytes") == 0 else None)(
        b.status().get("access_log", {})), timeout=10) or {}
    # The FIFO also gets the line of the status request that answered last (after its answer).
    deadline = time.monotonic() + 10
    while got.count(b"\n") < st.get("lines_written", 0) + 1 and time.monotonic() < deadline:
        got += read_fifo(rfd, 0.1)
    lines = got.decode("latin-1").split("\n")
    whole = [ln for ln in lines[:-1] if len(ln.split()) == 10 and ln.split()[3].endswith("/200")]
    # The status requests answered meanwhile (wait_for's) are in the counters too.
    counted = st.get("lines_written", 0) + st.get("lines_dropped", 0)
    t.check(lines[-1] == "" and len(whole) == len(lines) - 1 == st.get("lines_written", -1) + 1
            and counted == b.requests - 1 and before <= counted,
            "once the FIFO is read, every line kept arrives whole, and written + dropped = requests",
            f"{len(lines) - 1} lines, {len(whole)} whole; {st}; {b.requests} requests; tail {lines[-2:]}")
    b.stop()
    os.close(rfd)

    # 3. A plain file: every line written; SIGHUP after a rename opens the path again.
    log = os.path.join(work, "access.log")
    c = Proxy(work, "plain", mnt, ctl, log)
    ok1 = c.hits(url, 300)[0]
    os.rename(log, log + ".1")
    c.proc.send_signal(signal.SIGHUP)
    reopened = h.wait_for(lambda: c.status().get("access_log", {}).get("reopens") == 1, timeout=10)
    t.check(ok1 and bool(reopened) and c.proc.poll() is None and os.path.exists(log),
            "SIGHUP: ghostproxy keeps running and opens its access log's path again", open(c.err).read()[-500:])
    ok2 = c.hits(url, 200)[0]
    secs = c.stop()

    def url_lines(path):
        with open(path) as f:
            return sum(1 for ln in f if f" {url} " in ln)
    old, new = url_lines(log + ".1"), url_lines(log) if os.path.exists(log) else -1
    t.check(ok2 and secs is not None and old == 300 and new == 200,
            "every line reaches the file: 300 before the rename in the old file, 200 after in the new",
            f"old {old}, new {new}, stop {secs}")

    # 4. Bad setups fail at start with a message.
    exe = os.path.join(h.build_dir(), "proxy", "ghostproxy")
    lonely = os.path.join(work, "lonely.fifo")
    os.mkfifo(lonely)
    try:
        r = subprocess.run([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                            "--access-log", lonely], capture_output=True, text=True, timeout=15)
        res = (r.returncode, r.stderr[-300:])
    except subprocess.TimeoutExpired:
        res = ("hung", "")
    t.check(res[0] == 1 and "access log" in res[1],
            "an access log on a FIFO nobody opened is an error at start, not a hang", res)
    r = subprocess.run([exe, "--listen", f"127.0.0.1:{h.free_port()}", "--mount", mnt, "--control", ctl,
                        "--access-log", log, "--access-log-queue", "1K"], capture_output=True, text=True,
                       timeout=15)
    t.check(r.returncode == 2 and "--access-log-queue: must be at least 4K" in r.stderr,
            "--access-log-queue under 4K is refused", (r.returncode, r.stderr[-300:]))
    t.check(fs.proc.poll() is None, "ghostfs is still running", fs.output()[-500:])
    t.done()


if __name__ == "__main__":
    main()
