#!/usr/bin/env python3
"""The LRU order's lag (common/cache/cache_store.h, DESIGN §4.5): a hit's access time is not
written with every transaction but in batches, and ghostfs saves what is unsaved within the
store's access_max_lag (10 s) by a one-shot timer armed by the first unsaved change. Two
objects are written into the index with known access times; a `lookup` (a hit, which touches
its object) is followed by a SIGKILL after 13 s: the object's new time is in the index. A hit
followed by a clean unmount is in the index too. TAP; skipped without root, /dev/fuse or
nginx."""
import os
import sqlite3
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import harness as h  # noqa: E402

PLAN = 3
LAG_S = 10


def accessed(cache, key):
    db = sqlite3.connect(os.path.join(cache, "objects-db", "index.sqlite"))
    try:
        # The row's own time, or a newer one appended to the ticks table (cache_store.cc).
        row = db.execute("SELECT max(accessed_us, coalesce((SELECT max(tick) FROM ticks t "
                         "WHERE t.h = o.h), 0)) FROM objects o WHERE key = ? AND complete = 1",
                         (key,)).fetchone()
    finally:
        db.close()
    return row[0] if row else None


def hit(sock, key):
    ctl = h.Control(sock)
    try:
        got = ctl.ok("lookup", key=key)
    finally:
        ctl.close()
    return bool(got.get("cached"))


def main():
    work, _root, _sums, nginx = h.serve_tree()
    t = h.Tap(PLAN)
    fs, _, sock = h.mount_origin(t, PLAN, work, nginx.url())
    cache = fs.cache

    def remount(left, when):
        """ghostfs on the same cache again; the rest of the plan (`left`) skipped if it fails."""
        again = fs.again()
        if not again.start():
            t.check(False, f"ghostfs mounts again {when}", again.output()[-2000:])
            t.skip_rest(left, f"ghostfs did not mount {when}")
            t.done()
        return again

    fs.stop()
    then_us = int((time.time() - 3600) * 1e6)  # both last read an hour ago
    a, b = "http://lag.test/a", "http://lag.test/b"
    h.add_cached_objects(os.path.join(cache, "objects-db", "index.sqlite"),
                         [(k, 3, '"1"', "", "", None, then_us, then_us + n, "{}", b"abc")
                          for n, k in enumerate((a, b))])

    fs = remount(PLAN, "again")
    ok = hit(sock, a)
    time.sleep(LAG_S + 3)
    fs.kill9()
    got = accessed(cache, a)
    t.check(ok and got is not None and got > then_us + 3_000_000_000,
            f"a hit's access time reaches the index within {LAG_S} s and survives a SIGKILL "
            f"(hit: {ok}; stored {got}, was {then_us})", fs.output()[-1500:])
    t.check(accessed(cache, b) == then_us + 1, "the object not read keeps its time",
            str(accessed(cache, b)))

    fs = remount(PLAN - 2, "after the SIGKILL")
    ok = hit(sock, b)
    fs.stop()
    got = accessed(cache, b)
    t.check(ok and got is not None and got > then_us + 3_000_000_000,
            f"a hit just before a clean unmount is in the index (stored {got})",
            fs.output()[-1500:])
    t.done()


if __name__ == "__main__":
    main()
