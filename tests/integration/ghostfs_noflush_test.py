#!/usr/bin/env python3
"""Closing an origin file costs no FLUSH round trip (FOPEN_NOFLUSH): the origin tree is
read-only and its flush has nothing to do, so a small cached read is lookup, open, read (and
an asynchronous release). Counted by the daemon (ghostctl stats: fuse.flushes), over first
reads from the network and cached reads of a packed body and of a body file, with the page
cache dropped between rounds; every read returns the origin's bytes.
TAP; skipped without root, /dev/fuse or nginx."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 4
ROUNDS = 5


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    files = {"packed.bin": os.urandom(3000), "file.bin": os.urandom(40_000)}
    for name, data in files.items():
        with open(os.path.join(site, name), "wb") as f:
            f.write(data)
    nginx = h.started_nginx(site)
    t = h.Tap(PLAN)
    fs, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), check="mounts")
    ctl = h.Control(sock)

    def flushes():
        return ctl.ok("stats")["fuse"]["flushes"]

    before = flushes()
    good = all(h.read_bytes(os.path.join(mnt, "www", n)) == d for n, d in files.items())
    ctl.ok("flush")  # the fills reach the disk: later opens read the cache
    for _ in range(ROUNDS):
        h.drop_caches()
        for n, d in files.items():
            good = good and h.read_bytes(os.path.join(mnt, "www", n)) == d
    after = flushes()
    t.check(good, "every read returns the origin's bytes")
    t.check(after == before, f"{len(files) * (ROUNDS + 1)} closes of origin files sent no FLUSH",
            f"fuse.flushes went from {before} to {after}")
    # The count is live: a close on the writable local/ tree is still flushed (its data matters).
    with open(os.path.join(mnt, "local", "x.txt"), "w") as f:
        f.write("x")
    t.check(flushes() > after, "a close in local/ is still flushed (the counter counts)",
            f"fuse.flushes {flushes()} after {after}")
    ctl.close()
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
