#!/usr/bin/env python3
"""Kept passthrough backings (fs/fuse_passthrough.h): once a cached object has been opened with
passthrough, its backing id stays registered after the last close, so the next open of it,
even of a new inode after the kernel dropped the old one (drop_caches), is answered with that
id: no index read, no memfd copy, no registration (`kept_hits`), and its reads still never
reach the daemon. An evicted object's kept backing is dropped with it (`kept` falls), and the
file is fetched again with the origin's bytes. (A changed object's kept backing is dropped at
the change: ghostfs_fresh_change reads the new bytes through the same path.) TAP; skipped
without root, /dev/fuse or nginx; the kept checks are skipped if the kernel lacks passthrough."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 7
OLD = 1704067200  # 2024-01-01: heuristic freshness keeps such copies fresh for days


def passthrough(ctl):
    return ctl.ok("stats")["fuse"]


def main():
    h.require_root_and_fuse()
    work = h.tempdir()
    site = os.path.join(work, "site")
    os.makedirs(site)
    data = {"packed.bin": os.urandom(3000), "file.bin": os.urandom(40_000)}
    fillers = {f"fill{i}.bin": os.urandom(40_000) for i in range(4)}
    for name, body in {**data, **fillers}.items():
        p = os.path.join(site, name)
        with open(p, "wb") as f:
            f.write(body)
        os.utime(p, (OLD, OLD))
    nginx = h.started_nginx(site)
    t = h.Tap(PLAN)
    # Room for the two objects and three of the fillers: the fourth evicts the oldest.
    fs, mnt, sock = h.mount_origin(t, PLAN, work, nginx.url(), args=["--cache-size", "170K"],
                                   check="mounts with a control socket")
    ctl = h.Control(sock)
    path = {n: os.path.join(mnt, "www", n) for n in {**data, **fillers}}

    first = all(h.read_bytes(path[n]) == b for n, b in data.items())
    ctl.ok("flush")
    h.drop_caches()
    cached = all(h.read_bytes(path[n]) == b for n, b in data.items())
    f0 = passthrough(ctl)
    t.check(first and cached, "the first and the first cached reads return the origin's bytes")
    if f0["passthrough"]["state"] != "on":
        t.skip_rest(PLAN - 2, "FUSE passthrough is not available on this kernel")
        t.done()
    t.check(f0["passthrough"]["kept"] == 2, "each object opened with passthrough keeps its backing",
            str(f0["passthrough"]))

    h.drop_caches()  # the kernel forgets the inodes: the next opens are of new inodes
    again = all(h.read_bytes(path[n]) == b for n, b in data.items())
    f1 = passthrough(ctl)
    t.check(again and f1["passthrough"]["kept_hits"] == f0["passthrough"]["kept_hits"] + 2
            and f1["passthrough"]["opens"] == f0["passthrough"]["opens"] + 2,
            "the next opens (new inodes) are answered with the kept backings, byte-identical",
            f"{f0['passthrough']} -> {f1['passthrough']}")
    t.check(f1["reads"] == f0["reads"], "... and their reads reach no daemon", f"{f0['reads']} -> {f1['reads']}")

    # Evict: the fillers' fills push the two objects (least recently used) out of the cap.
    for n, b in fillers.items():
        if h.read_bytes(path[n]) != b:
            break
    ctl.ok("flush")
    f2 = passthrough(ctl)
    t.check(f2["passthrough"]["kept"] == 0, "evicted objects' kept backings are dropped",
            f"{f2['passthrough']} status {ctl.ok('stats').get('cache')}")
    h.drop_caches()
    refetched = h.read_bytes(path["file.bin"]) == data["file.bin"]
    src = os.getxattr(path["file.bin"], "user.ghost.source").decode()
    t.check(refetched and src == "network", "an evicted object is fetched again with the origin's bytes",
            f"source {src}")
    ctl.close()
    fs.stop()
    t.done()


if __name__ == "__main__":
    main()
