#!/usr/bin/env python3
"""Group commit of the misses path (common/cache/cache_store.h): SIGKILL of ghostfs during a storm
of fills through the shared store (the proxy's paths: "store" on the control socket with the
body written to .ghost/fill/<token>, or a small body inline in the "store" request as
"body_base64"), then a restart on the same cache directory. A fill counts as
acknowledged once a "lookup" names its committed version (d<inode>-<size> of a body file or
p<hash>-<size> of a packed body, not q<n> of the write queue's copy): the store answers that only
after the transaction holding the row has committed. Every acknowledged fill must be readable and
byte-identical after the restart, and the index must pass sqlite's integrity check. TAP; skipped
without root, /dev/fuse or nginx."""
import base64
import os
import random
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 4
THREADS = 4


def main():
    work, _root, _sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    fs, _, sock = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts with a control socket")
    cache = fs.cache

    acked = {}  # key -> body, once a lookup named its committed version
    lock = threading.Lock()
    stop = threading.Event()
    issued = [0]
    acked_inline = [0]  # of acked, the fills sent inline

    def storm(tid):
        rng = random.Random(tid)
        try:
            ctl = h.Control(sock)
            i = 0
            while not stop.is_set():
                # A batch of 8 fills handed over back to back (in flight together), then looked up.
                batch = []
                for _ in range(8):
                    key = f"http://fill.test/{tid}/{i}"
                    # Mostly packed bodies (under 16 KiB), every 10th a body file; every other
                    # small one inline in the request (no fill file).
                    body = rng.randbytes(20_000 if i % 10 == 9 else 512)
                    inline = i % 2 == 0 and len(body) <= 16 * 1024
                    i += 1
                    if inline:
                        ctl.ok("store", key=key, response="{}", body_base64=base64.b64encode(body).decode())
                    else:
                        path = ctl.ok("store", key=key, response="{}")["path"]
                        with open(path, "wb") as w:
                            w.write(body)
                    batch.append((key, body, inline))
                    with lock:
                        issued[0] += 1
                for key, body, inline in batch:
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline:
                        got = ctl.ok("lookup", key=key)
                        version = got.get("version", "")
                        if got.get("cached") and version[:1] in ("d", "p") and got.get("size") == len(body):
                            with lock:
                                acked[key] = body
                                if inline:
                                    acked_inline[0] += 1
                            break
                        time.sleep(0.002)
        except (OSError, RuntimeError, ValueError):
            return  # the daemon died under us

    threads = [threading.Thread(target=storm, args=(n,)) for n in range(THREADS)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if len(acked) >= 150:
                break
        time.sleep(0.01)
    fs.kill9()  # SIGKILL with fills in flight
    stop.set()
    for th in threads:
        th.join(30)
    with lock:
        acked_now = dict(acked)
        sent = issued[0]
        inline_now = acked_inline[0]
    t.check(len(acked_now) >= 150 and inline_now > 0,
            f"{len(acked_now)} fills acknowledged ({inline_now} of them inline; {sent} written) before the SIGKILL",
            fs.output()[-2000:])

    db = sqlite3.connect(os.path.join(cache, "objects-db", "index.sqlite"))
    try:
        verdict = db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()
    t.check(verdict == "ok", "the index passes sqlite's integrity check after the kill", verdict)

    fs = fs.again()
    lost = []
    if fs.start(timeout=20):
        ctl = h.Control(sock)
        for key, body in acked_now.items():
            got = ctl.ok("lookup", key=key)
            if not got.get("cached"):
                lost.append(f"{key}: not cached")
                continue
            try:
                with open(got["path"], "rb") as f:
                    data = f.read()
            except OSError as e:
                lost.append(f"{key}: {e}")
                continue
            if data != body:
                lost.append(f"{key}: {len(data)} bytes differ from the {len(body)} acknowledged")
        ctl.close()
    else:
        lost.append("not mounted again: " + fs.output()[-2000:])
    t.check(not lost, f"after the restart all {len(acked_now)} acknowledged fills read back byte-identical",
            lost[:5])
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
