#!/usr/bin/env python3
"""Two readers of one uncached file share its stream, one far behind the other: the window
keeps what the slow one has not read (the fast one's passed bytes are dropped lazily, in big
pieces: fs/origin_tree.cc TrimStream) and both read the origin's bytes, in pieces of odd sizes
so every read straddles what was dropped and what was kept. TAP; skipped without root,
/dev/fuse or nginx."""
import hashlib
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 4
SIZE = 24 << 20


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    body = os.urandom(SIZE)
    with open(os.path.join(site, "big.bin"), "wb") as f:
        f.write(body)
    nginx = h.started_nginx(site)
    t = h.Tap(PLAN)
    fs, mnt, _ = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts", control=False)
    path = os.path.join(mnt, "www", "big.bin")
    os.stat(path)
    slow_fd = os.open(path, os.O_RDONLY)  # both opened before any byte arrives: one stream
    fast_fd = os.open(path, os.O_RDONLY)
    got = {}

    def read_all(fd, piece, name):
        out = []
        while True:
            b = os.read(fd, piece)
            if not b:
                break
            out.append(b)
        got[name] = b"".join(out)

    # The fast reader goes 6 MiB ahead first, then both read to the end together.
    ahead = os.read(fast_fd, 6 << 20)
    while len(ahead) < (6 << 20):
        b = os.read(fast_fd, (6 << 20) - len(ahead))
        if not b:
            break
        ahead += b
    threads = [threading.Thread(target=read_all, args=(fast_fd, 300_007, "fast")),
               threading.Thread(target=read_all, args=(slow_fd, 70_001, "slow"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    os.close(slow_fd)
    os.close(fast_fd)
    fast = ahead + got.get("fast", b"")
    slow = got.get("slow", b"")
    t.check(len(fast) == SIZE and hashlib.sha256(fast).digest() == hashlib.sha256(body).digest(),
            "the reader ahead reads the origin's bytes", len(fast))
    t.check(len(slow) == SIZE and hashlib.sha256(slow).digest() == hashlib.sha256(body).digest(),
            "the reader 6 MiB behind reads the origin's bytes", len(slow))
    t.check(os.path.ismount(mnt), "still mounted (the daemon did not die)")
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
