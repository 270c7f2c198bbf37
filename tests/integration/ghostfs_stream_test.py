#!/usr/bin/env python3
"""ghostfs streams an uncached object to its reader while it is fetched, and answers a read far
ahead of what has arrived with a range request. The origin is nginx limited to 2 MB/s, so a
6 MiB file takes about 3 s to arrive. TAP; skipped without root, /dev/fuse or nginx."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 5


def main():
    work, root, sums, nginx = h.serve_tree(extra_location="limit_rate 2m;")
    with open(os.path.join(root, "large.bin"), "rb") as f:
        large = f.read()
    t = h.Tap(PLAN)
    fs, mnt, _ = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts", control=False)
    path = os.path.join(mnt, "www", "large.bin")
    os.stat(path)  # the listing, fetched before the clock starts
    start = time.time()
    fd = os.open(path, os.O_RDONLY)
    first = os.pread(fd, 65536, 0)
    t_first = time.time() - start
    t.check(first == large[:65536] and t_first < 1.0,
            "the first bytes arrive before the whole object (streamed)", f"{t_first:.2f} s")
    before = len(nginx.log_lines())
    start = time.time()
    far = os.pread(fd, 65536, 5 * 1024 * 1024)
    t_far = time.time() - start
    t.check(far == large[5 << 20:(5 << 20) + 65536] and t_far < 1.5,
            "a read far ahead is answered before the stream gets there", f"{t_far:.2f} s")
    time.sleep(0.1)
    new = nginx.log_lines()[before:]
    t.check(any('" 206 ' in l for l in new), "it used a range request (206 in nginx's log)", new)
    whole = b""
    while True:
        b = os.pread(fd, 1 << 20, len(whole))
        if not b:
            break
        whole += b
    os.close(fd)
    t.check(whole == large, "the whole object reads back byte-identical", len(whole))
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
